"""The Transformer encoder-decoder: shapes, causality by gradient, source padding, KV cache ==
teacher forcing, the three embedding-sharing modes, sqrt(d) scaling and sinusoidal positions
against float64, greedy/beam translation against full-forward references, jit, a sharded mesh,
attention maps, sizes and FLOPs, and a small reversal task learned from scratch."""

import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.numerics import assert_close
from zoo import decoding
from zoo.models import encoder_decoder as tr
from zoo.train import partitioning

PAD, BOS, EOS = 0, 2, 3
B, S, T, V, D = 2, 5, 8, 32, 16
# One encoder and two decoder layers: different depths catch a stack built with the other's
# count, and the decoder's cache spans more than one layer. max_len = T bounds translations.
CFG = tr.config_for_size("tiny", vocab_size=V, hidden_size=D, num_heads=4, mlp_dim=32,
                         num_encoder_layers=1, num_decoder_layers=2, max_len=T, dropout_rate=0.0)
CFG_NONE = dataclasses.replace(CFG, share_embeddings="none")
# Right-padded; row 1 has 2 source pads and 3 target pads. No id repeats inside a row, and
# source and target ids are disjoint, so a gradient row of an embedding table belongs to one
# position of one side.
SRC = np.array([[5, 6, 7, 8, 9], [10, 11, 12, PAD, PAD]], np.int32)
TGT_IN = np.array([[BOS, 13, 14, 15, 16, 17, 18, 19], [BOS, 20, 21, 22, 23, PAD, PAD, PAD]],
                  np.int32)

# Compilation dominates these tests' time on a CPU, so every jitted function is built once per
# config (functools.cache) and the tests reuse the shapes above wherever they can.


def _params(cfg, seed=0, scale=0.3):
    """Random parameters, no compilation: N(0, scale^2) everywhere, LayerNorm gains around 1.

    Non-zero biases and non-unit gains would expose one used in the wrong place, and the scale
    makes next-token distributions far from uniform, so decoding choices are clear-cut.
    """
    shapes = jax.eval_shape(tr.EncoderDecoder(cfg).init, jax.random.key(0), SRC, TGT_IN)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(nn.unbox(shapes["params"]))
    rng = np.random.default_rng(seed)
    return treedef.unflatten([
        jnp.asarray(rng.normal(0, scale, x.shape) + (path[-1].key == "scale"), x.dtype)
        for path, x in leaves])


@functools.cache
def _cached_params(cfg, seed=0):
    return _params(cfg, seed)


@functools.cache
def _run(cfg):
    """jit (params, source, target inputs) -> (logits [B, T, V], encoded [B, S, d],
    source_valid [B, S])."""

    def run(params, src, tgt):
        model = tr.EncoderDecoder(cfg)
        encoded, valid = model.apply({"params": params}, src, method="encode")
        return model.apply({"params": params}, src, tgt), encoded, valid

    return jax.jit(run)


def _logits(cfg, params, src=SRC, tgt=TGT_IN):
    return _run(cfg)(params, src, tgt)[0]


@functools.cache
def _inspect(cfg):
    """jit params -> (logits, intermediates): attention weights sown and the position modules'
    outputs (the inputs of the two stacks) captured."""

    def inspect(params):
        return tr.EncoderDecoder(cfg).apply(
            {"params": params}, SRC, TGT_IN, sow_weights=True, mutable=["intermediates"],
            capture_intermediates=lambda m, _: m.name in ("source_positions", "target_positions"))

    return jax.jit(inspect)


def _log_softmax64(x):
    x = np.asarray(x, np.float64)
    top = x.max(-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(-1, keepdims=True))


def _sinusoid64(length, d):
    """The paper's table: P[i, 2j] = sin(i / 10000^(2j/d)), P[i, 2j+1] = cos(same)."""
    table = np.zeros((length, d))
    for i in range(length):
        for j in range(0, d, 2):
            table[i, j] = math.sin(i / 10000 ** (j / d))
            table[i, j + 1] = math.cos(i / 10000 ** (j / d))
    return table


# ---------------------------------------------------------------------------------------------
# Shapes, causality, padding


