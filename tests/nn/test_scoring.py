import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.nn import scoring

B, M, N, DQ, DK, DV, HIDDEN = 2, 3, 5, 6, 4, 7, 8
TOL = 1e-5  # of each tensor's largest |entry| (tests/numerics.py)


def _data(seed=0, dq=DQ, dk=DK):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, M, dq)).astype(np.float32)
    k = rng.normal(size=(B, N, dk)).astype(np.float32)
    v = rng.normal(size=(B, N, DV)).astype(np.float32)
    mask = rng.random((B, M, N)) < 0.6
    mask[0, 1, :] = False  # a fully-masked query row
    mask[1, 2, :] = False
    mask[1, 0, :] = True  # and an unmasked one
    return q, k, v, mask


def _init(module, q, k, seed=1):
    """Initialises, then randomises every parameter (biases init to zero) so each one matters."""
    params = nn.unbox(module.init(jax.random.key(seed), q, k)).get("params", {})
    leaves, tree = jax.tree.flatten(params)
    rng = np.random.default_rng(seed)
    leaves = [rng.normal(size=x.shape).astype(np.float32) * 0.5 for x in leaves]
    return {"params": jax.tree.unflatten(tree, leaves)}


def _f64(x):
    return np.asarray(x, np.float64)


# float64 references of the lecture-note formulas -------------------------------------------------

def _ref_additive(p, q, k):
    wk = _f64(k) @ _f64(p["key"]["kernel"])  # (b, n, h)
    uq = _f64(q) @ _f64(p["query"]["kernel"])  # (b, m, h)
    return np.tanh(uq[:, :, None] + wk[:, None]) @ _f64(p["v"])


def _ref_mlp(p, q, k, act, use_bias):
    # Literally the perceptron on the concatenation [k; q] of every (query, key) pair.
    kq = np.concatenate([np.broadcast_to(_f64(k)[:, None], (B, q.shape[1], N, k.shape[-1])),
                         np.broadcast_to(_f64(q)[:, :, None], (B, q.shape[1], N, q.shape[-1]))],
                        axis=-1)  # (b, m, n, dk + dq)
    pre = kq @ _f64(p["kernel"]) + (_f64(p["bias"]) if use_bias else 0.0)
    return act(pre) @ _f64(p["v"])


def _ref_dot(p, q, k):
    return np.einsum("bmd,bnd->bmn", _f64(q), _f64(k))


def _ref_scaled_dot(p, q, k):
    return _ref_dot(p, q, k) / np.sqrt(q.shape[-1])


def _ref_bilinear(p, q, k):
    w = _f64(p["query"]["kernel"]).T  # W [dk, dq]: s = k^T W q
    return np.einsum("bnk,kd,bmd->bmn", _f64(k), w, _f64(q))


def _ref_softmax(s, mask):
    top = np.where(mask, s, -np.inf).max(-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)  # fully-masked rows: any shift works
    e = np.where(mask, np.exp(s - top), 0.0)
    den = e.sum(-1, keepdims=True)
    return np.divide(e, den, out=np.zeros_like(e), where=den > 0)


CASES = {
    "additive": ({"hidden": HIDDEN}, DQ, DK, _ref_additive),
    "mlp": ({"hidden": HIDDEN}, DQ, DK, lambda p, q, k: _ref_mlp(p, q, k, np.tanh, True)),
    "dot": ({}, DQ, DQ, _ref_dot),
    "scaled_dot": ({}, DQ, DQ, _ref_scaled_dot),
    "bilinear": ({}, DQ, DK, _ref_bilinear),
}


@pytest.mark.parametrize("name", list(CASES))
def test_score_matches_float64_reference(name):
    kwargs, dq, dk, ref = CASES[name]
    q, k, _, _ = _data(dq=dq, dk=dk)
    module = scoring.make_score(name, **kwargs)
    assert isinstance(module, scoring.SCORES[name])
    variables = _init(module, q, k)
    s = module.apply(variables, q, k)
    assert s.shape == (B, M, N) and s.dtype == jnp.float32
    assert_close(s, ref(variables["params"], q, k), TOL)


