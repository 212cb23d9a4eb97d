"""The blockwise (FlashAttention-style) backend against a float64 numpy reference: outputs and
the gradients of q, k, v and the bias, for every mask kind and block sizes that do and do not
divide the lengths; no q x k buffer in the compiled program; jit, sharding and block skipping."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from tests.nn.attention_reference import attention_and_gradients as _reference
from tests.numerics import assert_close
from zoo.nn import blockwise_attention as bw
from zoo.nn.masks import MaskSpec

TOL = 1e-5  # of each tensor's largest |entry| (tests/numerics.py)


def _case(seed, batch=2, q_len=37, k_len=37, heads=3, dim=8):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(batch, q_len, heads, dim)).astype(np.float32)
    k = rng.normal(size=(batch, k_len, heads, dim)).astype(np.float32)
    v = rng.normal(size=(batch, k_len, heads, dim)).astype(np.float32)
    d_out = rng.normal(size=(batch, q_len, heads, dim)).astype(np.float32)
    return q, k, v, d_out


# Packed documents (ids 1, 2, 3) with trailing padding in row 0, padding only in row 1.
SEGMENTS = np.array([[1] * 10 + [2] * 15 + [3] * 8 + [0] * 4, [1] * 30 + [0] * 7], np.int32)
SPECS = {
    "none": MaskSpec(),
    "padding": MaskSpec.self_attention(SEGMENTS[:, :] != 0),
    "causal": MaskSpec.self_attention(causal=True),
    "packed_causal": MaskSpec.self_attention(SEGMENTS, causal=True, packed=True),
    "window_both_sides": MaskSpec.self_attention(SEGMENTS != 0, window=(5, 3)),
    "causal_window": MaskSpec.self_attention(causal=True, window=6),
    "key_padding": MaskSpec.key_padding(SEGMENTS != 0),
}


def _check(spec, q, k, v, d_out, bias=None, dense=None, block_q=8, block_k=8, jit=True):
    q_len, k_len = q.shape[1], k.shape[1]
    keep = np.asarray(spec.dense(q_len, k_len))
    if dense is not None:
        keep = keep & dense

    def attention(q, k, v, bias):
        return bw.blockwise_attention(q, k, v, spec=spec, mask=dense, bias=bias,
                                      block_q=block_q, block_k=block_k)

    fn = jax.jit(attention) if jit else attention
    out, vjp = jax.vjp(fn, q, k, v, bias)
    grads = vjp(jnp.asarray(d_out))
    want = _reference(q, k, v, keep, bias, d_out)
    for name, got, ref in zip(("out", "dq", "dk", "dv", "dbias"), (out,) + grads, want):
        if ref is None:
            continue
        assert_close(got, ref, TOL, err_msg=name)


# 37 positions: square blocks that leave a partial last block for every mask kind, and unequal
# ones that divide neither length for the kinds whose block bounds differ most (block sizes
# that divide it: test_blocks_that_divide_the_length).
BLOCK_CASES = [(name, (8, 8)) for name in SPECS] + [
    (name, (16, 5)) for name in ("packed_causal", "window_both_sides", "causal_window",
                                 "key_padding")]


@pytest.mark.parametrize("name, blocks", BLOCK_CASES,
                         ids=[f"{name}-{q}x{k}" for name, (q, k) in BLOCK_CASES])
@pytest.mark.slow
def test_outputs_and_gradients_equal_float64_reference(name, blocks):
    q, k, v, d_out = _case(seed=len(name))
    bias = np.random.default_rng(7).normal(size=(1, 3, 37, 37)).astype(np.float32)
    _check(SPECS[name], q, k, v, d_out, bias=bias, block_q=blocks[0], block_k=blocks[1])


@pytest.mark.parametrize("spec", [
    MaskSpec.self_attention(SEGMENTS[:, :32], causal=True, packed=True),
    MaskSpec.self_attention(SEGMENTS[:, :32] != 0, window=(5, 3)),
], ids=["packed_causal", "window"])
def test_blocks_that_divide_the_length(spec):
    q, k, v, d_out = _case(seed=12, q_len=32, k_len=32)
    bias = np.random.default_rng(13).normal(size=(1, 3, 32, 32)).astype(np.float32)
    _check(spec, q, k, v, d_out, bias=bias, block_q=8, block_k=16)


def test_cross_attention_with_different_lengths_and_broadcast_bias():
    q, k, v, d_out = _case(seed=3, q_len=11, k_len=29)
    k_valid = np.arange(29)[None, :] < np.array([[29], [17]])  # row 1: 12 padded keys
    bias = np.random.default_rng(8).normal(size=(2, 1, 1, 29)).astype(np.float32)  # per key
    _check(MaskSpec.key_padding(k_valid), q, k, v, d_out, bias=bias, block_q=4, block_k=6)


def test_queries_as_the_last_positions_of_a_longer_key_sequence():
    # A chunk of 9 queries after 14 cached positions: causal offset 14, window 5 back.
    q, k, v, d_out = _case(seed=4, q_len=9, k_len=23)
    _check(MaskSpec.self_attention(causal=True, window=5), q, k, v, d_out, block_q=4, block_k=5)


def test_a_dense_mask_is_combined_with_the_description():
    q, k, v, d_out = _case(seed=5)
    dense = np.random.default_rng(9).random((2, 1, 37, 37)) < 0.7
    _check(SPECS["packed_causal"], q, k, v, d_out, dense=dense, block_q=8, block_k=16)


def test_fully_masked_rows_are_zero_with_zero_gradient():
    q, k, v, d_out = _case(seed=6)
    spec = SPECS["padding"]
    out, vjp = jax.vjp(lambda q: bw.blockwise_attention(q, k, v, spec=spec, block_q=8,
                                                        block_k=8), q)
    padding = SEGMENTS == 0
    assert np.all(np.asarray(out)[padding] == 0)
    assert np.all(np.asarray(vjp(jnp.asarray(d_out))[0])[padding] == 0)
    assert np.all(np.isfinite(np.asarray(out)))


def test_jit_equals_no_jit():
    q, k, v, _ = _case(seed=7)
    spec = SPECS["packed_causal"]
    f = lambda q, k, v: bw.blockwise_attention(q, k, v, spec=spec, block_q=8, block_k=8)
    assert_close(jax.jit(f)(q, k, v), f(q, k, v), 1e-6)


def test_bfloat16_inputs_stay_close_to_float32():
    q, k, v, _ = _case(seed=8)
    spec = SPECS["causal"]
    f = lambda *x: bw.blockwise_attention(*x, spec=spec, block_q=8, block_k=8)
    full = np.asarray(f(q, k, v))
    half = f(*(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)))
    assert half.dtype == jnp.bfloat16
    assert_close(np.asarray(half, np.float32), full, 3e-2)


def test_dropout_keeps_each_weight_independently_and_its_gradient_is_exact():
    """The blocks' keep masks, redrawn here exactly as the kernel draws them, give the float64
    reference with dropout; the kept fraction is 1 - rate."""
    q, k, v, d_out = _case(seed=9, batch=2, q_len=24, k_len=24, heads=2)
    rate, block, rng = 0.25, 8, jax.random.key(3)
    spec = MaskSpec.self_attention(causal=True)
    f = lambda q, k, v: bw.blockwise_attention(q, k, v, spec=spec, dropout_rate=rate,
                                               dropout_rng=rng, block_q=block, block_k=block)
    out, vjp = jax.vjp(jax.jit(f), q, k, v)
    grads = vjp(jnp.asarray(d_out))
    nb = 24 // block
    keep = np.zeros((2, 2, 24, 24), bool)
    for i in range(nb):
        for j in range(nb):
            block_key = jax.random.fold_in(rng, i * nb + j)
            for row in range(2):
                for head in range(2):  # one key per (block, batch row, head)
                    row_head = jax.random.fold_in(jax.random.fold_in(block_key, row), head)
                    keep[row, head, i * block:(i + 1) * block, j * block:(j + 1) * block] = (
                        np.asarray(jax.random.bernoulli(row_head, 1 - rate, (block, block))))
    want = _reference(q, k, v, np.asarray(spec.dense(24, 24)), None, d_out, keep, rate)
    for name, got, ref in zip(("out", "dq", "dk", "dv"), (out,) + grads, want):
        assert_close(got, ref, 1e-4, err_msg=name)
    assert abs(keep.mean() - (1 - rate)) < 0.05
    # Other keys, other samples: dropout is active, not a fixed pattern.
    other = bw.blockwise_attention(q, k, v, spec=spec, dropout_rate=rate,
                                   dropout_rng=jax.random.key(4), block_q=block, block_k=block)
    assert not np.allclose(np.asarray(other), np.asarray(out))


def test_no_buffer_of_queries_times_keys_in_forward_or_backward():
    n, block = 1024, 128
    shape = jax.ShapeDtypeStruct((1, n, 2, 16), jnp.float32)
    spec = MaskSpec.self_attention(causal=True)
    loss = lambda q, k, v: jnp.sum(bw.blockwise_attention(q, k, v, spec=spec, block_q=block,
                                                          block_k=block))
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(shape, shape, shape).compile().as_text()
    dims = [tuple(int(d) for d in m.split(",") if d)
            for m in re.findall(r"\[([0-9,]+)\]", text)]
    sizes = [int(np.prod(d)) for d in dims if d]
    assert max(sizes) < n * n // 8, f"largest buffer {max(sizes)} elements"
    # The einsum path does hold one, so the check would catch it.
    dense = lambda q, k, v: jnp.sum(jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k)))
    dense_text = jax.jit(jax.grad(dense)).lower(shape, shape, shape).compile().as_text()
    assert f"{n},{n}]" in dense_text


def test_memory_grows_linearly_with_length():
    def temp_bytes(n):
        shape = jax.ShapeDtypeStruct((1, n, 2, 16), jnp.float32)
        loss = lambda q, k, v: jnp.sum(bw.blockwise_attention(q, k, v, block_q=128, block_k=128))
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(shape, shape, shape).compile()
        analysis = compiled.memory_analysis()
        return analysis.temp_size_in_bytes + analysis.output_size_in_bytes

    small, large = temp_bytes(1024), temp_bytes(4096)
    slope = np.log(large / small) / np.log(4)
    assert slope <= 1.2, f"memory slope {slope:.2f} in n"


def test_block_pairs_skip_what_causal_window_and_segments_exclude():
    n, block = 64, 8
    nb = n // block
    full = bw.block_pairs(MaskSpec(), n, n, block, block)
    causal = bw.block_pairs(MaskSpec.self_attention(causal=True), n, n, block, block)
    window = bw.block_pairs(MaskSpec.self_attention(causal=True, window=8), n, n, block, block)
    segments = np.repeat(np.arange(1, 5), 16)[None]  # four documents of 16 tokens
    packed = bw.block_pairs(MaskSpec.self_attention(segments, packed=True), n, n, block, block)
    assert len(full) == nb * nb
    assert len(causal) == nb * (nb + 1) // 2 and all(j <= i for i, j in causal)
    assert len(window) == 2 * nb - 1  # the diagonal block and the one before it
    assert len(packed) == 4 * 2 * 2  # each document: its 2 x 2 blocks
    # Every pair a mask entry needs is visited: nothing skipped that matters.
    for spec, pairs in ((MaskSpec.self_attention(causal=True, window=8), window),
                        (MaskSpec.self_attention(segments, packed=True), packed)):
        dense = np.asarray(spec.dense(n, n))[0, 0]
        needed = {(i, j) for i in range(nb) for j in range(nb)
                  if dense[i * block:(i + 1) * block, j * block:(j + 1) * block].any()}
        assert needed == set(pairs)


def test_sharded_over_batch_and_heads_equals_one_device():
    devices = jax.devices()
    assert len(devices) == 8
    mesh = jax.make_mesh((4, 2), ("data", "tensor"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    q, k, v, d_out = _case(seed=10, batch=4, q_len=24, k_len=24, heads=2)
    spec = MaskSpec.self_attention(np.tile(SEGMENTS[:, :24], (2, 1)), causal=True, packed=True)

    def loss(q, k, v, spec):
        out = bw.blockwise_attention(q, k, v, spec=spec, block_q=8, block_k=8)
        return jnp.sum(out * d_out), out

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))
    (_, single), grads = step(q, k, v, spec)
    qkv = NamedSharding(mesh, P("data", None, "tensor", None))
    seg = NamedSharding(mesh, P("data", None))
    placed = [jax.device_put(x, qkv) for x in (q, k, v)]
    spec_sharded = jax.tree.map(lambda x: jax.device_put(x, seg), spec)
    (_, sharded), sharded_grads = step(*placed, spec_sharded)
    assert sharded.sharding.is_equivalent_to(qkv, 4)  # stays split over batch and heads
    assert_close(sharded, single, 1e-6)
    assert_close(sharded_grads, grads, 1e-5)


def test_bad_arguments_are_clear_errors():
    q, k, v, _ = _case(seed=11)
    with pytest.raises(ValueError, match="dropout_rng"):
        bw.blockwise_attention(q, k, v, dropout_rate=0.1)
    with pytest.raises(ValueError, match="block sizes"):
        bw.blockwise_attention(q, k, v, block_q=0)
    with pytest.raises(ValueError, match="segments has length|query segments"):
        bw.blockwise_attention(q, k, v, spec=MaskSpec.self_attention(SEGMENTS[:, :20]))
    with pytest.raises(ValueError, match=r"\[b, q, h, d\]"):
        bw.blockwise_attention(q[0], k, v)