def test_shapes_dtypes_and_parameter_names():
    params = _cached_params(CFG)
    logits, encoded, valid = _run(CFG)(params, SRC, TGT_IN)
    assert logits.shape == (B, T, V) and logits.dtype == jnp.float32
    assert encoded.shape == (B, S, D) and encoded.dtype == jnp.float32
    np.testing.assert_array_equal(valid, SRC != PAD)
    assert set(params) == {"shared_embedding", "encoder", "decoder"}
    assert set(params["encoder"]) == {"layer_0"}
    assert set(params["decoder"]) == {"layer_0", "layer_1"}
    assert set(params["decoder"]["layer_1"]) == {
        "self_attention", "self_attention_norm", "cross_attention", "cross_attention_norm",
        "mlp", "mlp_norm"}
    assert "cross_attention" not in params["encoder"]["layer_0"]
    # bf16 compute: bf16 activations, float32 logits (shapes only: no compilation needed).
    bf16 = tr.EncoderDecoder(dataclasses.replace(CFG, dtype="bfloat16"))
    assert jax.eval_shape(bf16.apply, {"params": params}, SRC, TGT_IN).dtype == jnp.float32
    encoded, _ = jax.eval_shape(functools.partial(bf16.apply, method="encode"),
                                {"params": params}, SRC)
    assert encoded.dtype == jnp.bfloat16


def test_decoder_is_causal_and_encoder_is_not():
    """d logits[b, t] / d (embedding row of the target token at position u) is exactly 0 for
    u > t and nonzero for u <= t; the encoder output at position 0 depends on every real source
    position and not at all on the padding token's embedding."""
    params = _cached_params(CFG_NONE)  # untied: each table serves its inputs only
    weights = jnp.asarray(np.random.default_rng(0).normal(size=(V,)), jnp.float32)
    full_tgt = TGT_IN.copy()
    full_tgt[1, 5:] = [24, 25, 26]  # no padding: every position's row is its own

    @jax.jit
    def jacobians(source_table, target_table):
        def f(source_table, target_table):
            p = {**params, "source_embedding": {"embedding": source_table},
                 "target_embedding": {"embedding": target_table}}
            logits, encoded, _ = _run(CFG_NONE)(p, SRC, full_tgt)
            # (B, T): a random functional of each position's logits; (B,): of encoded[:, 0].
            return logits @ weights, encoded[:, 0].sum(-1)

        return jax.jacrev(f, argnums=(0, 1))(source_table, target_table)

    (_, d_logits), (d_encoded, _) = jacobians(params["source_embedding"]["embedding"],
                                              params["target_embedding"]["embedding"])
    for b in range(B):
        for t in range(T):
            norms = np.abs(np.asarray(d_logits[b, t, full_tgt[b]])).sum(-1)  # (T,)
            assert (norms[t + 1:] == 0).all(), (b, t, norms)
            assert (norms[: t + 1] > 0).all(), (b, t, norms)
        norms = np.abs(np.asarray(d_encoded[b, SRC[b]])).sum(-1)  # (S,)
        real = SRC[b] != PAD
        assert (norms[real] > 0).all() and (norms[~real] == 0).all(), (b, norms)


def test_source_padding_changes_nothing_at_real_positions():
    """Row 1 of SRC ([10, 11, 12] + 2 pads) gives the logits and encoder outputs of the same
    sentence run unpadded."""
    params = _cached_params(CFG)
    logits, encoded, _ = _run(CFG)(params, SRC, TGT_IN)
    narrow = np.array([[5, 6, 7], [10, 11, 12]], np.int32)  # row 1 unpadded
    logits_narrow, encoded_narrow, _ = _run(CFG)(params, narrow, TGT_IN)
    assert_close(logits[1], logits_narrow[1], 1e-5, err_msg="logits")
    assert_close(encoded[1, :3], encoded_narrow[1], 1e-5, err_msg="encoder outputs")
    # Row 0 lost real tokens, so it must change: the comparison can tell inputs apart.
    assert np.abs(np.asarray(logits[0] - logits_narrow[0])).max() > 1e-3


# ---------------------------------------------------------------------------------------------
# Incremental decoding

