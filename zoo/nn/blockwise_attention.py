"""Exact softmax attention in O(n) memory: key/value blocks, an online softmax, and a backward
pass that recomputes each block (the FlashAttention algorithm, Dao et al. 2022, written in pure
JAX so it runs on CPU, GPU and TPU alike).

The einsum backend materialises the [b, h, q, k] logits and weights, and its gradient keeps them:
memory O(q k). Here the queries are cut into blocks of `block_q` and the keys into blocks of
`block_k`. For one query block, a loop over key blocks keeps a running maximum m, a running
normaliser l and an unnormalised output acc per query:

    s = q k^T / sqrt(d) (+ bias), masked          (block_q x block_k, the only quadratic buffer)
    m' = max(m, rowmax s);  p = exp(s - m')
    l' = l exp(m - m') + rowsum p;  acc' = acc exp(m - m') + p v

and ends with out = acc / l (0 where no key was visible) and the log-sum-exp m + log l. The
backward pass (a `jax.custom_vjp`) walks the key blocks again, recomputes p = exp(s - lse) from
the saved log-sum-exp and accumulates dq, dk, dv block by block, with D = rowsum(dout * out):
ds = p (dout v^T - D). Residuals are out and lse: O(n). No q x k array exists in either pass.

The mask is a `MaskSpec` description (segment ids, causal, a local window) evaluated per block;
key blocks a causal or window mask excludes entirely are never visited (the loop bounds are
computed per query block), and blocks whose segment ranges do not meet are skipped by a
`lax.cond`. A dense boolean mask and an additive bias are also accepted (sliced per block; the
bias gets its gradient), for short inputs and relative position biases.

Attention dropout keeps each weight with probability 1 - rate, independently, as the einsum
backend does (the same distribution; the samples differ: they are drawn per block, batch row
and head, from the dropout key folded with the block's indices and then the row's and head's
positions in the whole batch, and redrawn identically in the backward pass). Because a sample
depends on where its row and head sit in the whole batch, not on which device holds them, a
sharded call drops out exactly what one device would.

On a mesh (under `jax.set_mesh` and Flax's logical axis rules, as MultiHeadAttention runs) the
whole computation runs under `jax.shard_map`, each device on its own batch rows and heads as the
activations' logical axes (act_batch, act_heads) shard them. Which blocks to visit is then a
per-device decision: the segment test reduces over this device's rows only, and the `lax.cond`
needs no cross-device vote. Left to XLA's partitioner instead, that test is an `any` over the
sharded batch, so every (query block, key block) step of both loops ran an all-reduce of one
bool across the data-parallel devices, and one padded row anywhere in the global
batch kept a block alive for all rows. Where the split cannot be per device (act_len sharded,
batch or heads not divisible by their mesh axes, an axis already manual) the call is left to
XLA's partitioner as before: correct, with those collectives.
"""

import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec

from zoo.nn.attention_kernels import QKV_AXES
from zoo.nn.masks import MaskSpec, block_mask

_NEG = float(jnp.finfo(jnp.float32).min)  # a masked logit: finite, so exp(NEG - NEG) is no NaN


