"""BERT model: shapes and names, the MLM head against a float64 reference at gathered positions,
padding isolation, the pooler, the tied decoder, scan == unscanned, bf16 compute, FLOP count."""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.models import bert
from zoo.train import partitioning

B, T, P = 2, 6, 3
CONFIG = bert.BertConfig(
    vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
    max_position_embeddings=16, type_vocab_size=2,
)
IDS = np.array([[2, 7, 9, 3, 11, 4], [2, 5, 8, 6, 0, 0]], np.int32)  # row 1: 2 pads
TYPES = np.array([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 0, 0]], np.int32)
MASK = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], np.int32)
# Different positions per row (and out of order), so a gather that ignores the batch index or
# the order fails.
POSITIONS = np.array([[4, 1, 2], [3, 0, 1]], np.int32)


def _perturbed_params(config, seed=0):
    """Init params plus N(0, 0.1^2) everywhere: zero biases and unit LayerNorm gains at init
    would hide a wrongly used bias or gain."""
    init = jax.jit(bert.BertForPreTraining(config).init)
    params = nn.unbox(init(jax.random.key(seed), IDS, TYPES, MASK, POSITIONS)["params"])
    leaves, treedef = jax.tree.flatten(params)
    rng = np.random.default_rng(seed)
    leaves = [np.asarray(x) + rng.normal(0, 0.1, x.shape).astype(x.dtype) for x in leaves]
    return jax.tree.unflatten(treedef, leaves)


@pytest.fixture(scope="module")
def params():
    return _perturbed_params(CONFIG)


def _pretraining(config):
    return jax.jit(lambda p, ids, types, mask, pos: bert.BertForPreTraining(config).apply(
        {"params": p}, ids, types, mask, pos))


def _encoder(config):
    return jax.jit(lambda p, ids, types, mask: bert.BertModel(config).apply(
        {"params": p}, ids, types, mask))


pretraining = _pretraining(CONFIG)
encoder = _encoder(CONFIG)


def _f64(x):
    return np.asarray(x, np.float64)


def _np_mlm_head(params, sequence_output):
    """float64 numpy MLM head over every position: (transformed hidden [B, T, H], logits
    [B, T, V]); decoder = the word embedding table, transposed."""
    head = params["predictions"]
    h = _f64(sequence_output) @ _f64(head["transform"]["kernel"]) + _f64(head["transform"]["bias"])
    h = 0.5 * h * (1.0 + np.vectorize(math.erf)(h / math.sqrt(2.0)))  # exact GELU
    mean = h.mean(-1, keepdims=True)
    var = ((h - mean) ** 2).mean(-1, keepdims=True)
    h = (h - mean) / np.sqrt(var + 1e-12)
    h = h * _f64(head["transform_norm"]["scale"]) + _f64(head["transform_norm"]["bias"])
    table = _f64(params["bert"]["embeddings"]["word_embeddings"]["embedding"])
    return h, h @ table.T + _f64(head["output_bias"])


def test_shapes_dtypes_and_parameter_names(params):
    seq, pooled = encoder(params["bert"], IDS, TYPES, MASK)
    mlm, nsp = pretraining(params, IDS, TYPES, MASK, POSITIONS)
    assert seq.shape == (B, T, 16) and pooled.shape == (B, 16)
    assert mlm.shape == (B, P, 50) and nsp.shape == (B, 2)
    assert mlm.dtype == nsp.dtype == jnp.float32
    # The names zoo.convert.bert's rename table relies on.
    assert set(params) == {"bert", "predictions", "seq_relationship"}
    assert set(params["bert"]) == {"embeddings", "encoder", "pooler"}
    assert set(params["bert"]["embeddings"]) == {
        "word_embeddings", "token_type_embeddings", "position_embeddings", "norm"}
    assert set(params["bert"]["encoder"]) == {"layer_0", "layer_1"}
    assert set(params["predictions"]) == {"transform", "transform_norm", "output_bias"}
    assert params["seq_relationship"]["kernel"].shape == (16, 2)


def test_sharded_over_a_mesh_matches_single_device(params):
    """Every parameter names its logical axes, the default rules place them on a
    (data 2, fsdp 2, tensor 2) mesh, and the sharded forward equals the unsharded one."""
    boxed = jax.eval_shape(bert.BertForPreTraining(CONFIG).init, jax.random.key(0), IDS, TYPES,
                           MASK, POSITIONS)["params"]
    leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    assert leaves and all(isinstance(x, nn.LogicallyPartitioned) for x in leaves)
    assert all(len(x.names) == x.value.ndim for x in leaves)
    mesh = partitioning.make_mesh(data=2, fsdp=2, tensor=2)
    shardings = nn.unbox(partitioning.logical_sharding(boxed, mesh, partitioning.DEFAULT_RULES))
    kernel = shardings["bert"]["encoder"]["layer_0"]["mlp"]["wi"]["kernel"]
    assert kernel.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
    sharded = jax.device_put(params, shardings)
    with jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.DEFAULT_RULES):
        got = _pretraining(CONFIG)(sharded, IDS[[0, 1, 0, 1]], TYPES[[0, 1, 0, 1]],
                                   MASK[[0, 1, 0, 1]], POSITIONS[[0, 1, 0, 1]])
    for a, b in zip(got, pretraining(params, IDS, TYPES, MASK, POSITIONS)):
        assert_close(np.asarray(a)[:B], b, 1e-5)


