"""NNLM (Bengio et al. 2003): the formula y = b + Wx + U tanh(d + Hx), its window, its axes."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.models import nnlm

V, CONTEXT, M, H = 13, 3, 4, 5


def _random_params(cfg, tokens, seed=0):
    """Initialised params with every leaf (biases and start vector included) replaced by random
    values, so a formula term that were dropped or misplaced would change the logits."""
    params = nn.unbox(nnlm.NNLM(cfg).init(jax.random.key(seed), tokens)["params"])
    leaves, treedef = jax.tree.flatten(params)
    rng = np.random.default_rng(seed)
    return treedef.unflatten([rng.normal(0, 0.5, np.shape(x)).astype(np.float32)
                              for x in leaves])


def _reference(params, tokens, segment_ids, cfg):
    """float64 numpy y = b + W x + U tanh(d + H x), one position at a time, with
    x = (C(w_t), C(w_{t-1}), ..., C(w_{t-n+2})) and the start vector for slots before the
    position's document (or row) begins."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    table, start = p["C"]["embedding"], p["start"]
    batch, length = tokens.shape
    out = np.zeros((batch, length, cfg.vocab_size))
    for b in range(batch):
        for t in range(length):
            x = np.concatenate([
                table[tokens[b, t - j]]
                if t - j >= 0 and segment_ids[b, t - j] == segment_ids[b, t] else start
                for j in range(cfg.context)])  # ((n-1) m,)
            y = np.zeros(cfg.vocab_size)
            if cfg.hidden_dim:
                hid = np.tanh(p["H"]["bias"] + x @ p["H"]["kernel"].reshape(x.size, -1))
                y += p["U"]["bias"] + hid @ p["U"]["kernel"]
            if cfg.direct:
                y += x @ p["W"]["kernel"].reshape(x.size, -1)
                if not cfg.hidden_dim:
                    y += p["W"]["bias"]
            out[b, t] = y
    return out


@pytest.mark.parametrize("hidden_dim,direct", [(H, True), (H, False), (0, True)])
def test_logits_equal_float64_reference_of_bengio_formula(hidden_dim, direct):
    cfg = nnlm.NNLMConfig(vocab_size=V, context=CONTEXT, embed_dim=M, hidden_dim=hidden_dim,
                          direct=direct)
    tokens = np.array([[2, 7, 7, 1, 12, 0, 5], [3, 4, 5, 6, 8, 0, 0]], np.int32)
    # Row 0: two documents; row 1: one document then packing padding (segment 0).
    segment_ids = np.array([[1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 1, 0, 0]], np.int32)
    params = _random_params(cfg, tokens)
    logits = nnlm.NNLM(cfg).apply({"params": params}, jnp.asarray(tokens),
                                  segment_ids=jnp.asarray(segment_ids))
    assert logits.dtype == jnp.float32 and logits.shape == (2, 7, V)
    assert_close(logits, _reference(params, tokens, segment_ids, cfg), 1e-5)
    # Without segment ids a row is one document: the window crosses the 1 -> 2 boundary.
    no_segments = nnlm.NNLM(cfg).apply({"params": params}, jnp.asarray(tokens))
    assert_close(no_segments, _reference(params, tokens, np.ones_like(tokens), cfg), 1e-5)


