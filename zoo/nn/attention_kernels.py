"""The accelerator attention kernels jax ships, behind zoo's mask description (MaskSpec).

* cuDNN (GPU): `jax.nn.dot_product_attention(implementation="cudnn")`. Causal and the local
  window map to its is_causal / local_window_size; padding (segment ids 1 = token, 0 = trailing
  padding: MaskSpec.packed False) to sequence lengths. Packed documents have no cuDNN form in
  jax's API: they go in as a dense mask (O(q k) memory; prefer 'pallas_gpu' or 'blockwise').
* Pallas flash attention on GPU (`jax.experimental.pallas.ops.gpu.attention.mha`, Triton):
  self-attention with segment ids (padding and packing) and causal; no window, no bias, no
  dense mask, no key-only padding (one segment array serves queries and keys).
* Splash attention on TPU (`jax.experimental.pallas.ops.tpu.splash_attention`, as MaxText
  uses it): causal / local window as its static mask objects, separate query and key segment
  ids (padding, packing, cross-attention over a padded source); no bias, no dense mask. Its
  blocks must divide the lengths.

Every kernel gives a query without a visible key some output of its own (uniform weights, or
whatever its padding segment sees); those rows are zeroed here, as in the einsum backend. Both
Pallas kernels take `interpret=True` to run on CPU (slow; tests only).

XLA cannot partition a Pallas kernel (a Mosaic or Triton custom call) over a mesh by itself, so
on a mesh of several devices the Pallas kernels run under `jax.shard_map`, each device on its
own batch rows and heads, as the activations' logical axes shard them (as MaxText wires
Splash). The sequence axis must not be sharded for them.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from zoo.errors import ConfigError
from zoo.nn.masks import MaskSpec

# The logical axes of q / k / v [batch, len, heads, head_dim], as MultiHeadAttention names them.
QKV_AXES = ("act_batch", "act_len", "act_heads", "act_kv")


def cudnn_attention(query, key, value, *, spec: MaskSpec | None = None, mask=None, bias=None):
    """[b, q, h, d] attention through cuDNN's fused kernel (GPU only; fp16 / bf16)."""
    spec = spec if spec is not None else MaskSpec()
    q_len, k_len = query.shape[1], key.shape[1]
    spec.check(q_len, k_len)
    _check_cudnn_supports(query.dtype, spec)
    lengths = {}
    if spec.k_segments is not None and not spec.packed:
        # Padding as lengths: real tokens first, then padding (zoo's featurizers pad at the end).
        lengths["key_value_seq_lengths"] = jnp.sum(spec.k_segments != 0, axis=-1, dtype=jnp.int32)
        if spec.query_segments is not None:
            lengths["query_seq_lengths"] = jnp.sum(spec.query_segments != 0, axis=-1,
                                                   dtype=jnp.int32)
    elif spec.k_segments is not None:
        # Packed: only a dense mask expresses it (the positional part stays in the flags).
        segments_only = MaskSpec(spec.q_segments, spec.k_segments, spec.same_sequence,
                                 packed=True)
        mask = _and(mask, segments_only.dense(q_len, k_len))
    out = jax.nn.dot_product_attention(
        query, key, value, bias=bias, mask=mask, is_causal=spec.causal,
        local_window_size=spec.window, implementation="cudnn", **lengths)
    return _zero_rows_without_keys(out, spec, mask, q_len, k_len)


def _check_cudnn_supports(dtype, spec: MaskSpec) -> None:
    """What jax's cuDNN path would refuse with its own exception deep in the trace (seen on an
    H100, benchmarks/results/gpu-nvidia-h100-80gb-hbm3/attention_check.md), said as a
    ConfigError naming the way out."""
    if jnp.dtype(dtype) not in (jnp.float16, jnp.bfloat16):
        raise ConfigError(
            f"backend='cudnn' computes in float16 / bfloat16 only (cuDNN's fused kernel); the "
            f"attention inputs are {jnp.dtype(dtype).name}: set the model's dtype to bfloat16, "
            "or use 'pallas_gpu' or 'blockwise' for float32")
    left, right = spec.window_bounds
    if right not in (None, 0):
        raise ConfigError(
            f"backend='cudnn' takes a causal (left-only) local window; this mask's window "
            f"reaches {right} keys to the right: make the window causal or use 'blockwise' "
            "(every mask kind, any bias, O(n) memory)")


def pallas_gpu_attention(query, key, value, *, spec: MaskSpec | None = None, mask=None,
                         bias=None, block_q: int = 128, block_k: int = 128,
                         interpret: bool = False):
    """[b, q, h, d] attention through jax's Pallas (Triton) flash attention for GPUs."""
    from jax.experimental.pallas.ops.gpu import attention as gpu_attention  # GPU-only import

    spec = spec if spec is not None else MaskSpec()
    q_len, k_len = query.shape[1], key.shape[1]
    spec.check(q_len, k_len)
    _refuse("pallas_gpu", mask=mask, bias=bias, window=spec.window)
    if q_len != k_len or (spec.k_segments is not None and not spec.same_sequence):
        raise ConfigError(
            "backend='pallas_gpu' runs self-attention only (one segment-id array for queries "
            "and keys); use 'cudnn' or 'blockwise' for cross-attention or key-only padding")
    sizes = gpu_attention.BlockSizes(
        block_q=min(block_q, q_len), block_k=min(block_k, k_len),
        block_q_dkv=min(32, q_len), block_kv_dkv=min(32, k_len),
        block_q_dq=min(32, q_len), block_kv_dq=min(32, k_len))
    def kernel(q, k, v, segments):
        return gpu_attention.mha(q, k, v, segments, sm_scale=float(q.shape[-1]) ** -0.5,
                                 causal=spec.causal, block_sizes=sizes, interpret=interpret)

    out = _per_shard(kernel, "pallas_gpu", query, key, value, spec.k_segments)
    return _zero_rows_without_keys(out, spec, None, q_len, k_len)