def test_mlm_logits_at_gathered_positions_match_a_float64_full_sequence_head(params):
    """Head over every position in float64, gathered afterwards == ours gathered first."""
    seq, _ = encoder(params["bert"], IDS, TYPES, MASK)
    _, full = _np_mlm_head(params, seq)  # (B, T, V)
    mlm, _ = pretraining(params, IDS, TYPES, MASK, POSITIONS)
    want = full[np.arange(B)[:, None], POSITIONS]  # (B, P, V)
    assert_close(mlm, want, 1e-5)
    # Asking for every position gives the whole full-sequence head, row by row.
    every = np.broadcast_to(np.arange(T, dtype=np.int32), (B, T))
    mlm_all, _ = _pretraining(CONFIG)(params, IDS, TYPES, MASK, every)
    assert_close(mlm_all, full, 1e-5)


def test_padding_does_not_influence_real_tokens(params):
    pad = MASK == 0
    ids2 = np.where(pad, 17, IDS).astype(np.int32)
    types2 = np.where(pad, 1, TYPES).astype(np.int32)
    seq, pooled = encoder(params["bert"], IDS, TYPES, MASK)
    seq2, pooled2 = encoder(params["bert"], ids2, types2, MASK.astype(bool))  # bool == int
    real = ~pad
    assert_close(seq2[real], seq[real], 1e-6)
    assert_close(pooled2, pooled, 1e-6)
    assert np.abs(np.asarray(seq2)[pad] - np.asarray(seq)[pad]).max() > 1e-2  # inputs did change
    # The heads read only real positions (POSITIONS avoid row 1's pads at 4, 5).
    for a, b in zip(pretraining(params, IDS, TYPES, MASK, POSITIONS),
                    pretraining(params, ids2, types2, MASK, POSITIONS)):
        assert_close(a, b, 1e-5)
    # Without the mask the same change does reach the real tokens: the mask is what isolates.
    no_mask = np.ones_like(MASK)
    seq3, _ = encoder(params["bert"], IDS, TYPES, no_mask)
    seq4, _ = encoder(params["bert"], ids2, types2, no_mask)
    assert np.abs(np.asarray(seq4)[real] - np.asarray(seq3)[real]).max() > 1e-3


def test_pooled_output_is_tanh_of_dense_over_cls(params):
    seq, pooled = encoder(params["bert"], IDS, TYPES, MASK)
    dense = params["bert"]["pooler"]["dense"]
    want = np.tanh(_f64(seq)[:, 0] @ _f64(dense["kernel"]) + _f64(dense["bias"]))
    assert_close(pooled, want, 1e-5)


def test_mlm_decoder_is_the_word_embedding_table(params):
    """No decoder matrix of its own, and the MLM loss's gradient reaches the word embedding rows
    of tokens absent from the input exactly as d/dE sum(C * h E^T) = C^T h."""
    vocab_by_hidden = [x for x in jax.tree.leaves(params) if x.shape == (50, 16)]
    assert len(vocab_by_hidden) == 1
    c = np.random.default_rng(1).normal(size=(B, P, 50))

    def loss(p):
        mlm, _ = bert.BertForPreTraining(CONFIG).apply({"params": p}, IDS, TYPES, MASK, POSITIONS)
        return jnp.sum(mlm * c)

    grad = jax.jit(jax.grad(loss))(params)["bert"]["embeddings"]["word_embeddings"]["embedding"]
    seq, _ = encoder(params["bert"], IDS, TYPES, MASK)
    h, _ = _np_mlm_head(params, seq)
    h = h[np.arange(B)[:, None], POSITIONS]  # (B, P, H)
    unused = np.setdiff1d(np.arange(50), IDS)  # rows reached only through the decoder
    want = np.einsum("bpv,bph->vh", c, h)[unused]
    assert_close(np.asarray(grad)[unused], want, 1e-4)
    assert np.abs(want).max() > 0.1


def test_scanned_layers_match_unscanned_with_restacked_params(params):
    scanned_config = dataclasses.replace(CONFIG, scan_layers=True)
    enc = params["bert"]["encoder"]
    stacked = jax.tree.map(lambda *xs: np.stack(xs), enc["layer_0"], enc["layer_1"])
    scanned = {**params, "bert": {**params["bert"], "encoder": {"layers": stacked}}}
    # The restacked tree is exactly what the scanned model initialises.
    init = jax.eval_shape(bert.BertForPreTraining(scanned_config).init, jax.random.key(0), IDS,
                          TYPES, MASK, POSITIONS)["params"]
    assert (jax.tree.map(lambda x: x.shape, nn.unbox(init))
            == jax.tree.map(lambda x: x.shape, scanned))
    for a, b in zip(_pretraining(scanned_config)(scanned, IDS, TYPES, MASK, POSITIONS),
                    pretraining(params, IDS, TYPES, MASK, POSITIONS)):
        assert_close(a, b, 1e-5)


