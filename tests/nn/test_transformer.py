"""Transformer layers and stacks: numerics vs numpy, causality, KV-cache decoding, scan, remat."""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close, assert_params_close
from zoo.nn import masks
from zoo.nn.transformer import DecoderLayer, EncoderLayer, TransformerDecoder, TransformerEncoder

B, T, S, D, H, MLP = 2, 5, 4, 16, 2, 32
_erf = np.vectorize(math.erf)


def _randomize(variables, seed=0, std=0.3):
    """Every parameter N(0, std^2) (biases and LayerNorm scales too), so each one matters."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda x: jnp.asarray(std * rng.normal(size=x.shape), x.dtype), nn.unbox(variables)
    )


def _init_params(module, *args, **kwargs):
    """Random parameters for `module` from the init's shapes alone (nothing compiled or run)."""
    shapes = jax.eval_shape(functools.partial(module.init, **kwargs), jax.random.key(0), *args)
    return _randomize(shapes["params"])


# Whole-function jit: one compilation instead of one per primitive of an eager Flax call, which
# keeps this file fast on a 2-core machine.
def _apply(module, params, *args, **kwargs):
    return jax.jit(functools.partial(module.apply, **kwargs))({"params": params}, *args)


def _np(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


# ---- float64 numpy reference ------------------------------------------------------------------


def _ref_layernorm(x, p, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _ref_attention(xq, xkv, p, mask):
    """Multi-head attention; mask [b, 1, q, k] bool. A query with no visible key outputs zeros
    before the output projection (the convention documented in zoo.nn.attention)."""
    q = np.einsum("btd,dhk->bthk", xq, p["query"]["kernel"]) + p["query"]["bias"]
    k = np.einsum("bsd,dhk->bshk", xkv, p["key"]["kernel"]) + p["key"]["bias"]
    v = np.einsum("bsd,dhk->bshk", xkv, p["value"]["kernel"]) + p["value"]["bias"]
    logits = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(q.shape[-1])
    mask = np.broadcast_to(mask, logits.shape)
    logits = np.where(mask, logits, -np.inf)
    row_max = np.max(logits, axis=-1, keepdims=True)
    e = np.exp(logits - np.where(np.isfinite(row_max), row_max, 0.0))
    denom = e.sum(-1, keepdims=True)
    w = np.where(denom > 0, e / np.where(denom > 0, denom, 1.0), 0.0)
    o = np.einsum("bhts,bshk->bthk", w, v)
    return np.einsum("bthk,hkd->btd", o, p["out"]["kernel"]) + p["out"]["bias"]


def _ref_mlp(x, p):
    h = x @ p["wi"]["kernel"] + p["wi"]["bias"]
    h = 0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)))  # exact GELU
    return h @ p["wo"]["kernel"] + p["wo"]["bias"]


def _ref_encoder_layer(x, p, mask, norm_position, eps):
    def residual(x, f, norm):
        if norm_position == "pre":
            return x + f(_ref_layernorm(x, p[norm], eps))
        return _ref_layernorm(x + f(x), p[norm], eps)

    x = residual(
        x, lambda h: _ref_attention(h, h, p["self_attention"], mask), "self_attention_norm"
    )
    return residual(x, lambda h: _ref_mlp(h, p["mlp"]), "mlp_norm")


# ---- tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_encoder_layer_matches_float64_reference(norm_position):
    eps = 1e-5
    x = jax.random.normal(jax.random.key(1), (B, T, D))
    valid = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
    mask = masks.padding_mask(jnp.asarray(valid))
    layer = EncoderLayer(
        num_heads=H,
        mlp_dim=MLP,
        activation="gelu",
        norm_position=norm_position,
        layer_norm_epsilon=eps,
    )
    params = _init_params(layer, x, mask)
    got = _apply(layer, params, x, mask)
    x64, p64, mask_np = np.asarray(x, np.float64), _np(params), np.asarray(mask)
    expected = _ref_encoder_layer(x64, p64, mask_np, norm_position, eps)
    assert_close(got, expected, 1e-4)
    # The placement matters: the other placement's reference is far from this output.
    other = {"post": "pre", "pre": "post"}[norm_position]
    alt = _ref_encoder_layer(x64, p64, mask_np, other, eps)
    assert not np.allclose(got, alt, rtol=1e-4, atol=1e-5)


