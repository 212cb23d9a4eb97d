"""Dense projections whose parameters carry logical axis names.

Flax's `nn.DenseGeneral` with multi-dimensional features and logical partitioning fails under
`jax.set_mesh` (flax 0.12), so projections are `self.param` + `jnp.einsum`, which also lets every
kernel name its axes (`('embed', 'heads', 'kv')`) for the partitioning rules.
"""

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from zoo.nn.precision import broadcast_param, param_einsum

Dtype = Any
Initializer = Any

default_kernel_init = nn.initializers.lecun_normal()


def _letters(n: int, start: int) -> str:
    return "".join(chr(ord("a") + start + i) for i in range(n))


class Dense(nn.Module):
    """y = x W + b over the last `len(in_axes)` input dims into `features` (int or tuple) dims.

    Attributes:
      features: output size, or a tuple for a multi-dimensional output (e.g. (heads, head_dim)).
      kernel_axes: logical names of the kernel dims, inputs first then outputs.
      num_in: how many trailing input dims are contracted (2 for an (heads, head_dim) -> embed
        output projection).
    """

    features: int | Sequence[int]
    kernel_axes: Sequence[str | None]
    num_in: int = 1
    use_bias: bool = True
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = default_kernel_init
    bias_init: Initializer = nn.initializers.zeros_init()

    @nn.compact
    def __call__(self, x: jnp.ndarray, params_only: bool = False):
        """x W + b; with params_only, the parameters (W, b or None, in param_dtype) instead,
        created for an input like `x` (for a caller that applies several projections as one
        matmul, through zoo.nn.precision as here)."""
        features = (self.features,) if isinstance(self.features, int) else tuple(self.features)
        in_shape = x.shape[-self.num_in :]
        if len(self.kernel_axes) != self.num_in + len(features):
            raise ValueError(
                f"Dense '{self.name}': kernel_axes {tuple(self.kernel_axes)} must name "
                f"{self.num_in} input + {len(features)} output dims"
            )
        kernel_shape = tuple(in_shape) + features
        # Flax's lecun/xavier initialisers treat axis -2 as fan-in and -1 as fan-out; flatten the
        # multi-dim kernel to 2-D for initialisation so fan-in is the product of all input dims.
        flat_init = _flat_kernel_init(self.kernel_init, len(in_shape))
        kernel = self.param(
            "kernel",
            nn.with_logical_partitioning(flat_init, tuple(self.kernel_axes)),
            kernel_shape,
            self.param_dtype,
        )
        bias = None
        if self.use_bias:
            bias = self.param(
                "bias",
                nn.with_logical_partitioning(self.bias_init, tuple(self.kernel_axes[self.num_in :])),
                features,
                self.param_dtype,
            )
        if params_only:
            return kernel, bias
        batch = _letters(x.ndim - self.num_in, 0)
        ins = _letters(self.num_in, 12)
        outs = _letters(len(features), 20)
        # In `dtype`; the kernel's and the bias's gradients are summed over the batch in float32
        # (zoo.nn.precision), so a data-parallel step reduces them across devices in float32.
        y = param_einsum(f"{batch}{ins},{ins}{outs}->{batch}{outs}", x, kernel, self.dtype)
        return y if bias is None else y + broadcast_param(bias, y.shape, self.dtype)


def _flat_kernel_init(init: Initializer, num_in: int) -> Initializer:
    def flat(key, shape, dtype=jnp.float32):
        fan_in = 1
        for d in shape[:num_in]:
            fan_in *= d
        fan_out = 1
        for d in shape[num_in:]:
            fan_out *= d
        return init(key, (fan_in, fan_out), dtype).reshape(shape)

    return flat