@dataclasses.dataclass(frozen=True)
class _Static:
    """What the traced functions are specialised on (hashable: custom_vjp's nondiff argument)."""

    q_len: int
    k_len: int
    block_q: int
    block_k: int
    window: tuple[int | None, int | None]  # MaskSpec.window_bounds
    scale: float
    dropout_rate: float

    @property
    def num_q(self) -> int:
        return -(-self.q_len // self.block_q)

    @property
    def num_k(self) -> int:
        return -(-self.k_len // self.block_k)

    @property
    def offset(self) -> int:
        # Query i sits at key position i + offset (MaskSpec: the queries are the last q_len).
        return self.k_len - self.q_len


def blockwise_attention(query, key, value, *, spec: MaskSpec | None = None, mask=None,
                        bias=None, dropout_rate: float = 0.0, dropout_rng=None,
                        block_q: int = 512, block_k: int = 512):
    """softmax(q k^T / sqrt(d) + bias) v, computed block by block in O(n) memory.

    Args:
      query: [b, q, h, d]. key, value: [b, k, h, d].
      spec: the mask as a description (MaskSpec); None = every query sees every key.
      mask: a dense bool mask broadcastable to [b, h, q, k] (True = attend), ANDed with `spec`.
      bias: float broadcastable to [b, h, q, k], added to the float32 logits.
      dropout_rate: attention dropout (needs `dropout_rng`); 0 = none.
      block_q, block_k: block sizes (clipped to the lengths; need not divide them).

    Returns:
      [b, q, h, d] in value's dtype. A query with no visible key gets zeros.
    """
    if query.ndim != 4 or key.ndim != 4 or value.shape != key.shape:
        raise ValueError(f"blockwise_attention: need query [b, q, h, d] and key / value "
                         f"[b, k, h, d], got {query.shape}, {key.shape}, {value.shape}")
    if block_q < 1 or block_k < 1:
        raise ValueError(f"blockwise_attention: block sizes must be >= 1, got "
                         f"block_q={block_q}, block_k={block_k}")
    if dropout_rate and dropout_rng is None:
        raise ValueError("blockwise_attention: dropout_rate > 0 needs dropout_rng")
    q_len, k_len = query.shape[1], key.shape[1]
    spec = spec if spec is not None else MaskSpec()
    spec.check(q_len, k_len)
    static = _Static(q_len, k_len, min(block_q, q_len), min(block_k, k_len), spec.window_bounds,
                     float(query.shape[-1]) ** -0.5, float(dropout_rate))
    mask = None if mask is None else _as_4d(jnp.asarray(mask), "mask")
    bias = None if bias is None else _as_4d(jnp.asarray(bias, jnp.float32), "bias")
    rng = dropout_rng if dropout_rate else None
    out = _per_device(static, query, key, value, spec.query_segments, spec.k_segments, mask,
                      bias, rng)
    return out.astype(value.dtype)


def _per_device(static: _Static, query, key, value, q_seg, k_seg, mask, bias, rng):
    """_attention on each device's batch rows and heads (shard_map) when the mesh in context
    splits them evenly; on the whole arrays (XLA partitions it) otherwise."""
    batch, heads = query.shape[0], query.shape[2]
    layout = _device_layout(batch, heads)
    if layout is None:
        rng = None if rng is None else (rng, jnp.zeros((2,), jnp.int32))  # rows, heads from 0
        return _attention(static, query, key, value, q_seg, k_seg, mask, bias, rng)
    mesh, row_axes, head_axes = layout

    def local(query, key, value, q_seg, k_seg, mask, bias, rng):
        if rng is not None:
            # This device's first batch row and head in the whole arrays: dropout samples are
            # drawn per global (row, head), so the split does not change them.
            first = [jnp.int32(0) if axes is None else lax.axis_index(axes) * n
                     for axes, n in ((row_axes, query.shape[0]), (head_axes, query.shape[2]))]
            rng = (rng, jnp.stack(first).astype(jnp.int32))
        return _attention(static, query, key, value, q_seg, k_seg, mask, bias, rng)

    qkv = PartitionSpec(row_axes, None, head_axes, None)
    segments = lambda x: None if x is None else PartitionSpec(
        row_axes if x.shape[0] == batch else None, None)
    # A mask / bias may broadcast over batch or heads (size 1): split only full-size dims.
    # A broadcast bias's gradient is summed over the devices by shard_map's transpose (a psum
    # after the loops, once per call).
    dense = lambda x: None if x is None else PartitionSpec(
        row_axes if x.shape[0] == batch else None,
        head_axes if x.shape[1] == heads else None, None, None)
    in_specs = (qkv, qkv, qkv, segments(q_seg), segments(k_seg), dense(mask), dense(bias),
                None if rng is None else PartitionSpec())
    # check_vma=False: the loops' carries start from constants (replicated) and become
    # per-device, which the varying-axes check would need a pcast at every cond and loop for;
    # the body has no collective to check, and without the check shard_map's transpose sums a
    # replicated input's cotangent over the devices itself.
    return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=qkv, check_vma=False)(
        query, key, value, q_seg, k_seg, mask, bias, rng)


def _device_layout(batch: int, heads: int):
    """(mesh, batch-row axes, head axes) for running per device, or None to leave the call to
    XLA: no mesh of several devices in context, no rule splitting act_batch or act_heads,
    act_len / act_kv split (a sequence split needs every key on every device: ring attention,
    not this), a size that does not divide (shard_map splits evenly only; padding heads or
    replicating the batch would cost more compute than the per-block votes it saves), or an
    axis already manual (inside another shard_map)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return None
    if any(t == jax.sharding.AxisType.Manual for t in mesh.axis_types):
        return None
    row_axes, length, head_axes, kv = nn.logical_to_mesh_axes(QKV_AXES)
    if length is not None or kv is not None or (row_axes is None and head_axes is None):
        return None
    as_tuple = lambda axes: () if axes is None else (axes,) if isinstance(axes, str) else axes
    named = as_tuple(row_axes) + as_tuple(head_axes)
    if not all(isinstance(a, str) and a in mesh.axis_names for a in named):
        return None
    size = lambda axes: math.prod(mesh.shape[a] for a in as_tuple(axes))
    if batch % size(row_axes) or heads % size(head_axes):
        return None
    return mesh, row_axes, head_axes


def block_pairs(spec: MaskSpec | None, q_len: int, k_len: int, block_q: int = 512,
                block_k: int = 512) -> list[tuple[int, int]]:
    """The (query block, key block) pairs `blockwise_attention` computes for `spec`, in order:
    what its causal / window loop bounds and segment skipping leave of the full grid (for
    tests and the benchmark's FLOP counts). A pair is kept when any batch row of `spec` needs
    it; on a mesh each device decides on its own rows, so a device computes block_pairs of its
    rows' segments."""
    spec = spec if spec is not None else MaskSpec()
    static = _Static(q_len, k_len, min(block_q, q_len), min(block_k, k_len), spec.window_bounds,
                     1.0, 0.0)
    pad = lambda x, n: None if x is None else _pad_to(jnp.asarray(x), 1, n)
    schedule = _Schedule(static, pad(spec.query_segments, static.num_q * static.block_q),
                         pad(spec.k_segments, static.num_k * static.block_k))
    pairs = []
    for i in range(static.num_q):
        lo, hi = schedule.key_range(i)
        pairs += [(i, j) for j in range(int(lo), int(hi)) if bool(schedule.needed(i, j))]
    return pairs


# ---- the forward and backward passes --------------------------------------------------------


# rng: None (no dropout) or (dropout key, int32 [first batch row, first head] of these inputs).
@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(static, query, key, value, q_seg, k_seg, mask, bias, rng):
    return _forward(static, query, key, value, q_seg, k_seg, mask, bias, rng)[0]


def _attention_fwd(static, query, key, value, q_seg, k_seg, mask, bias, rng):
    out, lse = _forward(static, query, key, value, q_seg, k_seg, mask, bias, rng)
    return out, (query, key, value, q_seg, k_seg, mask, bias, rng, out, lse)


def _forward(static: _Static, query, key, value, q_seg, k_seg, mask, bias, rng):
    blocks = _Blocks(static, query, key, value, q_seg, k_seg, mask, bias, rng)
    batch, _, heads, dim = query.shape

    def query_block(i):
        q_i = blocks.queries(i)  # (B, bq, H, D)

        def visit(j, carry):
            m, l, acc = carry
            k_j, v_j = blocks.keys(j), blocks.values(j)  # (B, bk, H, D)
            s, keep = blocks.logits(q_i, k_j, i, j)  # (B, H, bq, bk) float32, bool
            m_new = jnp.maximum(m, jnp.max(jnp.where(keep, s, _NEG), axis=-1))  # (B, H, bq)
            p = jnp.where(keep, jnp.exp(s - m_new[..., None]), 0.0)
            alpha = jnp.exp(m - m_new)
            l = l * alpha + jnp.sum(p, axis=-1)
            p = blocks.dropped(p, i, j)
            # (B, H, bq, bk) x (B, bk, H, D) -> (B, H, bq, D)
            pv = jnp.einsum("bhqk,bkhd->bhqd", p.astype(v_j.dtype), v_j,
                            preferred_element_type=jnp.float32)
            return m_new, l, acc * alpha[..., None] + pv

        def body(j, carry):
            return lax.cond(blocks.needed(i, j), functools.partial(visit, j), lambda c: c, carry)

        init = (jnp.full((batch, heads, static.block_q), _NEG, jnp.float32),
                jnp.zeros((batch, heads, static.block_q), jnp.float32),
                jnp.zeros((batch, heads, static.block_q, dim), jnp.float32))
        lo, hi = blocks.key_range(i)
        m, l, acc = lax.fori_loop(lo, hi, body, init)
        seen = l > 0  # a query with no visible key: output 0, lse +inf (so p = 0 in backward)
        out = jnp.where(seen[..., None], acc / jnp.where(seen, l, 1.0)[..., None], 0.0)
        lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), jnp.inf)
        return jnp.swapaxes(out, 1, 2).astype(value.dtype), lse  # (B, bq, H, D), (B, H, bq)

    out, lse = lax.map(query_block, jnp.arange(static.num_q))  # (nq, B, bq, H, D), (nq, B, H, bq)
    out = jnp.moveaxis(out, 0, 1).reshape(batch, -1, heads, dim)[:, :static.q_len]
    lse = jnp.moveaxis(lse, 0, 2).reshape(batch, heads, -1)  # (B, H, nq * bq)
    return out, lse


