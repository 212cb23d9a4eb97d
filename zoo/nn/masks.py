"""Attention masks: described (`MaskSpec`) or materialised (boolean [batch, 1, q_len, k_len]).

Masks are built once at the top of a model and passed down; the singleton axis 1 broadcasts over
heads. They stay boolean all the way to the softmax: an additive -inf/-1e9 bias goes in the
separate `bias` argument of the attention layers, never in a mask, so a wrong kind of mask fails
loudly instead of silently attending everywhere.

A dense mask is O(q x k): at 16k tokens one batch row is 256 MB of booleans before a single
logit exists. Models therefore pass a `MaskSpec` — segment ids (padding, packing), causal, a
local window — which is O(q + k), and each attention backend builds what it needs from it: the
einsum backend the dense mask, the blockwise backend one block at a time (skipping blocks the
description excludes), the accelerator kernels their own mask forms.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


def valid_from_ids(ids, pad_id: int = 0) -> jnp.ndarray:
    """Token validity [b, len] from token ids [b, len]: True where `ids != pad_id`."""
    return jnp.asarray(ids) != pad_id


def padding_mask(q_valid, k_valid=None) -> jnp.ndarray:
    """A [b, 1, q, k] mask that is True where both the query and the key are real tokens.

    Args:
      q_valid: bool [b, q_len], True for real (non-padding) query positions.
      k_valid: bool [b, k_len] for the keys; defaults to `q_valid` (self-attention).
    """
    q_valid = _bool(q_valid, "q_valid", ndim=2)
    k_valid = q_valid if k_valid is None else _bool(k_valid, "k_valid", ndim=2)
    if q_valid.shape[0] != k_valid.shape[0]:
        raise ValueError(
            f"padding_mask: q_valid batch {q_valid.shape[0]} != k_valid batch {k_valid.shape[0]}"
        )
    return q_valid[:, None, :, None] & k_valid[:, None, None, :]  # (b, 1, q, k)


def causal_mask(q_len: int, k_len: int | None = None, batch: int = 1) -> jnp.ndarray:
    """A [batch, 1, q_len, k_len] mask where query i sees keys j <= i.

    With k_len > q_len the queries are the *last* q_len positions of the key sequence (a chunk
    appended after k_len - q_len cached positions), so query i sees keys j <= i + k_len - q_len.
    """
    k_len = q_len if k_len is None else k_len
    if q_len < 1 or k_len < q_len:
        raise ValueError(
            f"causal_mask: need 1 <= q_len <= k_len, got q_len={q_len}, k_len={k_len}; the "
            "queries are the last q_len of the k_len key positions"
        )
    offset = k_len - q_len
    # Static lengths: build on the host so the mask is a compile-time constant under jit.
    mask = np.arange(k_len)[None, :] <= np.arange(q_len)[:, None] + offset  # (q, k)
    return jnp.broadcast_to(jnp.asarray(mask), (batch, 1, q_len, k_len))


def segment_mask(q_segments, k_segments=None) -> jnp.ndarray:
    """A [b, 1, q, k] mask for packed sequences: attend only within the same segment id.

    Args:
      q_segments: int [b, q_len] segment (document) id of each query position; 0 marks padding,
        which attends nowhere and is attended by nothing.
      k_segments: int [b, k_len] for the keys; defaults to `q_segments`.
    """
    q_segments = jnp.asarray(q_segments)
    k_segments = q_segments if k_segments is None else jnp.asarray(k_segments)
    if q_segments.ndim != 2 or k_segments.ndim != 2:
        raise ValueError(
            f"segment_mask: segment ids must be [batch, len], got q {q_segments.shape} "
            f"and k {k_segments.shape}"
        )
    same = q_segments[:, None, :, None] == k_segments[:, None, None, :]  # (b, 1, q, k)
    real = (q_segments != 0)[:, None, :, None] & (k_segments != 0)[:, None, None, :]
    return same & real


def combine_masks(*masks) -> jnp.ndarray | None:
    """Logical AND of boolean masks (broadcasting), skipping None; None if every mask is None."""
    masks = [m for m in masks if m is not None]
    if not masks:
        return None
    out = _bool(masks[0], "masks[0]")
    for i, m in enumerate(masks[1:], start=1):
        out = out & _bool(m, f"masks[{i}]")
    return out


def masked_softmax(logits, mask=None, axis: int = -1) -> jnp.ndarray:
    """Softmax in float32 over `axis`, with masked entries and fully-masked rows exactly zero.

    A plain `where(mask, logits, -big)` softmax gives a fully-masked row *uniform* weights (every
    entry is equally -big); those rows are padding queries, and uniform weights would leak the
    average of all values into them. Zeroing after the softmax makes them contribute nothing and
    keeps gradients finite (no -inf anywhere, so never NaN).

    Args:
      logits: scores broadcast-compatible with `mask`.
      mask: bool, True = keep; None keeps everything.
      axis: the axis normalised over (the keys).
    """
    logits = jnp.asarray(logits, jnp.float32)
    if mask is None:
        return jax.nn.softmax(logits, axis=axis)
    mask = _bool(mask, "mask")
    weights = jax.nn.softmax(jnp.where(mask, logits, jnp.finfo(jnp.float32).min), axis=axis)
    return jnp.where(mask, weights, 0.0)


def _bool(x, name: str, ndim: int | None = None) -> jnp.ndarray:
    x = jnp.asarray(x)
    if x.dtype != jnp.bool_:
        raise ValueError(
            f"{name} must be a boolean mask (True = attend), got dtype {x.dtype}; pass additive "
            "float biases as `bias`, or convert with `x != pad_id` / `x > 0`"
        )
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dims [batch, len], got shape {x.shape}")
    return x


@struct.dataclass
class MaskSpec:
    """Which keys each query may attend, described in O(q + k) instead of a [b, 1, q, k] array.

    Query i of q_len sits at position i + (k_len - q_len) of the key sequence (the queries are
    the last q_len positions, as `causal_mask`; q_len == k_len in plain self-attention). Query i
    may attend key j when every given condition holds:

    * segments: `k_segments` [b, k_len] int, 0 = padding (never attended). With query segment
      ids too — `q_segments` [b, q_len], or the keys' own when `same_sequence`
      (self-attention) — also q_segment[i] == k_segments[j] (packed documents; a padding
      query attends nothing); without them every query sees every real key
      (cross-attention over a padded source).
    * causal: j <= position(i).
    * window (left, right): position(i) - left <= j <= position(i) + right (a local window,
      as `jax.nn.dot_product_attention`'s local_window_size; with causal, right is 0).

    `packed` says the segment ids may be anything, not just 1 = token / 0 = trailing padding;
    kernels that take padding as sequence lengths (cuDNN) need packed=False.
    """

    q_segments: jax.Array | None = None
    k_segments: jax.Array | None = None
    same_sequence: bool = struct.field(pytree_node=False, default=False)
    causal: bool = struct.field(pytree_node=False, default=False)
    window: tuple[int, int] | None = struct.field(pytree_node=False, default=None)
    packed: bool = struct.field(pytree_node=False, default=False)

    def __post_init__(self):
        if self.window is not None:
            left, right = self.window
            if left < 0 or right < 0:
                raise ValueError(f"MaskSpec: window=(left, right) must be >= 0, got {self.window}")

    @classmethod
    def self_attention(cls, segments=None, *, causal: bool = False, window=None,
                       packed: bool = False) -> "MaskSpec":
        """Queries and keys are one sequence: `segments` [b, len] int/bool (0 / False = padding;
        packed documents when `packed`), optionally causal and / or windowed."""
        segments = None if segments is None else _segments(segments, "segments")
        return cls(None, segments, same_sequence=segments is not None, causal=causal,
                   window=_window(window, causal), packed=packed)

    @classmethod
    def key_padding(cls, k_valid) -> "MaskSpec":
        """Every query attends every real key: `k_valid` [b, k_len] bool / int (cross-attention
        over a padded source)."""
        return cls(None, _segments(k_valid, "k_valid"))

    @property
    def query_segments(self) -> jax.Array | None:
        """The queries' segment ids [b, q_len] (None: queries are not restricted)."""
        return self.k_segments if self.same_sequence else self.q_segments

    @property
    def window_bounds(self) -> tuple[int | None, int | None]:
        """(left, right) reach of a query, None = unbounded; causal makes right 0."""
        left, right = self.window if self.window is not None else (None, None)
        if self.causal:
            right = 0 if right is None else min(right, 0)
        return left, right

    def dense(self, q_len: int, k_len: int) -> jnp.ndarray:
        """The mask materialised: bool [b|1, 1, q_len, k_len] (short inputs and tests only)."""
        self.check(q_len, k_len)
        return block_mask(jnp.arange(q_len), jnp.arange(k_len), q_len, k_len,
                          self.window_bounds, self.query_segments, self.k_segments)

    def query_has_key(self, q_len: int, k_len: int) -> jnp.ndarray | None:
        """Bool [b|1, q_len]: which queries see at least one key (None: all of them). The
        fused kernels give a query without keys uniform weights or garbage; callers zero it.
        O(q + k) for self-attention and key padding; other combinations materialise."""
        if self.k_segments is None:
            return None  # causal / window reach the query's own position, always a key
        if self.same_sequence and q_len == k_len:
            return self.k_segments != 0  # a real query sees itself
        if self.query_segments is None and not self.causal and self.window is None:
            return jnp.any(self.k_segments != 0, axis=-1, keepdims=True)  # (b, 1)
        return jnp.any(self.dense(q_len, k_len), axis=-1)[:, 0]  # (b, q)

    def check(self, q_len: int, k_len: int) -> None:
        """Raises ValueError when the segment ids do not fit the attention's lengths."""
        for name, seg, n in (("query segments", self.query_segments, q_len),
                             ("k_segments", self.k_segments, k_len)):
            if seg is not None and seg.shape[-1] != n:
                raise ValueError(f"MaskSpec: {name} has length {seg.shape[-1]} but the attention "
                                 f"has {n} {'queries' if name[0] == 'q' else 'keys'}")
        if (self.causal or self.window is not None) and k_len < q_len:
            raise ValueError(f"MaskSpec: a causal or windowed mask needs q_len <= k_len, got "
                             f"{q_len} queries and {k_len} keys")


def block_mask(q_pos, k_pos, q_len: int, k_len: int, window_bounds, q_seg=None, k_seg=None):
    """One block of a described mask: bool [b|1, 1, bq, bk].

    Args:
      q_pos, k_pos: int [bq] / [bk], the block's query and key indices (of q_len / k_len;
        indices past the lengths are block padding and masked).
      window_bounds: MaskSpec.window_bounds, (left, right) with None = unbounded.
      q_seg, k_seg: the block's segment ids [b, bq] / [b, bk], or None (as MaskSpec's fields).
    """
    left, right = window_bounds
    q_abs = q_pos + (k_len - q_len)  # (bq,) positions in the key sequence
    keep = (k_pos < k_len)[None, :] & (q_pos < q_len)[:, None]  # (bq, bk)
    if right is not None:
        keep &= k_pos[None, :] <= q_abs[:, None] + right
    if left is not None:
        keep &= k_pos[None, :] >= q_abs[:, None] - left
    keep = keep[None, None]  # (1, 1, bq, bk)
    if k_seg is not None:
        real_k = (k_seg != 0)[:, None, None, :]  # (b, 1, 1, bk)
        keep = keep & real_k
        if q_seg is not None:
            keep = keep & (q_seg[:, None, :, None] == k_seg[:, None, None, :])
    return keep


def _segments(x, name: str) -> jnp.ndarray:
    x = jnp.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"MaskSpec: {name} must be [batch, len], got shape {x.shape}")
    if x.dtype == jnp.bool_:
        return x.astype(jnp.int32)
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise ValueError(f"MaskSpec: {name} must be int or bool (0 = padding), got {x.dtype}")
    return x


def _window(window, causal: bool):
    if window is None:
        return None
    if isinstance(window, int):
        # One number: that many keys either side, or (with causal) that many before.
        return (window, 0 if causal else window)
    left, right = (int(w) for w in window)
    return (left, right)


def materialise(mask, q_len: int, k_len: int):
    """A mask argument as attention layers take it (None, a bool array or a MaskSpec) as a
    dense bool array or None."""
    if isinstance(mask, MaskSpec):
        return mask.dense(q_len, k_len)
    return mask
