"""The RNN encoder-decoder: logits against a float64 numpy model (LSTM / GRU, bidirectional
bridge, Bahdanau and Luong attention), the decoder starting from the encoder's final state,
source padding, one-step decoding == teacher forcing, greedy / beam search through zoo.decoding,
attention weights, dropout, logical axes and config errors."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo import decoding
from zoo.models import seq2seq as s2s

PAD, BOS, EOS = 0, 2, 3
B, S, T, V, E, H = 2, 5, 6, 24, 6, 8
# Right-padded: row 1 has 2 source pads and 2 target pads.
SRC = np.array([[5, 6, 7, 8, 9], [10, 11, 12, PAD, PAD]], np.int32)
TGT_IN = np.array([[BOS, 13, 14, 15, 16, 17], [BOS, 18, 19, 20, PAD, PAD]], np.int32)


@functools.cache
def _cfg(attention="additive", cell="lstm", bidirectional=False, layers=2, dropout=0.0,
         share=True):
    return s2s.Seq2SeqConfig(vocab_size=V, cell=cell, embed_dim=E, hidden_size=H,
                             num_layers=layers, attention=attention, bidirectional=bidirectional,
                             dropout_rate=dropout, share_embeddings=share)


@functools.cache
def _params(cfg, seed=0):
    """Random N(0, 0.5^2) parameters everywhere (biases too: one used in the wrong place shows),
    without compiling an init."""
    shapes = jax.eval_shape(s2s.Seq2Seq(cfg).init, jax.random.key(0), SRC, TGT_IN)
    leaves, treedef = jax.tree.flatten(nn.unbox(shapes["params"]))
    rng = np.random.default_rng(seed)
    return treedef.unflatten([jnp.asarray(rng.normal(0, 0.5, x.shape), x.dtype) for x in leaves])


@functools.cache
def _forward(cfg):
    """jit (params, src, tgt) -> (logits, initial DecoderState, attention weights or None)."""

    def run(params, src, tgt):
        model = s2s.Seq2Seq(cfg)
        logits, inter = model.apply({"params": params}, src, tgt, sow_weights=True,
                                    mutable=["intermediates"])
        state = model.apply({"params": params}, src, method="initial_state")
        if cfg.attention == "none":  # nothing is sown
            assert "intermediates" not in inter
            return logits, state, None
        return logits, state, s2s.attention_weights(inter["intermediates"])

    return jax.jit(run)


# ---------------------------------------------------------------------------------------------
# The float64 numpy model


def _np(tree):
    return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _cell_step(kind, w, carry, x):
    """One step of the PyTorch-ordered cell; carry (c, h) for the LSTM, h otherwise."""
    h = carry[1] if kind == "lstm" else carry
    zx = np.einsum("d,dgh->gh", x, w["input_kernel"]) + w["bias"]
    zh = np.einsum("h,hgk->gk", h, w["recurrent_kernel"])
    if kind == "lstm":
        z = zx + zh
        i, f, g, o = _sigmoid(z[0]), _sigmoid(z[1]), np.tanh(z[2]), _sigmoid(z[3])
        c = f * carry[0] + i * g
        h = o * np.tanh(c)
        return (c, h), h
    zh = zh + w["recurrent_bias"]
    r, u = _sigmoid(zx[0] + zh[0]), _sigmoid(zx[1] + zh[1])
    n = np.tanh(zx[2] + r * zh[2])
    h = (1 - u) * n + u * h
    return h, h


def _zero(kind):
    return (np.zeros(H), np.zeros(H)) if kind == "lstm" else np.zeros(H)


def _run_layer(kind, w, xs):
    """xs [n, D] -> (outputs [n, H], final carry) from the zero state."""
    carry, outs = _zero(kind), []
    for x in xs:
        carry, h = _cell_step(kind, w, carry, x)
        outs.append(h)
    return np.array(outs), carry


def _reference_encoder(cfg, p, src_row):
    """(memory [n, M] over the n real tokens, the decoder's initial carries per layer)."""
    kind = cfg.cell
    n = int((src_row != PAD).sum())
    table = p["shared_embedding"]["embedding"] if cfg.share_embeddings else \
        p["source_embedding"]["embedding"]
    x = table[src_row[:n]]
    finals = []
    for k in range(cfg.num_layers):
        layer = p["encoder"][f"layer_{k}"]
        if not cfg.bidirectional:
            x, carry = _run_layer(kind, layer["cell"], x)
            finals.append(carry)
            continue
        fwd, fwd_carry = _run_layer(kind, layer["forward"]["cell"], x)
        bwd, bwd_carry = _run_layer(kind, layer["backward"]["cell"], x[::-1])
        x = np.concatenate([fwd, bwd[::-1]], axis=-1)  # backward outputs aligned to positions
        # The bridge: tanh(W [fwd; bwd] + b) per carry component (c then h for the LSTM).
        parts = list(zip(fwd_carry, bwd_carry)) if kind == "lstm" else [(fwd_carry, bwd_carry)]
        bridged = [np.tanh(np.concatenate([f, b]) @ p[f"bridge_{k}_{j}"]["kernel"]
                           + p[f"bridge_{k}_{j}"]["bias"]) for j, (f, b) in enumerate(parts)]
        finals.append(tuple(bridged) if kind == "lstm" else bridged[0])
    return x, finals


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def _reference(cfg, params, src, tgt):
    """Teacher-forced logits [B, T, V] and attention weights [B, T, S] in float64, written from
    the papers' equations with the model's parameters."""
    p = _np(params)
    kind, att = cfg.cell, cfg.attention
    table = p["shared_embedding"]["embedding"] if cfg.share_embeddings else \
        p["target_embedding"]["embedding"]
    out_w, out_b = p["output_projection"]["kernel"], p["output_projection"]["bias"]
    logits = np.zeros(tgt.shape + (V,))
    alphas = np.zeros(tgt.shape + (src.shape[1],))
    for b in range(src.shape[0]):
        memory, carries = _reference_encoder(cfg, p, src[b])
        n = len(memory)
        feed = np.zeros(H)
        for t, y in enumerate(tgt[b]):
            x = table[y]
            a = p.get("attention", {})
            if att == "additive":
                # Bahdanau: s_{t-1} (top layer's h) scores every h_s; context joins the input.
                s_prev = carries[-1][1] if kind == "lstm" else carries[-1]
                scores = np.array([a["v"] @ np.tanh(m @ a["key_kernel"] + s_prev @
                                                    a["query_kernel"]) for m in memory])
                alpha = _softmax(scores)
                x = np.concatenate([x, alpha @ memory])
            elif att in ("dot", "general"):
                x = np.concatenate([x, feed])  # input feeding of h~_{t-1}
            for k in range(cfg.num_layers):
                w = p["decoder"][f"layer_{k}"]["cell"] if att == "none" else \
                    p[f"decoder_layer_{k}"]
                carries[k], x = _cell_step(kind, w, carries[k], x)
            if att in ("dot", "general"):
                # Luong: h_t scores every h_s; h~_t = tanh(W_c [c_t; h_t]) to the softmax.
                query = x if att == "dot" else x @ a["query_kernel"]
                alpha = _softmax(memory @ query)
                x = feed = np.tanh(np.concatenate([alpha @ memory, x]) @ a["output_kernel"])
            if att != "none":
                alphas[b, t, :n] = alpha
            logits[b, t] = x @ out_w + out_b
    return logits, alphas


CASES = [
    dict(attention="none"),
    dict(attention="none", cell="gru", bidirectional=True),
    dict(attention="additive"),
    dict(attention="additive", cell="gru"),
    dict(attention="dot"),
    dict(attention="general", bidirectional=True, share=False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c.values())))