def _attention_bwd(static: _Static, residuals, d_out):
    query, key, value, q_seg, k_seg, mask, bias, rng, out, lse = residuals
    blocks = _Blocks(static, query, key, value, q_seg, k_seg, mask, bias, rng)
    batch, _, heads, dim = query.shape
    bq, bk = static.block_q, static.block_k
    # D_i = rowsum(dout_i * out_i): the softmax's backward term, (B, H, q) float32.
    delta = jnp.einsum("bqhd,bqhd->bhq", d_out.astype(jnp.float32), out.astype(jnp.float32))
    d_out = _pad_to(d_out, 1, static.num_q * bq)
    delta = _pad_to(delta, 2, static.num_q * bq)

    def key_block(carry, j):
        k_j, v_j = blocks.keys(j), blocks.values(j)

        def visit(i, inner):
            dk, dv, dq, dbias = inner
            q_i = blocks.queries(i)
            do_i = lax.dynamic_slice_in_dim(d_out, i * bq, bq, axis=1)  # (B, bq, H, D)
            lse_i = lax.dynamic_slice_in_dim(lse, i * bq, bq, axis=2)  # (B, H, bq)
            delta_i = lax.dynamic_slice_in_dim(delta, i * bq, bq, axis=2)
            s, keep = blocks.logits(q_i, k_j, i, j)
            p = jnp.where(keep, jnp.exp(s - lse_i[..., None]), 0.0)  # (B, H, bq, bk)
            p_dropped = blocks.dropped(p, i, j)
            dv = dv + jnp.einsum("bhqk,bqhd->bkhd", p_dropped.astype(do_i.dtype), do_i,
                                 preferred_element_type=jnp.float32)
            dp = jnp.einsum("bqhd,bkhd->bhqk", do_i, v_j, preferred_element_type=jnp.float32)
            dp = blocks.dropped(dp, i, j)  # dropout's backward: the same keep mask and scale
            ds = p * (dp - delta_i[..., None])  # d(logits), (B, H, bq, bk)
            dq_i = jnp.einsum("bhqk,bkhd->bqhd", ds, k_j.astype(jnp.float32)) * static.scale
            dq = lax.dynamic_update_slice_in_dim(
                dq, lax.dynamic_slice_in_dim(dq, i * bq, bq, axis=1) + dq_i, i * bq, axis=1)
            dk = dk + jnp.einsum("bhqk,bqhd->bkhd", ds, q_i.astype(jnp.float32)) * static.scale
            if dbias is not None:
                dbias = blocks.add_bias_grad(dbias, ds, i, j)
            return dk, dv, dq, dbias

        def body(i, inner):
            return lax.cond(blocks.needed(i, j), functools.partial(visit, i), lambda c: c, inner)

        dq, dbias = carry
        zeros = jnp.zeros((batch, bk, heads, dim), jnp.float32)
        lo, hi = blocks.query_range(j)
        dk, dv, dq, dbias = lax.fori_loop(lo, hi, body, (zeros, zeros, dq, dbias))
        return (dq, dbias), (dk, dv)

    dq0 = jnp.zeros((batch, static.num_q * bq, heads, dim), jnp.float32)
    dbias0 = None if bias is None else jnp.zeros(blocks.bias.shape, jnp.float32)
    (dq, dbias), (dk, dv) = lax.scan(key_block, (dq0, dbias0), jnp.arange(static.num_k))
    dk = jnp.moveaxis(dk, 0, 1).reshape(batch, -1, heads, dim)[:, :static.k_len]
    dv = jnp.moveaxis(dv, 0, 1).reshape(batch, -1, heads, dim)[:, :static.k_len]
    if dbias is not None:
        dbias = dbias[tuple(slice(0, n) for n in bias.shape)].astype(bias.dtype)
    return (dq[:, :static.q_len].astype(query.dtype), dk.astype(key.dtype),
            dv.astype(value.dtype), None, None, None, dbias, None)