def test_bfloat16_compute_keeps_float32_params_and_logits(params):
    config = dataclasses.replace(CONFIG, dtype="bfloat16")
    boxed = jax.eval_shape(bert.BertForPreTraining(config).init, jax.random.key(0), IDS, TYPES,
                           MASK, POSITIONS)["params"]
    assert {x.dtype for x in jax.tree.leaves(nn.unbox(boxed))} == {jnp.dtype(jnp.float32)}
    seq, _ = _encoder(config)(params["bert"], IDS, TYPES, MASK)
    assert seq.dtype == jnp.bfloat16
    mlm, nsp = _pretraining(config)(params, IDS, TYPES, MASK, POSITIONS)
    assert mlm.dtype == nsp.dtype == jnp.float32
    ref_mlm, ref_nsp = pretraining(params, IDS, TYPES, MASK, POSITIONS)
    # bf16 keeps ~3 significant digits; through 2 layers the logits stay within a few %.
    assert_close(mlm, ref_mlm, 0.05)
    assert_close(nsp, ref_nsp, 0.05)


def test_dropout_is_active_only_when_not_deterministic(params):
    @jax.jit
    def train(rng):
        return bert.BertForPreTraining(CONFIG).apply(
            {"params": params}, IDS, TYPES, MASK, POSITIONS, deterministic=False,
            rngs={"dropout": rng})[0]

    a, b = train(jax.random.key(1)), train(jax.random.key(2))
    assert np.abs(np.asarray(a) - np.asarray(b)).max() > 1e-3
    np.testing.assert_array_equal(train(jax.random.key(1)), a)  # the rng alone decides
    # deterministic=True (every other test) is dropout-free: it differs from a dropout sample.
    clean, _ = pretraining(params, IDS, TYPES, MASK, POSITIONS)
    assert np.abs(np.asarray(a) - np.asarray(clean)).max() > 1e-3


def test_flops_per_token_hand_count():
    """CONFIG (H 16, F 32, L 2, V 50) at T 8, P 2, counted by hand:
    encoder weights per layer: q, k, v, out 4 * 16 * 16 = 1024, FFN 2 * 16 * 32 = 1024 -> 2048;
    two layers 4096; x6 = 24576. Attention 12 * L * T * H = 12 * 2 * 8 * 16 = 3072.
    MLM head 6 * (16 * 16 + 16 * 50) * P / T = 6 * 1056 * 2 / 8 = 1584. Total 29232."""
    assert bert.flops_per_token(CONFIG, seq_len=8, num_predictions=2) == 29232
    # Each prediction adds the head once per sequence: 6 * 1056 / T.
    assert (bert.flops_per_token(CONFIG, 8, 3) - bert.flops_per_token(CONFIG, 8, 2)
            == pytest.approx(6 * 1056 / 8))
    with pytest.raises(ValueError, match="seq_len"):
        bert.flops_per_token(CONFIG, 0, 2)


def test_config_for_size():
    tiny = bert.config_for_size("tiny", vocab_size=100)
    assert tiny.num_layers == 2 and tiny.hidden_size <= 64
    base = bert.config_for_size("base", vocab_size=30522)
    assert (base.num_layers, base.hidden_size, base.num_heads, base.intermediate_size) == (
        12, 768, 12, 3072)
    large = bert.config_for_size("large", vocab_size=30522, scan_layers=True)
    assert (large.num_layers, large.hidden_size, large.num_heads, large.intermediate_size,
            large.scan_layers) == (24, 1024, 16, 4096, True)
    for size, (layers, heads, hidden) in bert.SIZES.items():
        cfg = bert.config_for_size(size, vocab_size=10)
        assert cfg.intermediate_size == 4 * hidden and cfg.hidden_size % cfg.num_heads == 0
    with pytest.raises(ValueError, match="unknown BERT size 'huge'"):
        bert.config_for_size("huge", vocab_size=10)
    with pytest.raises(ValueError, match="vocab_size"):
        bert.config_for_size("tiny")
    with pytest.raises(ValueError, match="not divisible by num_heads=3"):
        bert.config_for_size("tiny", vocab_size=10, num_heads=3)


def test_bad_inputs_are_refused(params):
    model = bert.BertModel(CONFIG)
    with pytest.raises(ValueError, match="additive float masks"):
        model.apply({"params": params["bert"]}, IDS, TYPES, MASK.astype(np.float32))
    with pytest.raises(ValueError, match=r"attention_mask must be \[batch, len\]"):
        model.apply({"params": params["bert"]}, IDS, TYPES, MASK[:, None, None, :])
    with pytest.raises(ValueError, match="masked_positions must be int"):
        bert.BertForPreTraining(CONFIG).apply(
            {"params": params}, IDS, TYPES, MASK, POSITIONS.astype(np.float32))