@pytest.mark.parametrize("name", list(CASES))
def test_key_value_attention_matches_float64_reference(name):
    kwargs, dq, dk, ref = CASES[name]
    q, k, v, mask = _data(seed=2, dq=dq, dk=dk)
    kva = scoring.KeyValueAttention(score=name, score_kwargs=kwargs or None)
    variables = _init(kva, q, k)
    # KeyValueAttention.init only saw (q, k); apply with values and the mask.
    context, weights = kva.apply(variables, q, k, v, mask=mask)
    w_ref = _ref_softmax(ref(variables["params"].get("score", {}), q, k), mask)
    assert_close(weights, w_ref, TOL)
    assert_close(context, w_ref @ _f64(v), TOL)
    full = ~mask.any(-1)
    assert full.sum() == 2
    np.testing.assert_array_equal(np.asarray(weights)[full], 0.0)
    np.testing.assert_array_equal(np.asarray(context)[full], 0.0)
    assert not np.isnan(np.asarray(context)).any()
    live = np.asarray(weights)[~full].sum(-1)
    np.testing.assert_allclose(live, 1.0, rtol=1e-6)
    # A [b, 1, m, n] mask (the house mask layout) gives the same result.
    context4, _ = kva.apply(variables, q, k, v, mask=mask[:, None])
    np.testing.assert_array_equal(context4, context)


def test_key_value_attention_gradients_finite_with_fully_masked_rows():
    q, k, v, mask = _data(seed=3, dq=DQ, dk=DK)
    kva = scoring.KeyValueAttention(score="additive", score_kwargs={"hidden": HIDDEN})
    variables = _init(kva, q, k)
    g = jax.grad(lambda q_: jnp.sum(kva.apply(variables, q_, k, v, mask=mask)[0] ** 2))(q)
    assert np.all(np.isfinite(g))
    np.testing.assert_array_equal(np.asarray(g)[0, 1], 0.0)  # the fully-masked query is inert
    assert np.abs(np.asarray(g)[1, 0]).sum() > 0


def test_key_value_attention_values_default_to_keys_and_accepts_module():
    q, k, _, mask = _data(seed=4, dq=DQ, dk=DQ)
    kva = scoring.KeyValueAttention(score=scoring.DotScore())
    context, weights = kva.apply({}, q, k, mask=mask)
    w_ref = _ref_softmax(_ref_dot({}, q, k), mask)
    assert_close(weights, w_ref, TOL)
    assert_close(context, w_ref @ _f64(k), TOL)


def test_mlp_score_with_tanh_and_no_bias_equals_additive_score():
    q, k, _, _ = _data(seed=5)
    mlp = scoring.MLPScore(HIDDEN, activation="tanh", use_bias=False)
    p = _init(mlp, q, k)["params"]
    assert "bias" not in p
    additive = {"params": {"key": {"kernel": p["kernel"][:DK]},
                           "query": {"kernel": p["kernel"][DK:]},
                           "v": p["v"]}}
    s_mlp = mlp.apply({"params": p}, q, k)
    s_add = scoring.AdditiveScore(HIDDEN).apply(additive, q, k)
    assert_close(s_mlp, s_add, TOL)
    assert_close(s_mlp, _ref_mlp(p, q, k, np.tanh, False), TOL)


def test_mlp_score_other_activation_and_bias_is_a_different_function():
    q, k, _, _ = _data(seed=6)
    mlp = scoring.MLPScore(HIDDEN, activation="relu", use_bias=True)
    p = _init(mlp, q, k)["params"]
    s = mlp.apply({"params": p}, q, k)
    relu = lambda x: np.maximum(x, 0.0)
    assert_close(s, _ref_mlp(p, q, k, relu, True), TOL)
    assert np.abs(_ref_mlp(p, q, k, np.tanh, False) - np.asarray(s, np.float64)).max() > 1e-2
    # A callable activation works too.
    s_callable = scoring.MLPScore(HIDDEN, activation=jax.nn.relu).apply({"params": p}, q, k)
    np.testing.assert_array_equal(s_callable, s)


def test_parameters_carry_logical_axis_names():
    q, k, _, _ = _data()
    boxed = scoring.AdditiveScore(HIDDEN).init(jax.random.key(0), q, k)["params"]
    assert boxed["key"]["kernel"].names == ("embed", "mlp")
    assert boxed["v"].names == ("mlp",)
    boxed = scoring.MLPScore(HIDDEN).init(jax.random.key(0), q, k)["params"]
    assert boxed["kernel"].names == ("embed", "mlp") and boxed["bias"].names == ("mlp",)


def test_make_score_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="additive, dot, scaled_dot, bilinear, mlp"):
        scoring.make_score("cosine")
    with pytest.raises(ValueError, match="hidden"):
        scoring.make_score("dot", hidden=4)


def test_dot_score_rejects_different_widths():
    q, k, _, _ = _data()  # DQ != DK
    with pytest.raises(ValueError, match="same width"):
        scoring.ScaledDotScore().apply({}, q, k)


def test_bf16_scores_are_float32_and_close():
    q, k, _, _ = _data(seed=7)
    module = scoring.AdditiveScore(HIDDEN, dtype=jnp.bfloat16)
    variables = _init(module, q, k)
    s = module.apply(variables, q, k)
    assert s.dtype == jnp.float32
    assert_close(s, _ref_additive(variables["params"], q, k), 0.05)
