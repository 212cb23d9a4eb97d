"""Boolean attention masks, shape [batch, 1, q_len, k_len], True = the query may attend the key.

Masks are built once at the top of a model and passed down; the singleton axis 1 broadcasts over
heads. They stay boolean all the way to the softmax: an additive -inf/-1e9 bias goes in the
separate `bias` argument of the attention layers, never in a mask, so a wrong kind of mask fails
loudly instead of silently attending everywhere.
"""

import jax
import jax.numpy as jnp
import numpy as np


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