def test_decoder_stack_is_causal_and_reads_the_encoder():
    x = jax.random.normal(jax.random.key(1), (B, T, D))
    encoded = jax.random.normal(jax.random.key(2), (B, S, D))
    self_mask = masks.causal_mask(T, batch=B)
    stack = TransformerDecoder(num_layers=2, num_heads=H, mlp_dim=MLP, cross_attention=True)
    params = _init_params(stack, x, encoded, self_mask=self_mask)

    def f(x, encoded):
        return stack.apply({"params": params}, x, encoded, self_mask=self_mask)

    jac_x, jac_enc = jax.jit(jax.jacrev(f, argnums=(0, 1)))(x, encoded)  # (B, T, D, B, T|S, D)
    # |d out[b, t] / d x[b, s]| summed over features: [b, t, s].
    dep_x = np.abs(np.einsum("btdbse->btsde", jac_x)).sum((-1, -2))
    future = np.triu(np.ones((T, T), bool), k=1)
    assert np.all(dep_x[:, future] == 0.0), "output depends on later decoder inputs"
    assert np.all(dep_x[:, ~future] > 0.0), "output ignores earlier decoder inputs"
    dep_enc = np.abs(np.einsum("btdbse->btsde", jac_enc)).sum((-1, -2))
    assert np.all(dep_enc > 0.0), "every position should read every encoder position"


@pytest.mark.parametrize("scan_layers", [False, True])
def test_kv_cache_decoding_equals_full_causal_forward(scan_layers):
    kwargs = dict(
        num_layers=2,
        num_heads=H,
        mlp_dim=MLP,
        activation="gelu_tanh",
        norm_position="pre",
        layer_norm_epsilon=1e-5,
        cross_attention=False,
        scan_layers=scan_layers,
    )
    x = jax.random.normal(jax.random.key(1), (B, T, D))
    full = TransformerDecoder(**kwargs)
    params = _init_params(full, x)
    expected = _apply(full, params, x, self_mask=masks.causal_mask(T, batch=B))

    decoder = TransformerDecoder(decode=True, **kwargs)
    # init with the full-length input sizes the cache; every cache variable starts at zero.
    cache_shapes = jax.eval_shape(decoder.init, jax.random.key(0), x)["cache"]
    cache = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), cache_shapes)

    @jax.jit
    def step(cache, token):
        y, mutated = decoder.apply({"params": params, "cache": cache}, token, mutable=["cache"])
        return mutated["cache"], y

    outs = []
    for t in range(T):
        cache, y = step(cache, x[:, t : t + 1])
        outs.append(y)
    assert_close(jnp.concatenate(outs, axis=1), expected, 1e-5)


