"""Blockwise attention on a mesh decides which blocks to visit on each device: the compiled
sharded step has no collective inside the attention's block loops (issue 28), its values and
gradients equal one device's, each device skips the blocks its own rows do not need, and
attention dropout draws the same samples however the batch and heads are split."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from tests.numerics import assert_close, assert_params_close
from zoo.nn import blockwise_attention as bw
from zoo.nn.masks import MaskSpec
from zoo.nn.transformer import TransformerEncoder
from zoo.train import partitioning
from zoo.train.compilation.collectives import collectives

B, T, WIDTH, HEADS, BLOCK = 8, 32, 32, 4, 8  # four blocks per sequence, one row per device


def _segments():
    """[8, 32] packed documents and trailing padding, different in every row: rows 0-3 end in
    a whole block (8+) of padding, rows 4-7 are full; documents of 1 to 31 tokens."""
    rows = []
    for r in range(B):
        lengths = [[17, 7], [5, 9, 6], [12, 12], [3, 13, 8], [20, 12], [8, 8, 8, 8],
                   [31, 1], [11, 10, 11]][r]
        ids = np.concatenate([np.full(n, d + 1) for d, n in enumerate(lengths)])
        rows.append(np.pad(ids, (0, T - len(ids))))
    return np.stack(rows).astype(np.int32)


SEGMENTS = _segments()


def _mesh(data, tensor):
    return partitioning.make_mesh(data=data, fsdp=1, tensor=tensor)


def _encoder(scan_layers=False, dropout=0.0):
    return TransformerEncoder(num_layers=2, num_heads=HEADS, mlp_dim=64, backend="blockwise",
                              attention_block=BLOCK, scan_layers=scan_layers,
                              attention_dropout_rate=dropout)


def _encoder_step(model, mesh, deterministic=True):
    """A jitted forward + backward of `model` on packed, padded rows, with params and inputs
    laid out by the logical rules on `mesh`; returns (step, args)."""
    x = np.random.default_rng(0).normal(size=(B, T, WIDTH)).astype(np.float32)
    spec = MaskSpec.self_attention(SEGMENTS, packed=True)
    boxed = jax.eval_shape(model.init, jax.random.key(0), x, spec)["params"]
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), x, spec))["params"]
    param_shardings = partitioning.logical_sharding(boxed, mesh)
    rows = NamedSharding(mesh, P(("data", "fsdp")))
    args = (jax.device_put(params, param_shardings), jax.device_put(x, rows),
            jax.tree.map(lambda s: jax.device_put(s, rows), spec), jax.random.key(1))

    # A random projection of the real positions' outputs (a sum of squares of post-LN outputs
    # would be nearly constant, its gradients mostly cancellation).
    w = np.random.default_rng(1).normal(size=(B, T, WIDTH)).astype(np.float32)
    w = np.where(SEGMENTS[..., None] != 0, w, 0.0)

    def loss(params, x, spec, rng):
        out = model.apply({"params": params}, x, spec, deterministic=deterministic,
                          rngs={"dropout": rng})
        return jnp.sum(out * w), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)), args


def _attention_loop_collectives(text):
    return [c for c in collectives(text) if c.inside("attention")]


@pytest.mark.slow
@pytest.mark.parametrize("data, tensor", [(8, 1), (4, 2)])
@pytest.mark.parametrize("scan_layers", [False, True])
def test_no_collective_inside_the_attention_loops_of_a_sharded_step(data, tensor, scan_layers):
    """Forward + backward of a 2-layer encoder on packed, padded rows, batch over data (and
    heads over tensor): XLA's program has attention loops, and no collective runs in them."""
    mesh = _mesh(data, tensor)
    step, args = _encoder_step(_encoder(scan_layers), mesh)
    with jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.DEFAULT_RULES):
        text = step.lower(*args).compile().as_text()
    # The check below could pass vacuously if the loops had vanished (unrolled, renamed).
    assert "attention" in text and " while(" in text
    inside = _attention_loop_collectives(text)
    assert not inside, "\n".join(
        f"{c.kind} {c.dtype}{list(c.shapes)} x{c.executions} {c.op_name}" for c in inside[:5])


