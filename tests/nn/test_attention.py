import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.nn import masks
from zoo.nn.attention import MultiHeadAttention

B, T, S, D, DKV, H = 2, 5, 6, 8, 6, 2
TOL = 1e-5  # of each tensor's largest |entry| (tests/numerics.py)
BACKENDS = ["einsum", "dot_product", "blockwise"]


def _randomised(variables, seed):
    """Every parameter random (biases init to zero), so the reference checks each one."""
    params = nn.unbox(variables)["params"]
    leaves, tree = jax.tree.flatten(params)
    rng = np.random.default_rng(seed)
    leaves = [rng.normal(size=x.shape).astype(np.float32) * 0.4 for x in leaves]
    return {"params": jax.tree.unflatten(tree, leaves)}


def _f64(x):
    return np.asarray(x, np.float64)


def _ref_mha(p, xq, xkv, mask=None, bias=None):
    """float64 numpy multi-head attention; returns (out [b, t, e], weights [b, h, t, s])."""
    # use_bias=False modules have no "bias" entries.
    proj = lambda x, n: np.einsum("btd,dhk->bthk", _f64(x), _f64(p[n]["kernel"])) + _f64(
        p[n].get("bias", 0.0))
    q, k, v = proj(xq, "query"), proj(xkv, "key"), proj(xkv, "value")  # (b, t|s, h, k)
    logits = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(q.shape[-1])
    if bias is not None:
        logits = logits + _f64(bias)
    keep = np.ones(logits.shape, bool) if mask is None else np.broadcast_to(mask, logits.shape)
    top = np.where(keep, logits, -np.inf).max(-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.where(keep, np.exp(logits - top), 0.0)
    den = e.sum(-1, keepdims=True)
    w = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
    o = np.einsum("bhts,bshk->bthk", w, v)
    out = np.einsum("bthk,hke->bte", o, _f64(p["out"]["kernel"]))
    out = out + _f64(p["out"].get("bias", 0.0))
    return out, w


def _self_case(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(B, T, D)).astype(np.float32)
    valid = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], bool)
    mask = np.asarray(masks.padding_mask(valid))  # padded queries are fully-masked rows
    bias = rng.normal(size=(1, H, T, T)).astype(np.float32)
    return x, None, mask, bias


def _cross_case(seed=1):
    rng = np.random.default_rng(seed)
    xq = rng.normal(size=(B, T, D)).astype(np.float32)
    xkv = rng.normal(size=(B, S, DKV)).astype(np.float32)
    mask = rng.random((B, H, T, S)) < 0.5
    mask[0, 1, 2, :] = False  # fully-masked in one head only
    mask[1, :, 4, :] = False  # fully-masked in every head
    bias = rng.normal(size=(B, 1, 1, S)).astype(np.float32)
    return xq, xkv, mask, bias


def _module(case, **kw):
    if case == "cross":  # explicit head_dim and out_features, different kv width
        return MultiHeadAttention(num_heads=H, head_dim=3, out_features=5, **kw)
    return MultiHeadAttention(num_heads=H, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["self", "cross"])
