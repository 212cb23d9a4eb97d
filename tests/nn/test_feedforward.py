"""FeedForward: wo(act(wi x)) against a float64 numpy reference for each activation."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.nn.feedforward import FeedForward

_erf = np.vectorize(math.erf)


def _gelu_erf(h):
    return 0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)))


def _gelu_tanh(h):
    return 0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h**3)))


_REFERENCE = {"gelu": _gelu_erf, "gelu_tanh": _gelu_tanh, "relu": lambda h: np.maximum(h, 0.0)}


def _random_params(variables, seed=0):
    """Replaces every parameter (zero biases included) with N(0, 0.5^2) so each one matters."""
    leaves, treedef = jax.tree.flatten(nn.unbox(variables))
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(
        treedef,
        [
            0.5 * jax.random.normal(k, leaf.shape, leaf.dtype)
            for k, leaf in zip(keys, leaves, strict=True)
        ],
    )


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
def test_feedforward_matches_float64_reference(activation):
    x = jax.random.normal(jax.random.key(1), (2, 5, 8)) * 2.0
    module = FeedForward(mlp_dim=16, activation=activation)
    variables = _random_params(module.init(jax.random.key(0), x))
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), variables["params"])
    x64 = np.asarray(x, np.float64)

    def reference(act):
        h = act(x64 @ p["wi"]["kernel"] + p["wi"]["bias"])
        return h @ p["wo"]["kernel"] + p["wo"]["bias"]

    got = np.asarray(module.apply(variables, x))
    assert_close(got, reference(_REFERENCE[activation]), 1e-5)
    # The flavours are distinguishable at this tolerance, so a swapped GELU would fail above.
    for other, act in _REFERENCE.items():
        if other != activation:
            assert not np.allclose(got, reference(act), rtol=1e-5, atol=1e-5), other


def test_feedforward_param_names_and_logical_axes():
    module = FeedForward(mlp_dim=16)
    specs = nn.get_partition_spec(module.init(jax.random.key(0), jnp.ones((2, 3, 8))))["params"]
    assert specs["wi"]["kernel"] == jax.P("embed", "mlp")
    assert specs["wo"]["kernel"] == jax.P("mlp", "embed")
    assert specs["wi"]["bias"] == jax.P("mlp")
    assert specs["wo"]["bias"] == jax.P("embed")


def test_feedforward_dropout_only_when_not_deterministic():
    x = jax.random.normal(jax.random.key(1), (2, 5, 8))
    module = FeedForward(mlp_dim=16, dropout_rate=0.5)
    variables = module.init(jax.random.key(0), x)
    clean = FeedForward(mlp_dim=16).apply(variables, x)
    np.testing.assert_array_equal(module.apply(variables, x, deterministic=True), clean)
    a = module.apply(variables, x, deterministic=False, rngs={"dropout": jax.random.key(2)})
    b = module.apply(variables, x, deterministic=False, rngs={"dropout": jax.random.key(3)})
    assert not np.allclose(a, clean) and not np.allclose(a, b)


def test_feedforward_rejects_unknown_activation():
    with pytest.raises(ValueError, match="activation='swish'"):
        FeedForward(mlp_dim=4, activation="swish").init(jax.random.key(0), jnp.ones((1, 2, 3)))