def _qkv(seed, batch=B, heads=HEADS, dim=8):
    rng = np.random.default_rng(seed)
    shape = (batch, T, heads, dim)
    return tuple(rng.normal(size=shape).astype(np.float32) for _ in range(4))  # q, k, v, d_out


def _bare_step(dense=None, rate=0.0):
    """jit(value and gradients) of the bare function: out, and d(q, k, v, bias) of
    sum(out * d_out)."""
    def loss(q, k, v, bias, d_out, spec, rng):
        out = bw.blockwise_attention(q, k, v, spec=spec, mask=dense, bias=bias,
                                     dropout_rate=rate, dropout_rng=rng if rate else None,
                                     block_q=BLOCK, block_k=BLOCK)
        return jnp.sum(out * d_out), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))


def _on_mesh(mesh, step, q, k, v, bias, d_out, spec, rng, rules=partitioning.DEFAULT_RULES):
    """step's result and compiled program on `mesh`, q / k / v / d_out split over batch (data,
    fsdp) and heads (tensor) and the segment ids over batch, as a sharded model holds them."""
    heads = "tensor" if q.shape[2] % mesh.shape["tensor"] == 0 else None  # device_put: even
    qkv = NamedSharding(mesh, P(("data", "fsdp"), None, heads, None))
    rows = NamedSharding(mesh, P(("data", "fsdp"), None))
    q, k, v, d_out = (jax.device_put(x, qkv) for x in (q, k, v, d_out))
    spec = jax.tree.map(lambda x: jax.device_put(x, rows), spec)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        args = (q, k, v, bias, d_out, spec, rng)
        return step(*args), step.lower(*args).compile().as_text()


@pytest.mark.slow
@pytest.mark.parametrize("data, tensor", [(8, 1), (4, 2)])
def test_bare_function_sharded_equals_one_device_with_mask_bias_and_dropout(data, tensor):
    """Packed documents and padded rows, a dense mask per row (broadcast over heads), a bias
    per head (broadcast over batch) and attention dropout: one device and the per-device
    split give the same output and gradients (dropout samples included), and the split's
    program has no collective inside any while loop."""
    q, k, v, d_out = _qkv(seed=1)
    spec = MaskSpec.self_attention(SEGMENTS, packed=True)
    rng = np.random.default_rng(2)
    dense = rng.random((B, 1, T, T)) < 0.8
    bias = rng.normal(size=(1, HEADS, T, T)).astype(np.float32)
    step = _bare_step(dense=dense, rate=0.3)
    key = jax.random.key(5)
    (_, single), single_grads = step(q, k, v, bias, d_out, spec, key)
    ((_, sharded), sharded_grads), text = _on_mesh(_mesh(data, tensor), step, q, k, v, bias,
                                                   d_out, spec, key)
    assert_close(sharded, single, 1e-6, err_msg="out")
    for name, got, want in zip(("dq", "dk", "dv", "dbias"), sharded_grads, single_grads):
        assert_close(got, want, 1e-5, err_msg=name)
    # Dropout really acted (else the sharded == single check of it would be empty).
    (_, undropped), _ = _bare_step(dense=dense)(q, k, v, bias, d_out, spec, key)
    assert not np.allclose(np.asarray(single), np.asarray(undropped))
    looped = [c for c in collectives(text) if c.loops]
    assert not looped, [(c.kind, c.op_name) for c in looped]