def test_a_token_sees_only_the_previous_n_minus_1_tokens_of_its_own_document():
    cfg = nnlm.NNLMConfig(vocab_size=16, context=CONTEXT, embed_dim=M, hidden_dim=H)
    # Distinct ids, so the gradient w.r.t. row tokens[s] of C is the gradient w.r.t. position s.
    tokens = np.random.default_rng(1).permutation(16)[:10].astype(np.int32)[None]
    segment_ids = np.array([[1, 1, 1, 1, 2, 2, 2, 2, 2, 2]], np.int32)
    model = nnlm.NNLM(cfg)
    params = _random_params(cfg, tokens)
    probe = jnp.asarray(np.random.default_rng(2).normal(size=V + 3), jnp.float32)

    @jax.jit
    def grads(t):
        def out(p):
            logits = model.apply({"params": p}, jnp.asarray(tokens),
                                 segment_ids=jnp.asarray(segment_ids))
            return logits[0, t] @ probe
        return jax.grad(out)(params)

    for t in range(tokens.shape[1]):
        g = grads(t)
        touched = np.abs(np.asarray(g["C"]["embedding"])).sum(-1) > 0  # (V,)
        seen = [s for s in range(t - CONTEXT + 1, t + 1)
                if s >= 0 and segment_ids[0, s] == segment_ids[0, t]]
        expected = np.zeros(16, bool)
        expected[tokens[0, seen]] = True
        np.testing.assert_array_equal(touched, expected, err_msg=f"position {t}")
        # The start vector fills exactly the slots that reach before the document's first token.
        start_used = np.abs(np.asarray(g["start"])).sum() > 0
        assert start_used == (len(seen) < CONTEXT), f"position {t}"


def test_every_parameter_has_logical_axes_and_direct_adds_w():
    tokens = jnp.zeros((1, 4), jnp.int32)
    cfg = nnlm.NNLMConfig(vocab_size=V, context=CONTEXT, embed_dim=M, hidden_dim=H)
    boxed = nnlm.NNLM(cfg).init(jax.random.key(0), tokens)["params"]
    names = jax.tree.map(lambda x: x.names, boxed,
                         is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    assert names == {
        "C": {"embedding": ("vocab", "embed")},
        "start": ("embed",),
        "H": {"kernel": (None, "embed", "mlp"), "bias": ("mlp",)},
        "U": {"kernel": ("mlp", "vocab"), "bias": ("vocab",)},
        "W": {"kernel": (None, "embed", "vocab")},
    }
    params = nn.unbox(boxed)
    kernels = sum(params[k]["kernel"].size for k in ("H", "U", "W"))
    assert nnlm.matmul_params(cfg) == kernels
    assert nnlm.flops_per_token(cfg) == 6.0 * kernels
    plain = dataclasses.replace(cfg, direct=False)
    assert "W" not in nnlm.NNLM(plain).init(jax.random.key(0), tokens)["params"]
    assert nnlm.matmul_params(plain) == kernels - params["W"]["kernel"].size


def test_bfloat16_compute_returns_float32_logits_close_to_float32():
    tokens = jnp.asarray(np.arange(12).reshape(2, 6) % V, jnp.int32)
    cfg = nnlm.NNLMConfig(vocab_size=V, context=CONTEXT, embed_dim=M, hidden_dim=H)
    params = _random_params(cfg, np.asarray(tokens))
    full = nnlm.NNLM(cfg).apply({"params": params}, tokens)
    half = nnlm.NNLM(dataclasses.replace(cfg, dtype="bfloat16")).apply({"params": params}, tokens)
    assert half.dtype == jnp.float32
    assert_close(half, full, 0.1)
    assert not np.allclose(half, full, atol=1e-6)  # it really computed in bfloat16


@pytest.mark.parametrize("kw,needle", [
    (dict(context=0), "context"),
    (dict(hidden_dim=0, direct=False), "hidden_dim"),
    (dict(dropout_rate=1.0), "dropout_rate"),
])
def test_bad_config_names_the_field(kw, needle):
    with pytest.raises(ValueError, match=needle):
        nnlm.NNLMConfig(vocab_size=V, **kw)


def test_bad_inputs_and_unknown_size_raise():
    model = nnlm.NNLM(nnlm.NNLMConfig(vocab_size=V, context=2, embed_dim=M, hidden_dim=H))
    tokens = jnp.zeros((2, 5), jnp.int32)
    with pytest.raises(ValueError, match="segment_ids shape"):
        model.init(jax.random.key(0), tokens, segment_ids=jnp.zeros((2, 4), jnp.int32))
    with pytest.raises(ValueError, match=r"\[batch, length\]"):
        model.init(jax.random.key(0), jnp.zeros((5,), jnp.int32))
    with pytest.raises(ValueError, match="huge"):
        nnlm.config_for_size("huge", vocab_size=V)
    assert nnlm.config_for_size("tiny", vocab_size=V, context=7).context == 7