_attention.defvjp(_attention_fwd, _attention_bwd)


# ---- one block's view of the inputs ----------------------------------------------------------


class _Blocks:
    """The inputs padded to whole blocks, and what one (query block i, key block j) sees."""

    def __init__(self, static: _Static, query, key, value, q_seg, k_seg, mask, bias, rng):
        self.static = static
        q_total, k_total = static.num_q * static.block_q, static.num_k * static.block_k
        self.query = _pad_to(query, 1, q_total)
        self.key = _pad_to(key, 1, k_total)
        self.value = _pad_to(value, 1, k_total)
        # Padding positions are masked by MaskSpec.block (index >= length), whatever their ids.
        self.q_seg = None if q_seg is None else _pad_to(q_seg, 1, q_total)
        self.k_seg = None if k_seg is None else _pad_to(k_seg, 1, k_total)
        self.mask = None if mask is None else _pad_qk(mask, q_total, k_total)
        self.bias = None if bias is None else _pad_qk(bias, q_total, k_total)
        self.rng = rng
        self.schedule = _Schedule(static, self.q_seg, self.k_seg)
        self.key_range, self.query_range = self.schedule.key_range, self.schedule.query_range
        self.needed = self.schedule.needed

    def queries(self, i):
        return lax.dynamic_slice_in_dim(self.query, i * self.static.block_q,
                                        self.static.block_q, axis=1)

    def keys(self, j):
        return lax.dynamic_slice_in_dim(self.key, j * self.static.block_k,
                                        self.static.block_k, axis=1)

    def values(self, j):
        return lax.dynamic_slice_in_dim(self.value, j * self.static.block_k,
                                        self.static.block_k, axis=1)

    def logits(self, q_i, k_j, i, j):
        """Scaled (+ bias) float32 logits of block (i, j) and its keep mask, (B, H, bq, bk)."""
        st = self.static
        # (B, bq, H, D) x (B, bk, H, D) -> (B, H, bq, bk)
        s = jnp.einsum("bqhd,bkhd->bhqk", q_i, k_j, preferred_element_type=jnp.float32)
        s = s * st.scale
        if self.bias is not None:
            s = s + _slice_qk(self.bias, i, j, st)
        q_pos = i * st.block_q + jnp.arange(st.block_q)
        k_pos = j * st.block_k + jnp.arange(st.block_k)
        q_seg = k_seg = None
        if self.k_seg is not None:
            k_seg = lax.dynamic_slice_in_dim(self.k_seg, j * st.block_k, st.block_k, axis=1)
        if self.q_seg is not None:
            q_seg = lax.dynamic_slice_in_dim(self.q_seg, i * st.block_q, st.block_q, axis=1)
        keep = block_mask(q_pos, k_pos, st.q_len, st.k_len, st.window, q_seg, k_seg)
        if self.mask is not None:
            keep = keep & _slice_qk(self.mask, i, j, st)
        return s, jnp.broadcast_to(keep, s.shape)

    def dropped(self, x, i, j):
        """x (B, H, bq, bk) with attention dropout applied (the keep mask of block (i, j),
        scaled)."""
        if self.rng is None:
            return x
        rate = self.static.dropout_rate
        key, first = self.rng  # first: (2,) int32, these rows' and heads' offsets in the batch
        block_key = jax.random.fold_in(key, i * self.static.num_k + j)
        # One key per (global row, global head): the same samples whichever device holds them.
        rows = first[0] + jnp.arange(x.shape[0])
        heads = first[1] + jnp.arange(x.shape[1])
        fold = jax.vmap(jax.random.fold_in, in_axes=(None, 0))
        keys = jax.vmap(fold, in_axes=(0, None))(fold(block_key, rows), heads)  # (B, H)
        draw = lambda k: jax.random.bernoulli(k, 1.0 - rate, x.shape[2:])  # (bq, bk)
        keep = jax.vmap(jax.vmap(draw))(keys)  # (B, H, bq, bk)
        return jnp.where(keep, x / (1.0 - rate), 0.0)

    def add_bias_grad(self, dbias, ds, i, j):
        """dbias += ds of block (i, j), summed over the axes the bias broadcasts along."""
        st = self.static
        axes = tuple(a for a in range(4) if self.bias.shape[a] == 1 and ds.shape[a] != 1)
        ds = jnp.sum(ds, axis=axes, keepdims=True)
        q0 = i * st.block_q if self.bias.shape[2] != 1 else 0
        k0 = j * st.block_k if self.bias.shape[3] != 1 else 0
        start = (0, 0, q0, k0)
        return lax.dynamic_update_slice(
            dbias, lax.dynamic_slice(dbias, start, ds.shape) + ds, start)