CFG_SCAN = dataclasses.replace(CFG, num_encoder_layers=2, scan_layers=True, positions="learned",
                               norm_position="pre")


@pytest.mark.parametrize("cfg", [CFG, CFG_SCAN], ids=["unscanned", "scanned-learned-preln"])
def test_incremental_decoding_equals_teacher_forcing(cfg):
    """Fed one token at a time through the KV caches, the decoder gives at every step the
    logits of the full teacher-forced forward at that position."""
    params = _cached_params(cfg)
    full = np.asarray(_logits(cfg, params))  # (B, T, V)
    decoder = tr.translation_decoder(tr.EncoderDecoder(cfg), params, SRC, max_len=T)
    assert decoder.max_len == T
    step = jax.jit(decoder.step)
    state = decoder.state
    for t in range(T):
        logits, state = step(decoder.params, TGT_IN[:, t: t + 1], state)
        assert_close(logits, full[:, t], 1e-5, err_msg=f"t={t}")


# ---------------------------------------------------------------------------------------------
# Embedding sharing


def _param_count(tree):
    return sum(x.size for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("mode, vs, vt, tables", [
    ("all", V, V, {"shared_embedding": (V, D)}),
    ("target", 24, V, {"source_embedding": (24, D), "target_embedding": (V, D)}),
    ("none", 24, 40, {"source_embedding": (24, D), "target_embedding": (40, D),
                      "output_projection": (D, 40)}),
])
def test_share_embeddings_has_exactly_the_claimed_matrices(mode, vs, vt, tables):
    cfg = dataclasses.replace(CFG, vocab_size=None, source_vocab_size=vs, target_vocab_size=vt,
                              share_embeddings=mode)
    model = tr.EncoderDecoder(cfg)
    boxed = jax.eval_shape(model.init, jax.random.key(0), SRC, TGT_IN)["params"]
    # Every parameter names a logical axis for each of its dims (the sharding rules need it).
    leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    assert all(isinstance(x, nn.LogicallyPartitioned) and len(x.names) == x.value.ndim
               for x in leaves)
    params = nn.unbox(boxed)
    assert set(params) == {"encoder", "decoder", *tables}
    assert {k: jax.tree.leaves(params[k])[0].shape for k in tables} == tables
    assert all(len(jax.tree.leaves(params[k])) == 1 for k in tables)  # no output bias
    # Everything else is the same two stacks in every mode.
    stacks = _param_count({k: params[k] for k in ("encoder", "decoder")})
    assert _param_count(params) == stacks + sum(math.prod(s) for s in tables.values())
    assert jax.eval_shape(model.apply, {"params": params}, SRC, TGT_IN).shape == (B, T, vt)


@functools.cache
def _loss_and_grad(cfg):
    """jit params -> ((cross-entropy of the next target tokens, logits), gradient)."""
    labels = np.concatenate([TGT_IN[:, 1:], np.full((B, 1), EOS)], 1)

    def loss(params):
        logits = tr.EncoderDecoder(cfg).apply({"params": params}, SRC, TGT_IN)
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, labels[..., None], -1).sum(), logits

    return jax.jit(jax.value_and_grad(loss, has_aux=True))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["all", "target"])
