"""Parameters used in a narrower compute dtype, with their gradients summed in float32.

With bf16 compute and float32 params, a parameter's gradient is a sum over the batch (and the
sequence): the weight gradient of a projection is a contraction over every token, a bias's is a
sum over them. Written as `kernel.astype(bf16)` and a bf16 einsum, that sum comes out of the
backward dot in bf16 and only the cast's transpose turns it into float32 -- after the sum. On a
data-parallel mesh each device holds a partial sum over its rows, so the SPMD partitioner
reduces the bf16 partials across devices (an all-reduce or reduce-scatter carrying bf16: every
partial rounded to 8 bits of mantissa, then summed at that precision) before the cast.
benchmarks/grad_reduction.py measures what that costs against a float64 reference.

The two ops here keep the forward exactly as it was (same bf16 operands, same result) and only
change where the backward's sum lands:

* `param_einsum`: the kernel's gradient is the same contraction of the same bf16 operands,
  accumulated and *returned* in float32 (`preferred_element_type`: the MXU and tensor cores
  accumulate in float32 anyway; only the final rounding to bf16 goes). The input's gradient is
  JAX's own, in the compute dtype.
* `broadcast_param`: the parameter is broadcast to the activation's shape in its own dtype and
  only then cast, so the transpose sums the cotangent over the broadcast (batch) dims in
  float32.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp

Dtype = Any


def param_einsum(spec: str, x: jax.Array, kernel: jax.Array, dtype: Dtype) -> jax.Array:
    """jnp.einsum(spec, x, kernel) with both operands cast to `dtype`; the kernel's gradient is
    accumulated in float32 and returned in the kernel's dtype.

    `spec` is a two-operand einsum "X,K->Y" in which every index of K appears in X or Y and
    every index of X in K or Y (a projection: nothing is summed within one operand), so the
    kernel's gradient is einsum("X,Y->K", x, dy).
    """
    return _param_einsum(spec.replace(" ", ""), jnp.dtype(dtype), x.dtype, kernel.dtype)(
        x, kernel)


@functools.cache
def _param_einsum(spec: str, dtype, x_dtype, kernel_dtype):
    # One custom_vjp per (spec, dtypes): all static, closed over rather than passed.
    inputs, y_dims = spec.split("->")
    x_dims, k_dims = inputs.split(",")

    @jax.custom_vjp
    def project(x, kernel):
        return jnp.einsum(spec, x.astype(dtype), kernel.astype(dtype))

    def fwd(x, kernel):
        xc, kc = x.astype(dtype), kernel.astype(dtype)
        # Residuals in the compute dtype: what the plain einsum's backward keeps too.
        return jnp.einsum(spec, xc, kc), (xc, kc)

    def bwd(residuals, dy):
        xc, kc = residuals
        dy = dy.astype(dtype)
        # dx = einsum("Y,K->X"): the contraction JAX's own transpose of the einsum runs, in
        # the compute dtype. Written out rather than through jax.vjp, whose primal einsum
        # would sit unused in the jaxpr of every scanned layer (XLA drops it; a FLOP count
        # read from the jaxpr, zoo.train.compilation.flops, would not).
        dx = jnp.einsum(f"{y_dims},{k_dims}->{x_dims}", dy, kc)
        # dK = einsum("X,Y->K"): the bf16 operands, summed over the batch dims in float32 (a
        # partial sum per device, so the cross-device reduction is float32 too).
        dk = jnp.einsum(f"{x_dims},{y_dims}->{k_dims}", xc, dy,
                        preferred_element_type=jnp.float32)
        return dx.astype(x_dtype), dk.astype(kernel_dtype)

    project.defvjp(fwd, bwd)
    return project


def broadcast_param(param: jax.Array, shape: tuple[int, ...], dtype: Dtype) -> jax.Array:
    """`param` broadcast to `shape` (numpy rules), then cast to `dtype`: the same values as
    `param.astype(dtype)` broadcast, but the gradient's sum over the broadcast dims is taken in
    param's dtype (float32), not in `dtype`."""
    return jnp.broadcast_to(param, shape).astype(dtype)
