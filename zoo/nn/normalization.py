"""Layer normalisation with float32 statistics whatever the compute dtype."""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Dtype = Any
Initializer = Any


class LayerNorm(nn.Module):
    """y = (x - mean) / sqrt(var + epsilon) * scale + bias over the last axis.

    Mean and variance are taken in float32 even for bf16 inputs (a bf16 sum over 768+ features
    loses the low bits that the subtraction of the mean then exposes); the result is cast to
    `dtype`.

    Attributes:
      epsilon: added to the variance. The default 1e-6 is the original Transformer's
        (tensor2tensor, Flax); reference checkpoints need their own value, so models set it:
        BERT 1e-12, GPT-2 1e-5 (PyTorch's default).
      use_bias / use_scale: learn the shift / gain (params `bias` and `scale`, axes ('norm',)).
    """

    epsilon: float = 1e-6
    use_bias: bool = True
    use_scale: bool = True
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    scale_init: Initializer = nn.initializers.ones_init()
    bias_init: Initializer = nn.initializers.zeros_init()

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        """x [..., d] -> [..., d] in dtype."""
        features = x.shape[-1]
        x32 = x.astype(jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        # Two-pass variance: E[(x - mean)^2] does not cancel catastrophically like E[x^2] - mean^2.
        var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.epsilon)
        if self.use_scale:
            scale = self.param(
                "scale",
                nn.with_logical_partitioning(self.scale_init, ("norm",)),
                (features,),
                self.param_dtype,
            )
            y = y * scale.astype(jnp.float32)
        if self.use_bias:
            bias = self.param(
                "bias",
                nn.with_logical_partitioning(self.bias_init, ("norm",)),
                (features,),
                self.param_dtype,
            )
            y = y + bias.astype(jnp.float32)
        return y.astype(self.dtype)