def test_tied_matrix_serves_each_role_and_gets_every_roles_gradient(mode):
    """A tied model equals the untied ('none') model holding copies of the tied matrix in each
    role it claims (the same logits), and the tied matrix's gradient is the sum of the copies'
    gradients, each of them nonzero: gradient flows into it from every side it serves."""
    # One layer each: what is tied does not depend on depth, and compiling is the cost here.
    cfg = dataclasses.replace(CFG, share_embeddings=mode, num_decoder_layers=1)
    free_cfg = dataclasses.replace(cfg, share_embeddings="none")
    tied = _params(cfg, seed=3)
    name = "shared_embedding" if mode == "all" else "target_embedding"
    table = tied[name]["embedding"]  # (V, D)
    source = table if mode == "all" else tied["source_embedding"]["embedding"]
    free = {"encoder": tied["encoder"], "decoder": tied["decoder"],
            "source_embedding": {"embedding": source},
            "target_embedding": {"embedding": table},
            "output_projection": {"kernel": table.T}}
    (_, tied_logits), g_tied = _loss_and_grad(cfg)(tied)
    (_, free_logits), g_free = _loss_and_grad(free_cfg)(free)
    assert_close(tied_logits, free_logits, 1e-6, err_msg="logits")
    roles = [g_free["target_embedding"]["embedding"], g_free["output_projection"]["kernel"].T]
    if mode == "all":
        roles.append(g_free["source_embedding"]["embedding"])
    else:  # the separate source table is exactly the untied model's source table
        assert_close(g_tied["source_embedding"]["embedding"],
                     g_free["source_embedding"]["embedding"], 1e-5, err_msg="source gradient")
    assert all(np.abs(np.asarray(g)).max() > 1e-3 for g in roles)
    assert_close(g_tied[name]["embedding"], sum(roles), 1e-5, err_msg=f"{name} gradient")


def test_embeddings_are_scaled_by_sqrt_d_and_get_the_papers_sinusoids():
    """What enters each stack is E[ids] sqrt(d_model) + P (float64 reference), P interleaving
    sin and cos as section 3.5."""
    params = _cached_params(CFG)
    _, state = _inspect(CFG)(params)
    table = np.asarray(params["shared_embedding"]["embedding"], np.float64)
    for name, ids in (("source_positions", SRC), ("target_positions", TGT_IN)):
        got = state["intermediates"][name]["__call__"][0]
        want = table[ids] * math.sqrt(D) + _sinusoid64(ids.shape[1], D)[None]
        assert_close(got, want, 1e-5, err_msg=name)


# ---------------------------------------------------------------------------------------------
# Translation



@functools.cache
def _decode_params():
    """Seed 20 with the EOS embedding doubled (a likelier EOS): greedily, row 1 of SRC finishes
    with EOS after 5 tokens while row 0 runs to the length limit (checked below)."""
    params = _params(CFG, seed=20)
    table = params["shared_embedding"]["embedding"]
    return {**params, "shared_embedding": {"embedding": table.at[EOS].multiply(2.0)}}


def _reference_greedy(cfg, params, src, max_out):
    """Argmax loop over the full (teacher-forced) forward, float64 log-probabilities. The buffer
    has a fixed width: by causality the columns after t cannot change the logits at t."""
    buf = np.full((src.shape[0], T), PAD, np.int32)
    buf[:, 0] = BOS
    done = np.zeros(src.shape[0], bool)
    logp_sum = np.zeros(src.shape[0])
    for t in range(max_out):
        logp = _log_softmax64(_logits(cfg, params, src, buf)[:, t])
        choice = logp.argmax(-1)
        buf[:, t + 1] = np.where(done, PAD, choice)
        logp_sum += np.where(done, 0.0, logp[np.arange(len(choice)), choice])
        done |= choice == EOS
    return buf[:, 1: max_out + 1], logp_sum


def test_greedy_translation_equals_an_argmax_loop_over_the_full_forward():
    params = _decode_params()
    out = tr.translate(tr.EncoderDecoder(CFG), params, SRC)
    max_out = T - 1  # 1.0 * 5 + 50 allowed, capped so that BOS + output fits max_len = T
    assert out.tokens.shape == (B, max_out)
    want, logp = _reference_greedy(CFG, params, SRC, max_out)
    np.testing.assert_array_equal(out.tokens, want)
    # The test needs one row that stops at EOS and one that hits the length limit.
    lengths = [next((i + 1 for i, x in enumerate(row) if x == EOS), max_out) for row in want]
    assert lengths[1] < max_out and EOS not in want[0], want
    np.testing.assert_array_equal(out.lengths, lengths)
    assert_close(out.scores, logp, 1e-5, err_msg="scores")


def test_beam_search_with_one_beam_is_greedy():
    params = _decode_params()
    model = tr.EncoderDecoder(CFG)
    greedy = tr.translate(model, params, SRC)
    beam = tr.translate(model, params, SRC, method="beam", beam_size=1, alpha=0.0)
    np.testing.assert_array_equal(beam.tokens, greedy.tokens)
    np.testing.assert_array_equal(beam.lengths, greedy.lengths)
    assert_close(beam.scores, greedy.scores, 1e-5, err_msg="scores")


