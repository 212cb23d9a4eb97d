"""The position-wise feed-forward block: Dense up, activation, (dropout), Dense down."""

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.errors import ConfigError
from zoo.nn.linear import Dense, default_kernel_init

Dtype = Any
Initializer = Any

# HF BERT's "gelu" is the exact erf form; GPT-2's "gelu_new" is the tanh approximation. The two
# differ by up to ~1e-3, enough to break checkpoint parity, so each is asked for by name.
ACTIVATIONS: dict[str, Callable[[jnp.ndarray], jnp.ndarray]] = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
}


def get_activation(name: str) -> Callable[[jnp.ndarray], jnp.ndarray]:
    """The activation function called `name` (one of ACTIVATIONS)."""
    if name not in ACTIVATIONS:
        raise ConfigError(f"activation={name!r} is not one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class FeedForward(nn.Module):
    """y = wo(dropout(act(wi(x)))), applied to every position independently.

    Attributes:
      mlp_dim: hidden (intermediate) width.
      activation: 'gelu' (exact erf, BERT), 'gelu_tanh' (GPT-2) or 'relu' (the original
        Transformer).
      dropout_rate: dropout on the hidden activations (T5 style). BERT and GPT-2 have none
        there: their dropout after `wo` is the residual dropout of the enclosing layer.
      out_features: output width; defaults to the input width.
    """

    mlp_dim: int
    activation: str = "gelu"
    dropout_rate: float = 0.0
    out_features: int | None = None
    use_bias: bool = True
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = default_kernel_init
    bias_init: Initializer = nn.initializers.zeros_init()
    # `wo`'s initialiser; None = kernel_init. GPT-2 draws the projections that write into the
    # residual stream with std 0.02 / sqrt(2 * layers), so the stream's variance does not grow
    # with depth.
    out_kernel_init: Initializer | None = None

    @nn.compact
    def __call__(self, x: jnp.ndarray, *, deterministic: bool = True) -> jnp.ndarray:
        """x [..., d] -> [..., out_features or d]; dropout only when deterministic is False."""
        act = get_activation(self.activation)
        dense = dict(
            use_bias=self.use_bias,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            kernel_init=self.kernel_init,
            bias_init=self.bias_init,
        )
        h = Dense(self.mlp_dim, ("embed", "mlp"), name="wi", **dense)(x)  # (B, T, mlp)
        h = act(h)
        if h.ndim == 3:
            h = nn.with_logical_constraint(h, ("act_batch", "act_len", "act_mlp"))
        h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
        out = self.out_features or x.shape[-1]
        if self.out_kernel_init is not None:
            dense["kernel_init"] = self.out_kernel_init
        return Dense(out, ("mlp", "embed"), name="wo", **dense)(h)  # (B, T, d)
