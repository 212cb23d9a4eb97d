"""LayerNorm against float64 numpy, and float32 statistics for bf16 inputs."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.nn.normalization import LayerNorm


def _reference(x, scale, bias, eps):
    x = np.asarray(x, np.float64)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def _with_params(variables, scale, bias):
    params = dict(nn.unbox(variables)["params"])
    params.update(scale=jnp.asarray(scale, jnp.float32), bias=jnp.asarray(bias, jnp.float32))
    return {"params": params}


@pytest.mark.parametrize("epsilon", [1e-12, 0.5])
def test_layernorm_matches_float64_reference(epsilon):
    # A large epsilon relative to the variance (0.5 vs ~0.3) would expose an ignored epsilon.
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 0.6, (2, 5, 16)).astype(np.float32)
    scale, bias = rng.normal(1.0, 0.3, 16), rng.normal(0.0, 0.3, 16)
    module = LayerNorm(epsilon=epsilon)
    variables = _with_params(module.init(jax.random.key(0), x), scale, bias)
    got = module.apply(variables, x)
    assert got.dtype == jnp.float32
    assert_close(got, _reference(x, scale, bias, epsilon), 1e-5)


def test_layernorm_params_names_axes_and_switches():
    x = jnp.ones((2, 3, 8))
    variables = LayerNorm().init(jax.random.key(0), x)
    assert nn.get_partition_spec(variables)["params"] == {
        "scale": jax.P("norm"),
        "bias": jax.P("norm"),
    }
    assert set(LayerNorm(use_bias=False).init(jax.random.key(0), x)["params"]) == {"scale"}
    assert set(LayerNorm(use_scale=False).init(jax.random.key(0), x)["params"]) == {"bias"}


def test_layernorm_bf16_output_with_float32_statistics():
    # Values near 1000 with a spread of ~8: a bf16 mean over 64 of them is off by several units
    # (bf16 spacing at 64000 is 256), which float32 statistics avoid.
    rng = np.random.default_rng(1)
    x_bf16 = jnp.asarray(1000.0 + rng.normal(0.0, 8.0, (2, 3, 64)), jnp.bfloat16)
    scale, bias = rng.normal(1.0, 0.3, 64), rng.normal(0.0, 0.3, 64)
    module = LayerNorm(epsilon=1e-6, dtype=jnp.bfloat16)
    variables = _with_params(module.init(jax.random.key(0), x_bf16), scale, bias)
    got = module.apply(variables, x_bf16)
    assert got.dtype == jnp.bfloat16
    expected = _reference(np.asarray(x_bf16, np.float64), scale, bias, 1e-6)
    # Only the final rounding to bf16 (relative 2^-8) separates the two.
    assert_close(got, expected, 2**-8)
    f32 = LayerNorm(epsilon=1e-6).apply(variables, x_bf16.astype(jnp.float32))
    assert_close(np.asarray(got, np.float32), f32, 2**-8)

    # The same computation with bf16 statistics misses that tolerance: the check above can fail.
    xb = x_bf16
    mean = jnp.mean(xb, axis=-1, keepdims=True, dtype=jnp.bfloat16)
    var = jnp.mean(jnp.square(xb - mean), axis=-1, keepdims=True, dtype=jnp.bfloat16)
    naive = (xb - mean) * jax.lax.rsqrt(var + jnp.bfloat16(1e-6)) * scale.astype(np.float32) + bias
    assert not np.allclose(np.asarray(naive, np.float64), expected, rtol=2**-8, atol=2**-8)