class _Schedule:
    """Which (query block, key block) pairs are computed: loop bounds from causal / window,
    and a skip test from the blocks' segment ranges."""

    def __init__(self, static: _Static, q_seg, k_seg):
        self.static = static
        self.ranges = _segment_ranges(q_seg, k_seg, static)

    def key_range(self, i):
        """[lo, hi) of the key blocks query block i can see (causal / window bounds)."""
        st = self.static
        left, right = st.window
        first = i * st.block_q + st.offset  # positions of the block's first and last query
        last = jnp.minimum((i + 1) * st.block_q, st.q_len) - 1 + st.offset
        lo = 0 if left is None else jnp.clip((first - left) // st.block_k, 0, st.num_k)
        hi = st.num_k if right is None else jnp.clip((last + right) // st.block_k + 1, 0,
                                                     st.num_k)
        return lo, hi

    def query_range(self, j):
        """[lo, hi) of the query blocks that can see key block j."""
        st = self.static
        left, right = st.window
        first, last = j * st.block_k, (j + 1) * st.block_k - 1
        lo = 0 if right is None else jnp.clip((first - right - st.offset) // st.block_q, 0,
                                              st.num_q)
        hi = st.num_q if left is None else jnp.clip((last + left - st.offset) // st.block_q + 1,
                                                    0, st.num_q)
        return lo, hi

    def needed(self, i, j):
        """False when no batch row has a query of block i and a key of block j in one segment.
        The `any` is over the rows this call holds: on a mesh, run per device (_per_device),
        that is a local reduction; over a sharded batch, XLA would make it an all-reduce in
        every loop step."""
        if self.ranges is None:
            return jnp.bool_(True)
        k_any, k_lo, k_hi, q_any, q_lo, q_hi = self.ranges
        if q_any is None:  # keys-only padding
            return jnp.any(k_any[:, j])
        meet = q_any[:, i] & k_any[:, j] & (q_lo[:, i] <= k_hi[:, j]) & (k_lo[:, j] <= q_hi[:, i])
        return jnp.any(meet)


def _segment_ranges(q_seg, k_seg, st: _Static):
    """Per block and batch row: whether it holds a real token, and its lowest / highest
    segment id (0 = padding ignored). None without segments."""
    if k_seg is None:
        return None

    def ranges(seg, n, size):
        seg = seg.reshape(seg.shape[0], n, size)  # (B, n_blocks, block)
        real = seg != 0
        big = jnp.iinfo(seg.dtype).max
        return (jnp.any(real, -1), jnp.min(jnp.where(real, seg, big), -1),
                jnp.max(jnp.where(real, seg, -1), -1))

    # Key padding past k_len is masked by position; mark it as no token here too.
    k_seg = jnp.where(jnp.arange(k_seg.shape[1]) < st.k_len, k_seg, 0)
    k_any, k_lo, k_hi = ranges(k_seg, st.num_k, st.block_k)
    if q_seg is None:
        return k_any, k_lo, k_hi, None, None, None
    q_seg = jnp.where(jnp.arange(q_seg.shape[1]) < st.q_len, q_seg, 0)
    return (k_any, k_lo, k_hi) + ranges(q_seg, st.num_q, st.block_q)


def _slice_qk(x, i, j, st: _Static):
    """Block (i, j) of a [b|1, h|1, q|1, k|1] mask or bias (broadcast axes kept at 1)."""
    if x.shape[2] != 1:
        x = lax.dynamic_slice_in_dim(x, i * st.block_q, st.block_q, axis=2)
    if x.shape[3] != 1:
        x = lax.dynamic_slice_in_dim(x, j * st.block_k, st.block_k, axis=3)
    return x


def _pad_qk(x, q_total: int, k_total: int):
    if x.shape[2] != 1:
        x = _pad_to(x, 2, q_total)
    if x.shape[3] != 1:
        x = _pad_to(x, 3, k_total)
    return x


def _pad_to(x, axis: int, size: int):
    extra = size - x.shape[axis]
    if extra == 0:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, extra)
    return jnp.pad(x, pad)


def _as_4d(x, name: str):
    if x.ndim > 4:
        raise ValueError(f"blockwise_attention: {name} must broadcast to [b, h, q, k], got "
                         f"shape {x.shape}")
    return x.reshape((1,) * (4 - x.ndim) + x.shape)