def test_output_length_is_a_times_the_longest_source_plus_b_capped_by_max_len():
    cfg = dataclasses.replace(CFG, max_len=64)
    # BOS + int(a * 5 + b): the longest real source has 5 tokens, padding does not count.
    assert tr.translation_max_len(cfg, np.pad(SRC, ((0, 0), (0, 4))), 1.0, 10) == 1 + 15
    assert tr.translation_max_len(cfg, SRC[1:], 1.0, 10) == 1 + 13
    assert tr.translation_max_len(cfg, SRC, 1.5, 2) == 1 + 9
    assert tr.translation_max_len(cfg, SRC, 1.0, 100) == 64
    with pytest.raises(ValueError, match="max_len_b"):
        tr.translation_max_len(cfg, SRC, 0.0, 0)


def test_beam_search_keeps_each_sentence_with_its_own_encoder_output():
    """Beams tile and reorder the encoder output with the caches: swapping the sentences swaps
    the results, and every returned hypothesis has the score the full forward gives it."""
    params = _decode_params()
    model, k, alpha = tr.EncoderDecoder(CFG), 3, 0.6

    def beams(src):
        return decoding.beam_search(tr.translation_decoder(model, params, src, max_len=T),
                                    np.full((B, 1), BOS, np.int32), beam_size=k, max_len=T,
                                    alpha=alpha)

    out, swapped = beams(SRC), beams(SRC[::-1])
    np.testing.assert_array_equal(out.tokens, swapped.tokens[::-1])
    assert_close(out.scores, swapped.scores[::-1], 1e-5, err_msg="scores")
    assert not np.array_equal(out.tokens[0], out.tokens[1])  # else the swap proves nothing
    for j in range(k):  # rescore beam j of both rows with the full forward
        seqs, n = np.asarray(out.tokens[:, j]), np.asarray(out.lengths[:, j])
        buf = np.where(np.arange(T)[None] < n[:, None], seqs, PAD).astype(np.int32)
        logp = _log_softmax64(_logits(CFG, params, SRC, buf))  # (B, T, V)
        for b in range(B):
            total = sum(logp[b, i - 1, seqs[b, i]] for i in range(1, n[b]))
            # A sum of log-probabilities of one sign: the score's own size is its scale.
            assert_close(out.scores[b, j], total / (n[b] - 1) ** alpha, 1e-5,
                         err_msg=f"row {b}, beam {j}")


# ---------------------------------------------------------------------------------------------
# jit, mesh, attention maps


def test_jit_equals_no_jit():
    params = _cached_params(CFG)
    eager = tr.EncoderDecoder(CFG).apply({"params": params}, SRC, TGT_IN)
    # Equal up to float32 reassociation in XLA's fused kernels.
    assert_close(eager, _logits(CFG, params), 1e-5)


def test_dropout_only_in_training_and_driven_by_the_rng():
    cfg = dataclasses.replace(CFG, dropout_rate=0.3)
    params = _cached_params(CFG)

    @jax.jit
    def run(rng):
        model = tr.EncoderDecoder(cfg)
        stochastic = model.apply({"params": params}, SRC, TGT_IN, deterministic=False,
                                 rngs={"dropout": rng})
        return model.apply({"params": params}, SRC, TGT_IN), stochastic

    evaluation, train_a = run(jax.random.key(1))
    _, train_a_again = run(jax.random.key(1))
    _, train_b = run(jax.random.key(2))
    assert_close(evaluation, _logits(CFG, params), 1e-5)
    np.testing.assert_array_equal(train_a, train_a_again)
    assert (np.abs(np.asarray(train_a - evaluation)).max(-1) > 1e-3).all()  # every position
    assert np.abs(np.asarray(train_a - train_b)).max() > 1e-3


