"""Multi-head scaled dot-product attention with a KV cache for autoregressive decoding.

Interchangeable backends compute the same function:

* "einsum": logits, softmax and the weighted sum written out. It materialises the [b, h, q, k]
  weights, so it is the path that can return them or sow them. Memory O(q k).
* "blockwise": exact attention over key/value blocks with an online softmax and a recomputing
  backward pass (zoo.nn.blockwise_attention): memory O(q + k), pure JAX, every device; every
  mask kind, bias and attention dropout. On a mesh it runs per device (shard_map over the
  batch rows and heads the logical rules split), so each device skips blocks on its own rows
  and its block loops hold no collective.
* "dot_product": `jax.nn.dot_product_attention` with JAX's default implementation (XLA).
* "cudnn", "pallas_gpu", "splash": the accelerator kernels jax ships (cuDNN's fused attention
  and Pallas flash attention on GPU, Splash attention on TPU; zoo.nn.attention_kernels says
  which masks each takes).
Whenever the weights themselves are needed (`return_weights`, `sow_weights`, and dropout on them
with "dot_product") the layer runs the einsum path instead: same parameters, same result. The
accelerator kernels have no attention dropout and refuse it rather than fall back to O(q k).

Masks are boolean (True = attend) or a `MaskSpec` description (segment ids, causal, a local
window), which the einsum and XLA backends materialise and the others evaluate block by block
or translate into their own forms, so a long input never builds an n x n mask. An additive
float bias is a separate argument. A query whose keys are all masked gets zero weights and so a
zero attention output (the output projection's bias alone) in every backend;
`jax.nn.dot_product_attention` by itself would give such rows uniform weights.
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.errors import ConfigError
from zoo.nn import attention_kernels
from zoo.nn.blockwise_attention import blockwise_attention
from zoo.nn.linear import Dense, default_kernel_init
from zoo.nn.masks import MaskSpec, masked_softmax
from zoo.nn.precision import broadcast_param, param_einsum

Dtype = Any
Initializer = Any

_KERNELS = ("cudnn", "pallas_gpu", "splash")  # the accelerator kernels (attention_kernels)
_BACKENDS = ("einsum", "blockwise", "dot_product") + _KERNELS
_QKV_AXES = ("act_batch", "act_len", "act_heads", "act_kv")


class MultiHeadAttention(nn.Module):
    """Multi-head attention softmax(q k^T / sqrt(d) + bias) v over `num_heads` heads.

    Attributes:
      num_heads: number of heads h.
      head_dim: width of each head; default inputs_q width // num_heads.
      out_features: output width; default the inputs_q width.
      dropout_rate: dropout on the attention weights (training only, 'dropout' rng).
      use_bias: biases on the q/k/v/out projections.
      backend: "einsum", "blockwise" (O(n) memory, any device), "dot_product"
        (`jax.nn.dot_product_attention`), "cudnn" (its cuDNN kernel), "pallas_gpu" or "splash"
        (the Pallas kernels for GPU / TPU).
      block_q, block_k: query / key block sizes of the blockwise and Pallas backends.
      interpret: run the Pallas kernels in interpret mode (on CPU, for tests).
      decode: autoregressive decoding with a KV cache in the 'cache' collection. `init` with a
        full-length input creates the cache (its length is the maximum length); each later
        `apply(..., mutable=['cache'])` with a chunk of L >= 1 new tokens writes their keys and
        values at `cache_index`, attends causally over every cached position, and advances
        the index by L. Only self-attention is cached: with `inputs_kv` given (cross-attention
        to an encoder output) the layer attends over `inputs_kv` in full on every call.
      dtype: compute dtype; logits and softmax are float32 regardless.
      param_dtype: parameter dtype.
      kernel_init: initialiser of the four projection kernels.
      out_kernel_init: the output projection's initialiser instead (None = kernel_init), for
        models that scale the projections writing into the residual stream (GPT-2).
    """

    num_heads: int
    head_dim: int | None = None
    out_features: int | None = None
    dropout_rate: float = 0.0
    use_bias: bool = True
    backend: str = "einsum"
    block_q: int = 512
    block_k: int = 512
    interpret: bool = False
    decode: bool = False
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = default_kernel_init
    out_kernel_init: Initializer | None = None

    @nn.compact
    def __call__(self, inputs_q, inputs_kv=None, *, mask=None, bias=None, deterministic=True,
                 return_weights=False, sow_weights=False):
        """Attends inputs_q [b, q, d] over inputs_kv [b, k, d_kv] (None = self-attention).

        Args:
          inputs_q: queries [b, q, d].
          inputs_kv: keys/values source [b, k, d_kv]; None attends over inputs_q.
          mask: bool broadcastable to [b, h, q, k], True = attend (in decode mode k is the cache
            length; combined with the cache's causal mask), or a MaskSpec describing it (not in
            decode mode).
          bias: float broadcastable to [b, h, q, k] (k the cache length in decode mode), added
            to the float32 logits (relative position biases, ALiBi). Keep it finite:
            exclusions belong in `mask`.
          deterministic: no dropout when True.
          return_weights: also return the attention weights [b, h, q, k] (in `dtype`).
          sow_weights: store the weights in 'intermediates'/'attention_weights'.

        Returns:
          out [b, q, out_features] in `dtype`, or (out, weights) when return_weights.
        """
        if self.backend not in _BACKENDS:
            raise ConfigError(
                f"MultiHeadAttention: backend={self.backend!r}; use one of {_BACKENDS}"
            )
        if inputs_q.ndim != 3:
            raise ValueError(f"MultiHeadAttention: inputs_q must be [batch, len, features], got "
                             f"shape {inputs_q.shape}")
        features = inputs_q.shape[-1]
        head_dim = self.head_dim
        if head_dim is None:
            if features % self.num_heads:
                raise ConfigError(
                    f"MultiHeadAttention: inputs_q width {features} is not divisible by "
                    f"num_heads={self.num_heads}; set head_dim explicitly or change num_heads"
                )
            head_dim = features // self.num_heads
        out_features = self.out_features or features
        self_attention = inputs_kv is None
        inputs_kv = inputs_q if self_attention else inputs_kv
        spec = mask if isinstance(mask, MaskSpec) else None
        mask = None if mask is None or spec is not None else jnp.asarray(mask)
        if mask is not None and mask.dtype != jnp.bool_:
            raise ValueError(f"MultiHeadAttention: mask must be boolean (True = attend), got "
                             f"{mask.dtype}; pass additive float masks as `bias`")
        if (spec is not None and self.decode and self_attention
                and spec.k_segments is not None):
            raise ValueError("MultiHeadAttention(decode=True): the cache builds its causal mask "
                             "itself; pass padding as a dense mask, and a MaskSpec only for a "
                             "local window")

        proj = functools.partial(
            Dense, features=(self.num_heads, head_dim), kernel_axes=("embed", "heads", "kv"),
            use_bias=self.use_bias, dtype=self.dtype, param_dtype=self.param_dtype,
            kernel_init=self.kernel_init,
        )
        if self_attention:
            query, key, value = _fused_qkv(
                [proj(name=name)(inputs_q, params_only=True)
                 for name in ("query", "key", "value")], inputs_q, self.dtype)
        else:
            query = proj(name="query")(inputs_q)  # (B, T, H, D)
            key = proj(name="key")(inputs_kv)  # (B, S, H, D)
            value = proj(name="value")(inputs_kv)  # (B, S, H, D)
        query = nn.with_logical_constraint(query, _QKV_AXES)
        key = nn.with_logical_constraint(key, _QKV_AXES)
        value = nn.with_logical_constraint(value, _QKV_AXES)

        if self.decode and self_attention:
            key, value, mask, spec = self._update_cache(key, value, mask, spec)

        mask = _as_4d(mask)
        bias = None if bias is None else _as_4d(jnp.asarray(bias, jnp.float32))
        dropout = not deterministic and self.dropout_rate > 0.0
        if dropout and self.backend in _KERNELS:
            # A silent fall-back to the O(q k) einsum path would defeat choosing a kernel.
            raise ConfigError(
                f"MultiHeadAttention: backend={self.backend!r} has no attention dropout; set "
                "attention_dropout_rate=0 (config.model.attention_dropout_rate) or use "
                "backend='blockwise', which drops out block by block")
        einsum = (self.backend == "einsum" or return_weights or sow_weights
                  or (dropout and self.backend == "dot_product"))
        weights = None
        if einsum:
            if spec is not None:
                mask = spec.dense(query.shape[1], key.shape[1])
            out, weights = self._einsum(query, key, value, mask, bias, dropout)
            if sow_weights:
                self.sow("intermediates", "attention_weights", weights)
        elif self.backend == "blockwise":
            out = blockwise_attention(
                query, key, value, spec=spec, mask=mask, bias=bias,
                dropout_rate=self.dropout_rate if dropout else 0.0,
                dropout_rng=self.make_rng("dropout") if dropout else None,
                block_q=self.block_q, block_k=self.block_k)
        else:
            out = self._fused(query, key, value, spec, mask, bias)

        out = Dense(
            out_features, ("heads", "kv", "embed"), num_in=2, use_bias=self.use_bias,
            dtype=self.dtype, param_dtype=self.param_dtype,
            kernel_init=self.kernel_init if self.out_kernel_init is None else self.out_kernel_init,
            name="out",
        )(out)  # (B, T, H, D) -> (B, T, E)
        out = nn.with_logical_constraint(out, ("act_batch", "act_len", "act_embed"))
        return (out, weights) if return_weights else out

    def _einsum(self, query, key, value, mask, bias, dropout):
        scale = jnp.float32(query.shape[-1]) ** -0.5
        # Logits accumulate in float32 even for bf16 q/k.
        # (B, T, H, D) x (B, S, H, D) -> (B, H, T, S)
        logits = jnp.einsum("bthd,bshd->bhts", query, key,
                            preferred_element_type=jnp.float32) * scale
        if bias is not None:
            logits = logits + bias
        weights = masked_softmax(logits, mask)  # (B, H, T, S) float32, 0 on fully-masked rows
        if dropout:
            keep = jax.random.bernoulli(self.make_rng("dropout"), 1.0 - self.dropout_rate,
                                        weights.shape)
            weights = jnp.where(keep, weights / (1.0 - self.dropout_rate), 0.0)
        weights = weights.astype(self.dtype)
        out = jnp.einsum("bhts,bshd->bthd", weights, value)  # (B, T, H, D)
        return out, weights

    def _fused(self, query, key, value, spec, mask, bias):
        if self.backend == "cudnn":
            return attention_kernels.cudnn_attention(query, key, value, spec=spec, mask=mask,
                                                     bias=bias)
        if self.backend == "pallas_gpu":
            return attention_kernels.pallas_gpu_attention(
                query, key, value, spec=spec, mask=mask, bias=bias, interpret=self.interpret,
                block_q=min(self.block_q, 128), block_k=min(self.block_k, 128))
        if self.backend == "splash":
            return attention_kernels.splash_attention(
                query, key, value, spec=spec, mask=mask, bias=bias, block_q=self.block_q,
                block_k=self.block_k, interpret=self.interpret)
        if spec is not None:
            mask = spec.dense(query.shape[1], key.shape[1])
        out = jax.nn.dot_product_attention(query, key, value, bias=bias, mask=mask)  # (B, T, H, D)
        if mask is None:
            return out
        # The fused kernel gives a fully-masked row uniform weights (every logit equally -big);
        # zero those rows so both backends agree and padding queries carry nothing.
        any_key = jnp.any(mask, axis=-1)  # (B|1, H|1, T|1)
        any_key = jnp.broadcast_to(any_key, (out.shape[0], out.shape[2], out.shape[1]))
        return jnp.where(jnp.swapaxes(any_key, 1, 2)[..., None], out, 0).astype(out.dtype)

    def _update_cache(self, key, value, mask, spec):
        """Writes this chunk's key/value into the cache; returns the full cache and its mask
        (a MaskSpec's local window applied to the cached positions, the spec then spent)."""
        is_initialized = self.has_variable("cache", "cached_key")
        cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
        cached_value = self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
        cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
        if not is_initialized:
            # `init`: the input's length defines the cache; attend over the input as given.
            return key, value, mask, spec
        batch, max_len, heads, head_dim = cached_key.value.shape
        chunk = key.shape[1]
        if key.shape != (batch, chunk, heads, head_dim) or chunk > max_len:
            raise ValueError(
                f"MultiHeadAttention(decode=True): got keys {key.shape} for a cache of "
                f"{cached_key.value.shape}; decode chunks must be [batch, L <= {max_len}, ...] "
                "with the batch size used at init"
            )
        # Positions past max_len cannot be written (dynamic_update_slice clamps the start); the
        # caller's decode loop must stop at max_len.
        index = cache_index.value
        start = (0, index, 0, 0)
        cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, key, start)
        cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, value, start)
        cache_index.value = index + chunk
        # Chunk query i sits at position index + i and sees cached positions j <= index + i;
        # positions not yet written (j > index + L - 1) are therefore never attended.
        positions = jnp.arange(max_len)[None, :]  # (1, max_len)
        query_positions = index + jnp.arange(chunk)[:, None]  # (L, 1)
        causal = positions <= query_positions  # (L, max_len)
        left = None if spec is None else spec.window_bounds[0]
        if left is not None:
            causal &= positions >= query_positions - left
        causal = causal[None, None]  # (1, 1, L, max_len)
        mask = causal if mask is None else jnp.logical_and(_as_4d(mask), causal)
        return cached_key.value, cached_value.value, mask, None