def test_logits_and_attention_match_float64_reference(case):
    cfg = _cfg(**case)
    params = _params(cfg)
    logits, _, alpha = _forward(cfg)(params, SRC, TGT_IN)
    want, want_alpha = _reference(cfg, params, SRC, TGT_IN)
    assert logits.shape == (B, T, V) and logits.dtype == jnp.float32
    assert_close(logits, want, 2e-5, err_msg="logits")
    if cfg.attention != "none":
        assert alpha.shape == (B, T, S) and alpha.dtype == jnp.float32
        assert_close(alpha, want_alpha, 1e-6, err_msg="attention weights")


@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[4]],
                         ids=lambda c: "-".join(map(str, c.values())))
def test_decoder_starts_from_the_encoders_final_state(case):
    """The course slides' seq2seq: h_0^dec = u = h_S^enc, per layer, taken at each row's last real
    token (bridged for a bidirectional encoder); the memory is the top layer's outputs, zero at
    padding."""
    cfg = _cfg(**case)
    params = _params(cfg)
    _, state, _ = _forward(cfg)(params, SRC, TGT_IN)
    p = _np(params)
    for b in range(B):
        memory, finals = _reference_encoder(cfg, p, SRC[b])
        n = len(memory)
        assert_close(state.memory[b, :n], memory, 1e-5, err_msg=f"memory, row {b}")
        np.testing.assert_array_equal(state.memory[b, n:], 0.0)
        for k in range(cfg.num_layers):
            got = jax.tree.map(lambda x, b=b: x[b], state.carries[k])
            assert_close(got, finals[k], 1e-5, err_msg=f"carries, row {b}, layer {k}")
    np.testing.assert_array_equal(state.valid, SRC != PAD)
    assert state.feed.shape == (B, H if cfg.luong else 0)