def _restack(params, num_layers):
    """Unscanned params (layer_0, layer_1, ...) -> the scanned layout ('layers', leading axis)."""
    layers = [params[f"layer_{i}"] for i in range(num_layers)]
    out = {k: v for k, v in params.items() if not k.startswith("layer_")}
    out["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
    return out


def test_scanned_encoder_equals_unscanned_with_restacked_params():
    x = jax.random.normal(jax.random.key(1), (B, T, D))
    mask = masks.padding_mask(jnp.asarray([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], bool))
    kwargs = dict(num_layers=3, num_heads=H, mlp_dim=MLP, norm_position="pre")
    plain = TransformerEncoder(**kwargs)
    scanned = TransformerEncoder(scan_layers=True, **kwargs)
    params = _init_params(plain, x, mask)
    # GPT-2's ln_f: a final LayerNorm exists for pre-LN stacks only.
    assert "final_norm" in params
    assert "final_norm" not in _init_params(
        TransformerEncoder(**{**kwargs, "norm_position": "post"}), x
    )

    abstract = jax.eval_shape(scanned.init, jax.random.key(0), x, mask)
    specs = nn.get_partition_spec(abstract)["params"]["layers"]
    assert specs["mlp"]["wi"]["kernel"] == jax.P("layers", "embed", "mlp")
    assert specs["self_attention"]["query"]["kernel"] == jax.P("layers", "embed", "heads", "kv")
    restacked = _restack(params, 3)
    assert jax.tree.map(jnp.shape, restacked) == jax.tree.map(
        jnp.shape, nn.unbox(abstract)["params"]
    )

    assert_close(_apply(scanned, restacked, x, mask), _apply(plain, params, x, mask), 1e-5)


def test_scanned_decoder_with_cross_attention_equals_unscanned_and_sows_per_layer():
    x = jax.random.normal(jax.random.key(1), (B, T, D))
    encoded = jax.random.normal(jax.random.key(2), (B, S, D))
    self_mask = masks.causal_mask(T, batch=B)
    kwargs = dict(num_layers=2, num_heads=H, mlp_dim=MLP)
    plain = TransformerDecoder(**kwargs)
    scanned = TransformerDecoder(scan_layers=True, **kwargs)
    params = _init_params(plain, x, encoded, self_mask=self_mask)
    sow = dict(self_mask=self_mask, sow_weights=True, mutable=["intermediates"])
    want, state = _apply(plain, params, x, encoded, **sow)
    got, scanned_state = _apply(scanned, _restack(params, 2), x, encoded, **sow)
    assert_close(got, want, 1e-5)
    # Scanned intermediates are stacked over layers: [layers, b, h, q, k].
    (cross,) = scanned_state["intermediates"]["layers"]["cross_attention"]["attention_weights"]
    assert cross.shape == (2, B, H, T, S)
    (layer1,) = state["intermediates"]["layer_1"]["cross_attention"]["attention_weights"]
    assert_close(cross[1], layer1, 1e-5)


@pytest.mark.parametrize(("remat", "scan_layers"), [("full", False), ("dots", True)])
def test_remat_gives_same_output_and_gradients(remat, scan_layers):
    x = jax.random.normal(jax.random.key(1), (B, T, D))
    mask = masks.causal_mask(T, batch=B)
    kwargs = dict(
        num_layers=2, num_heads=H, mlp_dim=MLP, norm_position="pre", scan_layers=scan_layers
    )
    base = TransformerEncoder(**kwargs)
    rematted = TransformerEncoder(remat=remat, **kwargs)
    params = _init_params(base, x, mask)

    def loss(module):
        return lambda p, x: jnp.sum(jnp.sin(module.apply({"params": p}, x, mask)))

    (l0, (g0, gx0)) = jax.jit(jax.value_and_grad(loss(base), argnums=(0, 1)))(params, x)
    (l1, (g1, gx1)) = jax.jit(jax.value_and_grad(loss(rematted), argnums=(0, 1)))(params, x)
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    # The key biases' gradient is 0 analytically: assert_params_close holds those leaves to the
    # scale of the whole gradient, every other leaf to its own.
    assert_params_close(g1, g0, 1e-5)
    assert_close(gx1, gx0, 1e-5)


def test_remat_actually_rematerialises():
    # The remat'd backward pass contains a checkpoint (remat) primitive; the plain one does not.
    x = jnp.ones((B, T, D))
    params = _init_params(TransformerEncoder(num_layers=1, num_heads=H, mlp_dim=MLP), x)

    def jaxpr(remat):
        module = TransformerEncoder(num_layers=1, num_heads=H, mlp_dim=MLP, remat=remat)
        return str(jax.make_jaxpr(jax.grad(lambda p: module.apply({"params": p}, x).sum()))(params))

    assert "remat" in jaxpr("full") or "checkpoint" in jaxpr("full")
    assert "remat" not in jaxpr("none") and "checkpoint" not in jaxpr("none")


def test_dropout_only_when_not_deterministic():
    x = jax.random.normal(jax.random.key(1), (B, T, D))
    encoded = jax.random.normal(jax.random.key(2), (B, S, D))
    rates = dict(dropout_rate=0.3, attention_dropout_rate=0.3, mlp_dropout_rate=0.3)
    layer = DecoderLayer(num_heads=H, mlp_dim=MLP, **rates)
    params = _init_params(layer, x, encoded)
    clean = _apply(DecoderLayer(num_heads=H, mlp_dim=MLP), params, x, encoded)
    np.testing.assert_array_equal(_apply(layer, params, x, encoded, deterministic=True), clean)

    # Each rate on its own changes the training-mode output, differently for each dropout key.
    for name in rates:
        module = DecoderLayer(num_heads=H, mlp_dim=MLP, **{name: 0.3})
        train = jax.jit(
            lambda key, module=module: module.apply(
                {"params": params}, x, encoded, deterministic=False, rngs={"dropout": key}
            )
        )
        a, b = train(jax.random.key(3)), train(jax.random.key(4))
        assert not np.allclose(a, clean) and not np.allclose(a, b), name


def test_bad_arguments_raise_clear_errors():
    x = jnp.ones((1, 3, 8))
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="norm_position='middle'"):
        jax.eval_shape(EncoderLayer(num_heads=2, mlp_dim=8, norm_position="middle").init, key, x)
    with pytest.raises(ValueError, match="remat='some'"):
        jax.eval_shape(
            TransformerEncoder(num_layers=1, num_heads=2, mlp_dim=8, remat="some").init, key, x
        )
    with pytest.raises(ValueError, match="encoded"):
        jax.eval_shape(DecoderLayer(num_heads=2, mlp_dim=8).init, key, x)