def _fused_qkv(projections, x, dtype):
    """q, k, v [B, T, H, D] of self-attention as one matmul with the three kernels side by side
    (the parameters stay `query`, `key`, `value`, as the reference checkpoints name them).

    Why: with heads split over the tensor axis, each projection's input gradient is a partial
    sum over the heads a device holds. Three separate einsums leave three partial sums, which
    XLA's partitioner all-reduces one by one (measured on XLA:CPU and the TPU compiler, jax
    0.10.2: 2.25 activation-sized all-reduces per layer where Megatron's layout has one); one
    einsum leaves one, reduced once.
    """
    kernel = jnp.stack([k for k, _ in projections], axis=1)  # (E, 3, H, D), param dtype
    # In `dtype`, the kernels' gradients summed in float32 as every Dense's (zoo.nn.precision).
    qkv = param_einsum("btm,mjhd->btjhd", x, kernel, dtype)  # (B, T, 3, H, D)
    biases = [b for _, b in projections]
    if biases[0] is not None:
        qkv = qkv + broadcast_param(jnp.stack(biases), qkv.shape, dtype)  # (3, H, D)
    return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]


def check_attention_fields(owner: str, block: int, window: int) -> None:
    """A model config's attention_block (>= 1) and attention_window (0 = none, else >= 1)."""
    if block < 1:
        raise ConfigError(f"{owner}: attention_block={block}; the blockwise and Pallas "
                          "backends need a block size >= 1 (512 is a good default)")
    if window < 0:
        raise ConfigError(f"{owner}: attention_window={window}; use 0 (full attention) or the "
                          "number of tokens each token sees on a side")


def _as_4d(x):
    """Left-pads a mask/bias to rank 4 ([b, h, q, k]) so it broadcasts the documented way."""
    if x is None:
        return None
    if x.ndim > 4:
        raise ValueError(f"MultiHeadAttention: mask/bias must broadcast to [b, h, q, k], got "
                         f"rank {x.ndim} shape {x.shape}")
    return x.reshape((1,) * (4 - x.ndim) + x.shape)