@pytest.mark.parametrize("attention", ["none", "additive", "general"])
def test_source_padding_changes_nothing(attention):
    cfg = _cfg(attention)
    params = _params(cfg)
    logits, _, alpha = _forward(cfg)(params, SRC, TGT_IN)
    padded = np.pad(SRC, ((0, 0), (0, 3)), constant_values=PAD)  # (B, S + 3)
    more, _, weights = _forward(cfg)(params, padded, TGT_IN)
    assert_close(more, logits, 1e-6, err_msg="logits")
    if attention != "none":
        assert_close(weights[..., :S], alpha, 1e-7, err_msg="attention weights")
        np.testing.assert_array_equal(weights[..., S:], 0.0)


@pytest.mark.parametrize("attention", ["additive", "general"])
def test_attention_weights_are_distributions_over_real_source_tokens(attention):
    cfg = _cfg(attention)
    _, _, alpha = _forward(cfg)(_params(cfg), SRC, TGT_IN)
    real = SRC != PAD  # (B, S)
    np.testing.assert_allclose(np.where(real[:, None], alpha, 0).sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(np.where(real[:, None], 0, alpha), 0.0)
    assert np.all(np.asarray(alpha) >= 0) and np.ptp(np.asarray(alpha)[0, 0]) > 1e-3


@pytest.mark.parametrize("attention", s2s.ATTENTIONS)
def test_one_step_decoding_equals_teacher_forcing(attention):
    """seq2seq_decoder's step, fed one target token at a time from the state it returns, gives
    the teacher-forced logits at every position (carries, input feeding and memory threaded
    through the zoo.decoding state)."""
    cfg = _cfg(attention)
    params = _params(cfg)
    logits, _, _ = _forward(cfg)(params, SRC, TGT_IN)
    decoder = s2s.seq2seq_decoder(s2s.Seq2Seq(cfg), params, SRC, max_len=T)
    assert decoder.batch_axes == (0,) * len(jax.tree.leaves(decoder.state))
    step = jax.jit(decoder.step)
    state = decoder.state
    for t in range(T):
        step_logits, state = step(decoder.params, jnp.asarray(TGT_IN[:, t:t + 1]), state)
        assert_close(step_logits, logits[:, t], 1e-5, err_msg=f"position {t}")


@functools.cache
def _full_logits(cfg):
    """jit (params, src, tokens [B, L]) -> teacher-forced logits: the reference decoders read
    position t of a fixed-width buffer (the decoder is causal, so later columns do not matter)."""
    return jax.jit(lambda params, src, tokens: s2s.Seq2Seq(cfg).apply({"params": params}, src,
                                                                      tokens))


def _log_softmax64(x):
    x = np.asarray(x, np.float64)
    top = x.max(-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(-1, keepdims=True))


@pytest.mark.parametrize("attention", ["none", "general"])
def test_greedy_decoding_is_an_argmax_loop_and_beam_one_is_greedy(attention):
    cfg = _cfg(attention)
    params = _params(cfg, seed=1)
    max_len = 8
    prompts = np.full((B, 1), BOS, np.int32)
    out = decoding.greedy(s2s.seq2seq_decoder(s2s.Seq2Seq(cfg), params, SRC, max_len=max_len),
                          prompts, max_len=max_len, eos_id=EOS, pad_id=PAD)
    # The argmax loop over full teacher-forced forwards, stopping a row at EOS.
    tokens = np.full((B, max_len), PAD, np.int32)
    tokens[:, 0] = BOS
    done, score = np.zeros(B, bool), np.zeros(B)
    for t in range(max_len - 1):
        logp = _log_softmax64(_full_logits(cfg)(params, SRC, tokens)[:, t])
        for b in range(B):
            if not done[b]:
                tokens[b, t + 1] = int(np.argmax(logp[b]))
                score[b] += logp[b, tokens[b, t + 1]]
                done[b] = tokens[b, t + 1] == EOS
    np.testing.assert_array_equal(out.tokens, tokens)
    assert_close(out.scores, score, 1e-4, err_msg="greedy scores")
    assert len({tuple(r) for r in tokens[:, 1:]}) == B  # two sources, two translations

    beam = decoding.beam_search(s2s.seq2seq_decoder(s2s.Seq2Seq(cfg), params, SRC,
                                                    max_len=max_len),
                                prompts, beam_size=1, max_len=max_len, alpha=0.0, eos_id=EOS,
                                pad_id=PAD)
    np.testing.assert_array_equal(beam.tokens[:, 0], out.tokens)
    assert_close(beam.scores[:, 0], out.scores, 1e-5, err_msg="beam-1 scores")


def test_beam_search_scores_are_the_teacher_forced_scores_of_its_hypotheses():
    """Beam search reorders the state (carries, memory, keys, input feeding) as beams swap
    parents: each returned hypothesis's score equals its log-probability recomputed by teacher
    forcing on its own source, divided by length^alpha."""
    cfg = _cfg("dot")
    params = _params(cfg, seed=2)
    k, max_len, alpha = 3, 7, 0.6
    out = decoding.beam_search(s2s.seq2seq_decoder(s2s.Seq2Seq(cfg), params, SRC,
                                                   max_len=max_len),
                               np.full((B, 1), BOS, np.int32), beam_size=k, max_len=max_len,
                               alpha=alpha, eos_id=EOS, pad_id=PAD)
    checked = 0
    for j in range(k):
        tokens = np.asarray(out.tokens[:, j])
        logp = _log_softmax64(_full_logits(cfg)(params, SRC, tokens))  # (B, L, V)
        for b in range(B):
            n = int(out.lengths[b, j])
            if n == 0:
                continue
            total = sum(logp[b, t, tokens[b, t + 1]] for t in range(n - 1))
            # A sum of log-probabilities of one sign: the score's own size is its scale.
            assert_close(out.scores[b, j], total / (n - 1) ** alpha, 1e-4,
                         err_msg=f"row {b}, hypothesis {j}")
            checked += 1
    assert checked >= B * 2


def test_dropout_acts_in_training_only_and_follows_the_rng():
    cfg = _cfg("general", dropout=0.3)  # 2 layers: the in-loop between-layer masks too
    params = _params(cfg)
    model = s2s.Seq2Seq(cfg)

    @jax.jit
    def train(rng):
        return model.apply({"params": params}, SRC, TGT_IN, deterministic=False,
                           rngs={"dropout": rng})

    eval_logits = _forward(cfg)(params, SRC, TGT_IN)[0]
    a, again, other = train(jax.random.key(0)), train(jax.random.key(0)), train(jax.random.key(1))
    np.testing.assert_array_equal(a, again)
    assert not np.allclose(a, eval_logits, atol=1e-3) and not np.allclose(a, other, atol=1e-3)


@pytest.mark.parametrize("case", [dict(attention="additive", bidirectional=True),
                                  dict(attention="general", share=False),
                                  dict(attention="none")],
                         ids=lambda c: "-".join(map(str, c.values())))
def test_every_parameter_has_logical_axes(case):
    boxed = jax.eval_shape(s2s.Seq2Seq(_cfg(**case)).init, jax.random.key(0), SRC,
                           TGT_IN)["params"]
    leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    assert leaves and all(isinstance(x, nn.LogicallyPartitioned) and len(x.names) == x.value.ndim
                          for x in leaves)


@pytest.mark.parametrize("field, overrides", [
    ("vocab_size", dict(vocab_size=None)),
    ("cell", dict(cell="cnn")),
    ("attention", dict(attention="bilinear")),
    ("hidden_size", dict(hidden_size=0)),
    ("num_layers", dict(num_layers=0)),
    ("dropout_rate", dict(dropout_rate=1.0)),
    ("attention", dict(attention="dot", bidirectional=True)),
    ("dtype", dict(dtype="int8")),
    ("eos_id", dict(eos_id=V)),
])
def test_bad_config_raises_naming_the_field(field, overrides):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(_cfg(), **overrides)


def test_sizes_and_bad_decoder_arguments():
    assert s2s.config_for_size("tiny", vocab_size=V).num_layers == 2
    assert s2s.config_for_size("base", vocab_size=V).hidden_size == 1000
    with pytest.raises(ValueError, match="size 'huge'"):
        s2s.config_for_size("huge", vocab_size=V)
    with pytest.raises(ValueError, match="sow_weights=True"):
        s2s.attention_weights({})
    with pytest.raises(ValueError, match="max_len"):
        s2s.seq2seq_decoder(s2s.Seq2Seq(_cfg()), _params(_cfg()), SRC, max_len=1)