@pytest.mark.slow
@pytest.mark.parametrize("data, tensor", [(8, 1), (4, 2)])
def test_sharded_encoder_step_equals_one_device(data, tensor):
    """The 2-layer encoder's loss and gradients (params and inputs) on the mesh == one
    device, with attention dropout on (the same samples on every layout)."""
    model = _encoder(dropout=0.25)
    step, args = _encoder_step(model, _mesh(data, tensor), deterministic=False)
    with jax.set_mesh(_mesh(data, tensor)), nn.logical_axis_rules(partitioning.DEFAULT_RULES):
        (_, out), (d_params, d_x) = step(*args)
    one = jax.devices()[0]
    single_args = jax.device_put(jax.tree.map(np.asarray, args[:3]), one) + (args[3],)
    (_, want_out), (want_params, want_x) = step(*single_args)
    assert_close(out, want_out, 1e-5, err_msg="encoder output")
    assert_params_close(d_params, want_params, 1e-5, err_msg="d params")
    assert_close(d_x, want_x, 1e-5, err_msg="d x")


@pytest.mark.parametrize("data, tensor", [(8, 1), (4, 2)])
def test_each_device_skips_the_blocks_its_own_rows_do_not_need(data, tensor):
    """Rows 0-3 end in a whole key block of padding (block 3); rows 4-7 need it. NaN keys and
    values at those padding positions reach a row's output (0 * NaN) and its dq only if a
    device visits a (query block, key block 3) pair for it. One call on the whole batch
    visits them (another row needs the block), so its rows 0-3 are NaN; on the mesh the
    devices holding rows 0-3 skip the block, as block_pairs of their rows says, and every
    output and gradient is finite."""
    q, k, v, d_out = _qkv(seed=3)
    padding = SEGMENTS == 0  # (B, T)
    assert padding[:4, 3 * BLOCK:].all() and not padding[4:].any()
    clean_k, clean_v = k.copy(), v.copy()
    # Only the whole padding block: a block holding real tokens too is visited for them.
    k[:4, 3 * BLOCK:], v[:4, 3 * BLOCK:] = np.nan, np.nan
    spec = MaskSpec.self_attention(SEGMENTS, packed=True)
    rows_per_device = B // data
    for first in range(0, B, rows_per_device):
        device_spec = MaskSpec.self_attention(SEGMENTS[first:first + rows_per_device],
                                              packed=True)
        key_blocks = {j for _, j in bw.block_pairs(device_spec, T, T, BLOCK, BLOCK)}
        assert (3 in key_blocks) == (first >= 4)
    step = _bare_step()
    bias = np.zeros((1, 1, 1, 1), np.float32)
    (_, single), (single_dq, *_) = step(q, k, v, bias, d_out, spec, None)
    assert np.isnan(np.asarray(single)[:4]).any() and np.isnan(np.asarray(single_dq)[:4]).any()
    (_, sharded), (dq, dk, dv, _) = _on_mesh(_mesh(data, tensor), step, q, k, v, bias, d_out,
                                             spec, None)[0]
    for name, x in (("out", sharded), ("dq", dq), ("dk", dk), ("dv", dv)):
        assert np.isfinite(np.asarray(x)).all(), name
    # And it is still the attention: what the clean inputs give on one device.
    (_, want), (want_dq, *_) = step(q, clean_k, clean_v, bias, d_out, spec, None)
    assert_close(sharded, want, 1e-6, err_msg="out")
    assert_close(dq, want_dq, 1e-5, err_msg="dq")


@pytest.mark.parametrize("heads, rules", [
    (3, partitioning.DEFAULT_RULES),  # 3 heads over tensor=2: no even split
    (HEADS, (("act_batch", "data"), ("act_len", "tensor"), ("act_heads", None))),  # sequence
], ids=["uneven_heads", "sharded_length"])
def test_layouts_without_an_even_split_fall_back_to_xla_and_stay_correct(heads, rules):
    q, k, v, d_out = _qkv(seed=4, heads=heads)
    spec = MaskSpec.self_attention(SEGMENTS, packed=True)
    step = _bare_step()
    bias = np.zeros((1, 1, 1, 1), np.float32)
    (_, single), single_grads = step(q, k, v, bias, d_out, spec, None)
    (_, sharded), grads = _on_mesh(_mesh(4, 2), step, q, k, v, bias, d_out, spec, None,
                                   rules=rules)[0]
    assert_close(sharded, single, 1e-6)
    for got, want in zip(grads[:3], single_grads[:3]):
        assert_close(got, want, 1e-5)