@pytest.mark.slow
def test_sharded_over_a_2x4_mesh_equals_single_device():
    """data 2 x tensor 4: the batch split in two, vocabulary, heads and feed-forward in four."""
    rules = partitioning.DEFAULT_RULES
    mesh = partitioning.make_mesh(data=2, fsdp=1, tensor=4)
    model = tr.EncoderDecoder(CFG)
    variables, shardings = partitioning.sharded_init(model.init, mesh, rules, jax.random.key(0),
                                                     SRC, TGT_IN)
    params = variables["params"]
    assert shardings["params"]["shared_embedding"]["embedding"].spec[0] == "tensor"
    query = shardings["params"]["decoder"]["layer_1"]["cross_attention"]["query"]["kernel"]
    assert query.spec[1] == "tensor"
    assert len({str(s.index) for s in params["shared_embedding"]["embedding"]
                .addressable_shards}) == 4
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        got = jax.jit(model.apply)({"params": params}, SRC, TGT_IN)
    assert got.sharding.spec[0] is not None  # the batch really was split
    single = jax.device_put(jax.device_get(params), jax.devices()[0])
    assert_close(got, _logits(CFG, single), 1e-5)


@pytest.mark.parametrize("cfg", [CFG, CFG_SCAN], ids=["unscanned", "scanned"])
def test_attention_weights_per_layer_and_head(cfg):
    params = _cached_params(cfg)
    logits, state = _inspect(cfg)(params)
    assert_close(logits, _logits(cfg, params), 1e-5)
    maps = {k: np.asarray(v) for k, v in tr.attention_weights(state["intermediates"]).items()}
    h, le, ld = cfg.num_heads, cfg.num_encoder_layers, cfg.num_decoder_layers
    assert maps["encoder_self"].shape == (le, B, h, S, S)
    assert maps["decoder_self"].shape == (ld, B, h, T, T)
    assert maps["cross"].shape == (ld, B, h, T, S)
    real = SRC != PAD  # (B, S)
    # Real source queries spread over real source keys only; padding queries attend nowhere.
    enc = maps["encoder_self"]
    np.testing.assert_allclose(enc.sum(-1), np.broadcast_to(real[None, :, None], enc.shape[:-1]),
                               atol=1e-6)
    assert (enc[:, 1][..., ~real[1]] == 0).all()
    # Causal: zero above the diagonal, positive on and below it.
    dec = maps["decoder_self"]
    upper = np.triu(np.ones((T, T), bool), 1)
    assert (dec[..., upper] == 0).all() and (dec[..., ~upper] > 0).all()
    np.testing.assert_allclose(dec.sum(-1), 1.0, atol=1e-6)
    # Every target query over the real source keys.
    cross = maps["cross"]
    np.testing.assert_allclose(cross.sum(-1), 1.0, atol=1e-6)
    assert (cross[:, 1][..., ~real[1]] == 0).all() and (cross[:, 1][..., real[1]] > 0).all()


# ---------------------------------------------------------------------------------------------
# Configs, sizes, FLOPs


@pytest.mark.parametrize("kwargs, match", [
    (dict(), "vocab_size"),
    (dict(source_vocab_size=20, target_vocab_size=30), "share_embeddings='all'"),
    (dict(vocab_size=30, share_embeddings="source"), "share_embeddings"),
    (dict(vocab_size=30, positions="rotary"), "positions"),
    (dict(vocab_size=30, hidden_size=30, num_heads=4), "divisible"),
    (dict(vocab_size=30, eos_id=30), "eos_id"),
])
def test_bad_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tr.TransformerConfig(**kwargs)


def test_bad_arguments_raise():
    model, params = tr.EncoderDecoder(CFG), _cached_params(CFG)
    with pytest.raises(ValueError, match="unknown Transformer size"):
        tr.config_for_size("huge", vocab_size=10)
    with pytest.raises(ValueError, match="method"):
        tr.translate(model, params, SRC, method="sample")
    with pytest.raises(ValueError, match="source_ids"):
        tr.translate(model, params, SRC.astype(np.float32))
    with pytest.raises(ValueError, match="max_len"):
        tr.translation_decoder(model, params, SRC, max_len=1)