def splash_attention(query, key, value, *, spec: MaskSpec | None = None, mask=None, bias=None,
                     block_q: int = 512, block_k: int = 512, interpret: bool = False):
    """[b, q, h, d] attention through jax's Splash attention kernel for TPUs."""
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as splash, splash_attention_mask as splash_mask)

    spec = spec if spec is not None else MaskSpec()
    batch, q_len, _, dim = query.shape
    k_len = key.shape[1]
    spec.check(q_len, k_len)
    _refuse("splash", mask=mask, bias=bias)
    block_q, block_k = min(block_q, q_len), min(block_k, k_len)
    if q_len % block_q or k_len % block_k:
        raise ConfigError(
            f"backend='splash' needs its blocks to divide the lengths: {q_len} queries, "
            f"{k_len} keys, blocks {block_q} x {block_k}; pad the inputs to a multiple of the "
            "block (128 on TPU) or use 'blockwise'")
    sizes = splash.BlockSizes(
        block_q=block_q, block_kv=block_k, block_kv_compute=block_k, block_q_dkv=block_q,
        block_kv_dkv=block_k, block_kv_dkv_compute=block_k, block_q_dq=block_q,
        block_kv_dq=block_k)
    head_mask = _splash_mask(splash_mask, spec, q_len, k_len)
    q_ids = k_ids = None
    if spec.k_segments is not None:
        q_ids, k_ids = spec.query_segments, spec.k_segments
        if q_ids is None:  # key padding only: every query is real (1) and sees the real keys
            q_ids, k_ids = jnp.ones((batch, q_len), jnp.int32), (k_ids != 0)
        q_ids, k_ids = q_ids.astype(jnp.int32), k_ids.astype(jnp.int32)

    def kernel(q, k, v, q_ids, k_ids):
        # Built per shard: its MultiHeadMask has this device's heads.
        mha = splash.make_splash_mha(
            splash_mask.MultiHeadMask([head_mask] * q.shape[2]), block_sizes=sizes,
            head_shards=1, q_seq_shards=1, interpret=interpret)
        # Splash takes [heads, len, dim] per example and leaves the 1/sqrt(d) scale to us.
        q = q * jnp.asarray(dim ** -0.5, q.dtype)
        to_heads = lambda x: jnp.swapaxes(x, 1, 2)  # (B, L, H, D) -> (B, H, L, D)
        if q_ids is None:
            out = jax.vmap(mha)(to_heads(q), to_heads(k), to_heads(v))
        else:
            out = jax.vmap(mha)(to_heads(q), to_heads(k), to_heads(v),
                                segment_ids=splash.SegmentIds(q=q_ids, kv=k_ids))
        return jnp.swapaxes(out, 1, 2).astype(v.dtype)  # (B, Q, H, D)

    out = _per_shard(kernel, "splash", query, key, value, q_ids, k_ids)
    return _zero_rows_without_keys(out, spec, None, q_len, k_len)


def _splash_mask(splash_mask, spec: MaskSpec, q_len: int, k_len: int):
    """The positional part of `spec` as one of Splash's static (numpy-described) masks."""
    shape = (q_len, k_len)
    offset = k_len - q_len  # MaskSpec: the queries are the last q_len key positions
    left, right = spec.window_bounds
    if left is None and right is None:
        return splash_mask.FullMask(shape)
    if left is None and right == 0:
        return splash_mask.CausalMask(shape, offset=offset)
    return splash_mask.LocalMask(shape, window_size=(left, right), offset=offset)


def _per_shard(kernel, backend: str, query, key, value, *segments):
    """kernel(q, k, v, *segments) on each device's batch rows and heads (shard_map) when a mesh
    of several devices is in context; called directly otherwise."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return kernel(query, key, value, *segments)
    batch, length, heads, _ = nn.logical_to_mesh_axes(QKV_AXES)
    if length is not None:
        raise ConfigError(
            f"backend={backend!r} needs whole sequences on each device, but the mesh rules "
            f"shard act_len over {length!r}; map act_len to None in config.mesh.rules or use "
            "'blockwise'")
    qkv = PartitionSpec(batch, None, heads, None)
    rows = PartitionSpec(batch, None)
    in_specs = (qkv, qkv, qkv) + tuple(None if s is None else rows for s in segments)
    return jax.shard_map(kernel, mesh=mesh, in_specs=in_specs, out_specs=qkv,
                         check_vma=False)(query, key, value, *segments)


def _refuse(backend: str, **given) -> None:
    what = {"mask": "dense masks", "bias": "additive biases", "window": "local windows"}
    for name, value in given.items():
        if value is not None:
            raise ConfigError(
                f"backend={backend!r} takes no {what[name]}; use 'blockwise' (every mask kind, "
                "any bias, O(n) memory) or 'einsum'")


def _and(a, b):
    return b if a is None else jnp.logical_and(a, b)


def _zero_rows_without_keys(out, spec: MaskSpec, mask, q_len: int, k_len: int):
    """Zeroes the output of queries that see no key (`spec` and the dense `mask` together)."""
    if mask is None:
        has_key = spec.query_has_key(q_len, k_len)  # (B|1, Q) or None: O(q + k)
    else:  # a dense mask is O(q k) already: combine it with the description and reduce
        has_key = jnp.any(jnp.logical_and(mask, spec.dense(q_len, k_len)), axis=(1, -1))
    if has_key is None:
        return out
    has_key = jnp.broadcast_to(has_key, (out.shape[0], q_len))
    return jnp.where(has_key[:, :, None, None], out, np.zeros((), out.dtype))
