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
        dx = _input_grad(y_dims, k_dims, x_dims, dy, kc)
        # dK = einsum("X,Y->K"): the bf16 operands, summed over the batch dims in float32 (a
        # partial sum per device, so the cross-device reduction is float32 too).
        dk = jnp.einsum(f"{x_dims},{y_dims}->{k_dims}", xc, dy,
                        preferred_element_type=jnp.float32)
        return dx.astype(x_dtype), dk.astype(kernel_dtype)

    project.defvjp(fwd, bwd)
    return project


def _input_grad(y_dims: str, k_dims: str, x_dims: str, dy: jax.Array, kc: jax.Array
                ) -> jax.Array:
    """einsum(f"{y_dims},{k_dims}->{x_dims}", dy, kc), its summed dims taken in the order the
    kernel lists them. jnp.einsum lists a multi-dim contraction last dim first (the fused
    q/k/v projection's "btjhd,mjhd->btm" sums over (d, h, j)), which XLA:CPU's matmul can only
    read from transposed copies of both operands: a [tokens, 3 x width] copy of dy and a
    three-way transpose of the [width, 3, heads, head_dim] kernel per layer. In the operands'
    own order dy is read as it lies and the kernel takes one plain 2-D transpose (2-core CPU,
    GPT small train step: 1-2% faster in turns). The sum is the same; only the order its
    terms are added in changes (float32 gradients move by ~1e-9)."""
    summed = [c for c in k_dims if c in y_dims]
    if "." in y_dims + k_dims or any(c in x_dims for c in summed):
        # an ellipsis ("...d,vd->...v": one summed dim anyway) or a dim in all three
        return jnp.einsum(f"{y_dims},{k_dims}->{x_dims}", dy, kc)
    dx = jax.lax.dot_general(
        dy, kc, (([y_dims.index(c) for c in summed], [k_dims.index(c) for c in summed]),
                 ([], [])))
    got = [c for c in y_dims if c not in summed] + [c for c in k_dims if c not in summed]
    return dx if got == list(x_dims) else jnp.transpose(dx, [got.index(c) for c in x_dims])


def broadcast_param(param: jax.Array, shape: tuple[int, ...], dtype: Dtype) -> jax.Array:
    """`param` broadcast to `shape` (numpy rules), then cast to `dtype`: the same values as
    `param.astype(dtype)` broadcast, but the gradient's sum over the broadcast dims is taken in
    param's dtype (float32), not in `dtype`."""
    return jnp.broadcast_to(param, shape).astype(dtype)