def test_matches_float64_reference_both_backends_and_jit(case):
    xq, xkv, mask, bias = _self_case() if case == "self" else _cross_case()
    ref_kv = xq if xkv is None else xkv
    variables = _randomised(_module(case).init(jax.random.key(0), xq, xkv), seed=3)
    p = variables["params"]
    expected, _ = _ref_mha(p, xq, ref_kv, mask, bias)
    expected_nomask, _ = _ref_mha(p, xq, ref_kv)
    outs = {}
    for backend in BACKENDS:
        m = _module(case, backend=backend)
        outs[backend] = m.apply(variables, xq, xkv, mask=mask, bias=bias)
        assert_close(outs[backend], expected, TOL)
        assert_close(m.apply(variables, xq, xkv), expected_nomask, TOL)
        if case == "self":  # jit == no-jit (one compile per backend: CPU time is scarce)
            jitted = jax.jit(lambda v, a, mk, bi, m=m: m.apply(v, a, mask=mk, bias=bi))
            assert_close(jitted(variables, xq, mask, bias), outs[backend], 1e-6)
    assert_close(outs["einsum"], outs["dot_product"], 1e-6)
    assert outs["einsum"].shape == (B, T, 5 if case == "cross" else D)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fully_masked_rows_give_zero_output_not_uniform(backend):
    xq, xkv, mask, bias = _cross_case(seed=4)
    m = _module("cross", backend=backend, use_bias=False)  # no out bias: the row must be 0
    variables = m.init(jax.random.key(1), xq, xkv)
    out = np.asarray(m.apply(variables, xq, xkv, mask=mask, bias=bias))
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(out[1, 4], 0.0)  # every head masked
    assert np.abs(out[0, 2]).sum() > 0  # only one head masked: the other still contributes
    # The masked head contributes nothing to row (0, 2): the reference agrees.
    expected, _ = _ref_mha(nn.unbox(variables)["params"], xq, xkv, mask, bias)
    assert_close(out, expected, TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_causality_by_gradient(backend):
    x = np.random.default_rng(5).normal(size=(1, T, D)).astype(np.float32)
    m = MultiHeadAttention(num_heads=H, backend=backend)
    variables = m.init(jax.random.key(2), x)
    causal = masks.causal_mask(T)
    jac = jax.jit(jax.jacrev(lambda x_: m.apply(variables, x_, mask=causal)[0]))(x)
    jac = jac[:, :, 0]  # d out[t, e] / d x[s, d]: (t, e, s, d)
    per_pair = np.abs(np.asarray(jac)).sum(axis=(1, 3))  # (t, s)
    future = np.triu(np.ones((T, T), bool), k=1)
    np.testing.assert_array_equal(per_pair[future], 0.0)
    assert np.all(per_pair[~future] > 0)


def _decode_setup(backend, seed=6):
    x = np.random.default_rng(seed).normal(size=(B, T, D)).astype(np.float32)
    full = MultiHeadAttention(num_heads=H, backend=backend)
    dec = MultiHeadAttention(num_heads=H, backend=backend, decode=True)
    variables = dec.init(jax.random.key(3), x)  # full-length input: cache length T
    params = _randomised(variables, seed=7)["params"]
    return x, full, dec, params, variables["cache"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_kv_cache_one_token_at_a_time_equals_full_causal_forward(backend):
    x, full, dec, params, cache = _decode_setup(backend)
    assert cache["cached_key"].shape == (B, T, H, D // H)
    assert cache["cache_index"].dtype == jnp.int32 and int(cache["cache_index"]) == 0
    expected = full.apply({"params": params}, x, mask=masks.causal_mask(T))
    step = jax.jit(lambda c, tok: dec.apply({"params": params, "cache": c}, tok, mutable=["cache"]))
    outs = []
    for t in range(T):
        out, upd = step(cache, x[:, t:t + 1])
        cache = upd["cache"]
        outs.append(out)
    assert int(cache["cache_index"]) == T
    assert_close(jnp.concatenate(outs, axis=1), expected, TOL)


def test_kv_cache_prefill_chunk_with_padding_mask_equals_full_forward():
    x, full, dec, params, cache = _decode_setup("einsum", seed=8)
    key_valid = np.array([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]], bool)  # left-padded second row
    pad = key_valid[:, None, None, :]  # (b, 1, 1, max_len)
    expected = full.apply({"params": params}, x,
                          mask=masks.combine_masks(masks.causal_mask(T), pad))
    run = lambda c, chunk: dec.apply({"params": params, "cache": c}, chunk, mask=pad,
                                     mutable=["cache"])
    out_prefill, upd = run(cache, x[:, :3])  # a 3-token prompt at once
    outs = [out_prefill]
    cache = upd["cache"]
    for t in range(3, T):
        out, upd = run(cache, x[:, t:t + 1])
        cache = upd["cache"]
        outs.append(out)
    assert_close(jnp.concatenate(outs, axis=1), expected, TOL)


def test_decode_cross_attention_is_not_cached():
    xq, xkv, mask, _ = _cross_case(seed=9)
    dec = _module("cross", decode=True)
    variables = dec.init(jax.random.key(4), xq, xkv)
    assert "cache" not in variables
    out, upd = dec.apply(variables, xq[:, :1], xkv, mask=mask[:, :, :1], mutable=["cache"])
    assert not upd.get("cache")
    assert_close(out, _module("cross").apply(variables, xq[:, :1], xkv, mask=mask[:, :, :1]),
                 1e-6)


def test_decode_rejects_chunk_longer_than_cache():
    x, _, dec, params, cache = _decode_setup("einsum")
    too_long = np.concatenate([x, x], axis=1)
    with pytest.raises(ValueError, match="decode chunks"):
        dec.apply({"params": params, "cache": cache}, too_long, mutable=["cache"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_only_when_not_deterministic_and_reproducible(backend):
    x, _, mask, _ = _self_case(seed=10)
    m = MultiHeadAttention(num_heads=H, dropout_rate=0.5, backend=backend)
    variables = m.init(jax.random.key(5), x)
    no_drop = MultiHeadAttention(num_heads=H, dropout_rate=0.0, backend=backend).apply(
        variables, x, mask=mask)
    np.testing.assert_array_equal(m.apply(variables, x, mask=mask, deterministic=True), no_drop)
    run = lambda seed: m.apply(variables, x, mask=mask, deterministic=False,
                               rngs={"dropout": jax.random.key(seed)})
    a, b, c = run(0), run(0), run(1)
    np.testing.assert_array_equal(a, b)
    assert np.abs(np.asarray(a) - np.asarray(no_drop)).max() > 1e-3
    assert np.abs(np.asarray(a) - np.asarray(c)).max() > 1e-3
    if backend == "dot_product":  # falls back to the einsum path: identical dropped output
        einsum = MultiHeadAttention(num_heads=H, dropout_rate=0.5)
        np.testing.assert_array_equal(
            a, einsum.apply(variables, x, mask=mask, deterministic=False,
                            rngs={"dropout": jax.random.key(0)}))


@pytest.mark.parametrize("backend", BACKENDS)
def test_return_and_sow_weights(backend):
    x, _, mask, bias = _self_case(seed=11)
    m = MultiHeadAttention(num_heads=H, backend=backend)
    variables = _randomised(m.init(jax.random.key(6), x), seed=12)
    (out, w), state = m.apply(variables, x, mask=mask, bias=bias, return_weights=True,
                              sow_weights=True, mutable=["intermediates"])
    assert w.shape == (B, H, T, T)
    ref_out, ref_w = _ref_mha(variables["params"], x, x, mask, bias)
    assert_close(w, ref_w, TOL)
    assert_close(out, ref_out, TOL)
    row_sums = np.asarray(w).sum(-1)
    live = np.broadcast_to(mask, (B, H, T, T)).any(-1)
    np.testing.assert_allclose(row_sums[live], 1.0, rtol=1e-6)
    np.testing.assert_array_equal(row_sums[~live], 0.0)
    assert (~live).sum() == H * 3  # the three padded query rows
    (sown,) = state["intermediates"]["attention_weights"]
    np.testing.assert_array_equal(sown, w)
    _, state = m.apply(variables, x, mask=mask, mutable=["intermediates"])
    assert not state.get("intermediates")  # nothing sown unless asked


def test_bf16_compute_close_to_float32():
    x, _, mask, bias = _self_case(seed=13)
    m32 = MultiHeadAttention(num_heads=H)
    m16 = MultiHeadAttention(num_heads=H, dtype=jnp.bfloat16)
    variables = m16.init(jax.random.key(7), x)
    assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nn.unbox(variables)))
    out32 = m32.apply(variables, x, mask=mask, bias=bias)
    for backend in BACKENDS:
        out16 = m16.clone(backend=backend).apply(variables, x, mask=mask, bias=bias)
        assert out16.dtype == jnp.bfloat16
        assert_close(np.asarray(out16, np.float32), out32, 0.05, err_msg=backend)


def test_parameter_names_and_logical_axes():
    x = np.zeros((B, T, D), np.float32)
    m = MultiHeadAttention(num_heads=H)
    params = jax.eval_shape(m.init, jax.random.key(0), x)["params"]  # shapes + names, no compute
    assert set(params) == {"query", "key", "value", "out"}
    for n in ("query", "key", "value"):
        assert params[n]["kernel"].names == ("embed", "heads", "kv")
        assert params[n]["kernel"].value.shape == (D, H, D // H)
    assert params["out"]["kernel"].names == ("heads", "kv", "embed")


def test_bad_arguments_raise_value_errors():
    x = np.zeros((B, T, D), np.float32)
    with pytest.raises(ValueError, match="num_heads"):
        jax.eval_shape(MultiHeadAttention(num_heads=3).init, jax.random.key(0), x)
    with pytest.raises(ValueError, match="backend"):
        jax.eval_shape(MultiHeadAttention(num_heads=H, backend="flash").init, jax.random.key(0), x)
    with pytest.raises(ValueError, match="boolean"):
        MultiHeadAttention(num_heads=H).init(jax.random.key(0), x, mask=jnp.zeros((1, 1, T, T)))
