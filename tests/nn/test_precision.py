"""zoo.nn.precision: the forward is the plain bf16 cast's, bit for bit; a parameter's gradient
is the float32 sum of the same bf16 terms (the plain cast's is that sum rounded to bf16)."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.nn.linear import Dense
from zoo.nn.precision import broadcast_param, param_einsum

BF16 = jnp.bfloat16
# (spec, x shape, kernel shape): Dense's projection and its (heads, head_dim) -> embed output,
# and Embed.attend's tied decoder (kernel [V, D], contracted on its last dim).
SPECS = [
    ("abm,mu->abu", (6, 40, 32), (32, 24)),
    ("abmn,mnu->abu", (6, 40, 4, 8), (4, 8, 24)),
    ("...d,vd->...v", (6, 40, 32), (50, 32)),
]


def _inputs(x_shape, k_shape, seed=0):
    kx, kk, kg = jax.random.split(jax.random.key(seed), 3)
    return jax.random.normal(kx, x_shape), jax.random.normal(kk, k_shape), kg


def _plain(spec, x, kernel, dtype):
    return jnp.einsum(spec, x.astype(dtype), kernel.astype(dtype))


@pytest.mark.parametrize("spec,x_shape,k_shape", SPECS)
@pytest.mark.parametrize("dtype", [jnp.float32, BF16])
def test_forward_is_the_plain_cast_bit_for_bit(spec, x_shape, k_shape, dtype):
    x, kernel, _ = _inputs(x_shape, k_shape)
    got = jax.jit(param_einsum, static_argnums=(0, 3))(spec, x, kernel, dtype)
    want = jax.jit(_plain, static_argnums=(0, 3))(spec, x, kernel, dtype)
    assert got.dtype == want.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


@pytest.mark.parametrize("spec,x_shape,k_shape", SPECS)
def test_bf16_kernel_gradient_is_the_float32_sum_of_the_bf16_terms(spec, x_shape, k_shape):
    x, kernel, key = _inputs(x_shape, k_shape)
    y_shape = _plain(spec, x, kernel, BF16).shape
    dy = jax.random.normal(key, y_shape).astype(BF16)  # the cotangent the layer above sends

    def vjp(f):
        _, pullback = jax.vjp(lambda x, k: f(spec, x, k, BF16), x, kernel)
        return pullback(dy)

    (dx, dk), (plain_dx, plain_dk) = vjp(param_einsum), vjp(_plain)
    # The exact contraction of the same bf16 operands, in float64.
    inputs, y_dims = spec.replace("...", "ab").split("->")  # numpy sums no '...' dims
    x_dims, k_dims = inputs.split(",")
    exact = np.einsum(f"{x_dims},{y_dims}->{k_dims}",
                      np.asarray(x.astype(BF16), np.float64), np.asarray(dy, np.float64))
    assert dk.dtype == jnp.float32
    assert_close(dk, exact, 1e-6)  # float32 accumulation of up to 240 terms
    # The plain cast rounds the sum to bf16 (8 bits): off by up to 2^-9 of each entry.
    with pytest.raises(AssertionError):
        assert_close(plain_dk, exact, 1e-4)
    # The input's gradient is JAX's own, unchanged.
    assert dx.dtype == plain_dx.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(dx), np.asarray(plain_dx))


@pytest.mark.parametrize("spec,x_shape,k_shape", SPECS)
def test_float32_gradients_equal_the_plain_einsums(spec, x_shape, k_shape):
    x, kernel, _ = _inputs(x_shape, k_shape)

    def loss(f):
        return lambda x, k: jnp.sum(jnp.sin(f(spec, x, k, jnp.float32)))

    got = jax.grad(loss(param_einsum), argnums=(0, 1))(x, kernel)
    want = jax.grad(loss(_plain), argnums=(0, 1))(x, kernel)
    assert_close(got, want, 1e-6)


def test_broadcast_param_sums_its_gradient_in_float32():
    bias = jax.random.normal(jax.random.key(0), (24,))
    dy = jax.random.normal(jax.random.key(1), (64, 40, 24)).astype(BF16)
    got = broadcast_param(bias, dy.shape, BF16)
    np.testing.assert_array_equal(np.asarray(got, np.float32),
                                  np.asarray(jnp.broadcast_to(bias.astype(BF16), dy.shape),
                                             np.float32))
    _, pullback = jax.vjp(lambda b: broadcast_param(b, dy.shape, BF16), bias)
    (db,) = pullback(dy)
    exact = np.asarray(dy, np.float64).sum(axis=(0, 1))
    assert db.dtype == jnp.float32
    assert_close(db, exact, 1e-6)
    _, plain_pullback = jax.vjp(lambda b: b.astype(BF16) + jnp.zeros(dy.shape, BF16), bias)
    with pytest.raises(AssertionError):  # summed in bf16: 2,560 terms at 8 bits
        assert_close(plain_pullback(dy)[0], exact, 1e-4)


def test_dense_bf16_forward_is_the_plain_cast_and_its_gradients_float32():
    x = jax.random.normal(jax.random.key(0), (8, 16, 32))
    layer = Dense((4, 8), ("embed", "heads", "kv"), dtype=BF16)
    params = nn.unbox(layer.init(jax.random.key(1), x))["params"]
    params = jax.tree.map(lambda p: p + 0.1, params)  # a nonzero bias
    y = layer.apply({"params": params}, x)
    plain = (jnp.einsum("abm,mcd->abcd", x.astype(BF16), params["kernel"].astype(BF16))
             + params["bias"].astype(BF16))
    assert y.dtype == BF16
    np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(plain, np.float32))
    grads = jax.grad(lambda p: jnp.sum(layer.apply({"params": p}, x).astype(jnp.float32)))(params)
    assert {g.dtype for g in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
    # d(sum y)/d bias: the number of rows
    np.testing.assert_array_equal(np.asarray(grads["bias"]), np.full((4, 8), 128.0))


def test_a_multi_dim_input_gradient_reads_the_cotangent_as_it_lies():
    """Self-attention's fused q/k/v projection contracts dx = dy K^T over (j, h, d) in the
    kernel's own order: the compiled gradient moves only the kernel, never the cotangent (with
    jnp.einsum's order, (d, h, j), XLA:CPU copied the [tokens, 3, heads, head_dim] cotangent
    transposed first), and it is the float64 contraction to float32 rounding."""
    spec = "abm,mjhd->abjhd"
    x, kernel, key = _inputs((6, 40, 32), (32, 3, 2, 8))
    dy = jax.random.normal(key, (6, 40, 3, 2, 8))

    def input_grad(x, kernel, dy):
        return jax.vjp(lambda x: param_einsum(spec, x, kernel, jnp.float32), x)[1](dy)[0]

    got = jax.jit(input_grad)(x, kernel, dy)
    exact = np.einsum("abjhd,mjhd->abm", np.asarray(dy, np.float64),
                      np.asarray(kernel, np.float64))
    assert_close(got, exact, 1e-6)
    text = jax.jit(input_grad).lower(x, kernel, dy).compile().as_text()
    moved = re.findall(r"= f32\[([\d,]*)\]\S* (?:transpose|copy)\(", text)
    assert all(len(shape.split(",")) < 5 for shape in moved), moved