@pytest.mark.parametrize("size, paper_millions", [("base", 65), ("big", 213)])
def test_sizes_have_the_papers_parameter_counts(size, paper_millions):
    """Table 3 of the paper with its shared ~37000-token BPE vocabulary (within 4%: the exact
    vocabulary size is not given)."""
    cfg = tr.config_for_size(size, vocab_size=37000)
    shapes = jax.eval_shape(tr.EncoderDecoder(cfg).init, jax.random.key(0),
                            jnp.zeros((1, 4), jnp.int32), jnp.zeros((1, 4), jnp.int32))
    count = _param_count(nn.unbox(shapes["params"])) / 1e6
    assert abs(count - paper_millions) / paper_millions < 0.04, count
    assert tr.config_for_size("big", vocab_size=8).dropout_rate == 0.3


def test_flops_per_token_counts_every_matmul_kernel():
    """6 x (MACs of every kernel applied to the tokens it sees) + attention, from the real
    parameter shapes: each kernel of the encoder acts on S tokens, of the decoder on T tokens
    except the cross-attention keys/values (on S), the output projection on T."""
    s, t = 7, 5
    cfg = CFG_NONE  # an untied output projection is a kernel of its own
    params = nn.unbox(jax.eval_shape(tr.EncoderDecoder(cfg).init, jax.random.key(0), SRC,
                                     TGT_IN)["params"])
    macs = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        keys = [p.key for p in path]
        if keys[-1] != "kernel":
            continue
        on_source = keys[0] == "encoder" or ("cross_attention" in keys
                                             and keys[-2] in ("key", "value"))
        macs += leaf.size * (s if on_source else t)
    d, le, ld = D, cfg.num_encoder_layers, cfg.num_decoder_layers
    macs += 2 * d * (le * s * s + ld * (t * t / 2 + t * s))  # q.k and weights.v per pair
    np.testing.assert_allclose(tr.flops_per_token(cfg, s, t), 6 * macs / (s + t), rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# Learning


@pytest.mark.slow
def test_learns_to_reverse_twenty_sequences():
    """From scratch, 100 full-batch Adam steps take the token cross-entropy on 20 random
    sequences (3-6 tokens from 12 symbols) and their reversals below 0.05 nats (it starts near
    ln 16 = 2.8), and greedy translation then reverses all 20 exactly."""
    rng = np.random.default_rng(0)
    n, width, vocab = 20, 6, 16
    src = np.zeros((n, width), np.int32)
    tgt_in = np.zeros((n, width + 1), np.int32)
    labels = np.zeros((n, width + 1), np.int32)
    for i in range(n):
        seq = rng.integers(4, vocab, rng.integers(3, width + 1))
        src[i, : len(seq)] = seq
        tgt_in[i, 0], tgt_in[i, 1: len(seq) + 1] = BOS, seq[::-1]
        labels[i, : len(seq)], labels[i, len(seq)] = seq[::-1], EOS
    weights = (np.arange(width + 1)[None] <= (src != PAD).sum(1)[:, None]).astype(np.float32)
    cfg = tr.TransformerConfig(vocab_size=vocab, hidden_size=32, num_encoder_layers=1,
                               num_decoder_layers=1, num_heads=4, mlp_dim=64, dropout_rate=0.0,
                               max_len=16)
    model = tr.EncoderDecoder(cfg)
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), src, tgt_in)["params"])
    opt = optax.adam(3e-3)

    def loss_fn(p):
        logits = model.apply({"params": p}, src, tgt_in)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        return (ce * weights).sum() / weights.sum()

    @jax.jit
    def train(p):
        def step(carry, _):
            p, opt_state = carry
            loss, grads = jax.value_and_grad(loss_fn)(p)
            updates, opt_state = opt.update(grads, opt_state, p)
            return (optax.apply_updates(p, updates), opt_state), loss

        (p, _), losses = jax.lax.scan(step, (p, opt.init(p)), length=100)
        return p, losses

    params, losses = train(params)
    assert losses[0] > 2.0 and losses[-1] < 0.05, (losses[0], losses[-1])
    out = tr.translate(model, params, src, max_len_a=1.0, max_len_b=1)
    for i in range(n):
        np.testing.assert_array_equal(out.tokens[i, : out.lengths[i]], labels[i][weights[i] > 0])
