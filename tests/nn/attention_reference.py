"""The float64 attention reference the attention backends' tests share."""

import numpy as np


def attention_and_gradients(q, k, v, keep, bias, d_out, keep_dropout=None, rate=0.0):
    """float64 attention over q [b, q, h, d], k / v [b, k, h, d] and its gradients for the
    output cotangent d_out, written out by hand: (out, dq, dk, dv, dbias). `keep` is the bool
    mask (broadcast to [b, h, q, k]); with `keep_dropout` the kept weights are scaled by
    1 / (1 - rate) and the rest dropped. Fully-masked rows give zeros."""
    q, k, v, d_out = (np.asarray(x, np.float64) for x in (q, k, v, d_out))
    scale = q.shape[-1] ** -0.5
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    keep = np.broadcast_to(keep, s.shape)
    top = np.where(keep, s, -np.inf).max(-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.where(keep, np.exp(s - top), 0.0)
    den = e.sum(-1, keepdims=True)
    w = np.divide(e, den, out=np.zeros_like(e), where=den > 0)  # fully-masked rows: 0
    z = 1.0 if keep_dropout is None else keep_dropout / (1.0 - rate)
    out = np.einsum("bhqk,bkhd->bqhd", w * z, v)
    dv = np.einsum("bhqk,bqhd->bkhd", w * z, d_out)
    dw = np.einsum("bqhd,bkhd->bhqk", d_out, v) * z
    ds = w * (dw - np.sum(dw * w, axis=-1, keepdims=True))
    dq = np.einsum("bhqk,bkhd->bqhd", ds, k) * scale
    dk = np.einsum("bhqk,bqhd->bkhd", ds, q) * scale
    dbias = None
    if bias is not None:
        axes = tuple(a for a in range(4) if np.shape(bias)[a] == 1)
        dbias = ds.sum(axis=axes, keepdims=True)
    return out, dq, dk, dv, dbias
