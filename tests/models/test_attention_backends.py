"""BERT, GPT and the Transformer select the blockwise backend (and a local window) by config and
give the einsum backend's logits and gradients; a windowed GPT decodes through its KV cache as
its full forward computes."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close, assert_params_close
from zoo.models import bert, gpt
from zoo.models import encoder_decoder as tr

T = 24
BLOCK = 8  # three blocks per sequence, so the block loops and skipping really run
IDS = np.random.default_rng(0).integers(5, 60, size=(2, T)).astype(np.int32)
VALID = np.arange(T)[None, :] < np.array([[T], [17]])  # row 1: 7 padding tokens
SEGMENTS = np.array([[1] * 9 + [2] * 10 + [3] * 5, [1] * 14 + [2] * 3 + [0] * 7], np.int32)


def _init(model, *args, **kw):
    return nn.unbox(jax.jit(model.init)(jax.random.key(0), *args, **kw))["params"]


def _close(a, b, what):
    # Two float32 orders of the same sums: within a few roundings of each tensor's largest value
    # (a gradient leaf holds entries up to ~40 beside entries near 0).
    assert_close(a, b, 2e-5, err_msg=what)


def _bert(backend, window=0):
    return bert.BertConfig(vocab_size=64, hidden_size=16, num_layers=2, num_heads=2,
                           intermediate_size=32, max_position_embeddings=T, dropout_rate=0.0,
                           attention_dropout_rate=0.0, backend=backend, attention_block=BLOCK,
                           attention_window=window)


@pytest.mark.slow
@pytest.mark.parametrize("window", [0, 5])
def test_bert_blockwise_equals_einsum_outputs_and_gradients(window):
    types = np.zeros_like(IDS)
    mask = VALID.astype(np.int32)
    einsum = bert.BertModel(_bert("einsum", window))
    params = _init(einsum, IDS, types, mask)

    def loss(config, p):
        seq, pooled = bert.BertModel(config).apply({"params": p}, IDS, types, mask)
        return jnp.sum(jnp.where(VALID[..., None], seq, 0.0) ** 2) + jnp.sum(pooled), seq

    grads = {}
    for backend in ("einsum", "blockwise"):
        (_, seq), grads[backend] = jax.jit(
            jax.value_and_grad(lambda p: loss(_bert(backend, window), p), has_aux=True))(params)
        if backend == "einsum":
            want = seq
    _close(seq, want, "sequence output")
    assert_params_close(grads["blockwise"], grads["einsum"], 2e-5, err_msg="gradient")


def test_bert_window_limits_what_a_token_sees():
    """With attention_window=w, the output at position i does not depend on tokens further
    than w * layers away (two layers here), and it does depend on nearer ones."""
    config = _bert("blockwise", window=2)
    model = bert.BertModel(config)
    params = _init(model, IDS)
    ids = IDS[:1]
    encode = jax.jit(lambda ids: model.apply({"params": params}, ids)[0])  # one compile

    def out_at(i, changed_position):
        other = ids.copy()
        other[0, changed_position] = (other[0, changed_position] + 7) % 60 + 5
        return float(jnp.max(jnp.abs(encode(ids)[0, i] - encode(other)[0, i])))

    assert out_at(10, 15) == 0.0  # 5 tokens away > 2 x 2
    assert out_at(10, 14) > 0.0  # 4 tokens away: reached in two layers


def _gpt(backend, window=0):
    return gpt.GPTConfig(vocab_size=64, max_len=T, num_layers=2, num_heads=2, embed_dim=16,
                         mlp_dim=32, dropout_rate=0.0, attention_dropout_rate=0.0,
                         backend=backend, attention_block=BLOCK, attention_window=window)


@pytest.mark.parametrize("window", [0, 6])
def test_gpt_blockwise_equals_einsum_with_packed_documents(window):
    params = _init(gpt.GPT(_gpt("einsum", window)), IDS)
    logits = {}
    for backend in ("einsum", "blockwise"):
        model = gpt.GPT(_gpt(backend, window))
        logits[backend] = jax.jit(lambda p: model.apply({"params": p}, IDS,
                                                        segment_ids=SEGMENTS))(params)
    _close(logits["blockwise"], logits["einsum"], "logits")
    real = SEGMENTS != 0
    assert np.all(np.isfinite(np.asarray(logits["blockwise"])[real]))


@pytest.mark.slow
def test_windowed_gpt_decodes_through_its_cache_as_its_full_forward():
    config = _gpt("einsum", window=4)
    params = _init(gpt.GPT(config), IDS)
    full = jax.jit(gpt.GPT(config).apply)({"params": params}, IDS)
    decoder = gpt.GPT(config, decode=True)
    cache = jax.jit(decoder.init)(jax.random.key(0), IDS)["cache"]
    step = jax.jit(lambda p, tok, c: decoder.apply({"params": p, "cache": c}, tok,
                                                   mutable=["cache"]))
    for t in range(T):
        logits, mutated = step(params, IDS[:, t:t + 1], cache)
        cache = mutated["cache"]
        _close(logits[:, 0], full[:, t], f"step {t}")
    unwindowed = gpt.GPT(dataclasses.replace(config, attention_window=0)).apply(
        {"params": params}, IDS)
    assert not np.allclose(np.asarray(unwindowed[:, -1]), np.asarray(full[:, -1]), atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("window", [0, 3])
def test_transformer_blockwise_equals_einsum(window):
    def config(backend):
        return tr.config_for_size("tiny", vocab_size=64, hidden_size=16, num_heads=2,
                                  mlp_dim=32, max_len=T, dropout_rate=0.0, backend=backend,
                                  attention_block=BLOCK, attention_window=window)

    source = np.where(VALID, IDS, 0)
    target = np.concatenate([np.full((2, 1), 2, np.int32), IDS[:, :-1]], axis=1)
    params = _init(tr.EncoderDecoder(config("einsum")), source, target)
    logits = {b: jax.jit(lambda p: tr.EncoderDecoder(config(b)).apply(
        {"params": p}, source, target))(params) for b in ("einsum", "blockwise")}
    _close(logits["blockwise"], logits["einsum"], "logits")


def test_attention_fields_are_checked():
    with pytest.raises(ValueError, match="attention_block"):
        dataclasses.replace(_bert("blockwise"), attention_block=0)
    with pytest.raises(ValueError, match="attention_window"):
        gpt.GPTConfig(vocab_size=8, attention_window=-1)
