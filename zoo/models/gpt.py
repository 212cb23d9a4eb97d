"""GPT-2 style decoder-only language model: pre-LN blocks, learned positions, tied output.

Submodule names follow Hugging Face GPT-2 (`wte`, `wpe`, `h`, `ln_f`) so checkpoint conversion
is a rename table.
"""

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from zoo.errors import ConfigError
from zoo.models import config_checks
from zoo.models.runtime_fields import RuntimeFields
from zoo.nn.attention import check_attention_fields
from zoo.nn.embeddings import Embed, LearnedPositionalEmbedding
from zoo.nn.masks import MaskSpec
from zoo.nn.transformer import TransformerDecoder, stack_activation_bytes


@dataclasses.dataclass(frozen=True)
class GPTConfig(RuntimeFields):
    vocab_size: int
    max_len: int = 1024
    num_layers: int = 12
    num_heads: int = 12
    embed_dim: int = 768
    mlp_dim: int = 3072
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    layer_norm_epsilon: float = 1e-5
    # Standard deviation of every weight matrix and embedding table at initialisation (HF's
    # `initializer_range`); the projections into the residual stream get
    # initializer_range / sqrt(2 * num_layers), as GPT-2 draws them.
    initializer_range: float = 0.02

    def __post_init__(self):
        check_attention_fields("GPTConfig", self.attention_block, self.attention_window)


# (num_layers, num_heads, embed_dim); mlp_dim is 4 * embed_dim as in GPT-2.
SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 4, 64),
    "124M": (12, 12, 768),
    "355M": (24, 16, 1024),
    "774M": (36, 20, 1280),
}


def config_for_size(size: str, **overrides: Any) -> GPTConfig:
    if size not in SIZES:
        raise ConfigError(f"config.model.size: unknown GPT size {size!r}; choose from "
                          f"{list(SIZES)}")
    layers, heads, dim = SIZES[size]
    kw = dict(num_layers=layers, num_heads=heads, embed_dim=dim, mlp_dim=4 * dim)
    kw.update(overrides)
    return GPTConfig(**kw)


def weight_inits(config: GPTConfig) -> tuple[nn.initializers.Initializer,
                                             nn.initializers.Initializer]:
    """(every kernel and embedding table, the residual projections' kernels): GPT-2's
    N(0, 0.02^2) and N(0, (0.02 / sqrt(2 L))^2), the attention output and the feed-forward `wo`
    being the two projections per layer that add into the residual stream. zoo.nn's own default,
    fan-in scaled lecun_normal, draws std 0.088 at width 128 (0.044 for `wo`)."""
    std = config.initializer_range
    return (nn.initializers.normal(stddev=std),
            nn.initializers.normal(stddev=std / math.sqrt(2 * config.num_layers)))


def flops_per_token(config: GPTConfig, seq_len: int) -> float:
    """Training FLOPs per token of `seq_len`-token rows, for MFU and the dry run: 6N (forward 2N
    + backward 4N per token over the matmul weights, the tied output projection included) +
    the attention scores and weighted values: 2 * 2 * T * d per layer forward, x3 with backward,
    halved because a causal query sees on average half the keys."""
    d, layers, t = config.embed_dim, config.num_layers, seq_len
    per_layer = 4 * d * d + 2 * d * config.mlp_dim  # q, k, v, out + the two FFN matrices
    n = layers * per_layer + config.vocab_size * d
    attention = 3 * 2 * 2 * t * d * layers / 2
    return 6.0 * n + attention


def activation_bytes(config: GPTConfig, batch: int, seq_len: int, tensor_parallel: int
                     ) -> float:
    """Activation memory one device keeps for the backward pass of a `batch`-row micro-batch
    (the dry run): the decoder stack (zoo.nn.transformer.stack_activation_bytes) and the
    output's float32 [B, T, V] buffers, split over vocab by tensor parallelism: two live at
    once (zoo.contract.losses: the logits and exp(logits - max), then that and the logits'
    gradient, then the gradient and its transpose for the tied embedding's)."""
    stack = stack_activation_bytes(
        batch, seq_len, config.embed_dim, config.num_heads, config.num_layers, config.mlp_dim,
        jnp.dtype(config.dtype).itemsize, config.remat, tensor_parallel, config.backend)
    logits = 2 * batch * seq_len * config.vocab_size * 4 / tensor_parallel
    return stack + logits


class GPT(nn.Module):
    config: GPTConfig
    decode: bool = False

    @nn.compact
    def __call__(self, tokens, *, positions=None, segment_ids=None, deterministic=True,
                 sow_weights=False, extra_embeddings=None, return_hidden=False):
        """tokens [B, T] int -> logits [B, T, V] (float32).

        positions/segment_ids [B, T] come from packing; segment ids keep attention inside each
        document (0 = padding). In decode mode the causal part is the KV cache's job.
        sow_weights stores every layer's attention weights [B, heads, T, T] in 'intermediates'
        (apply with mutable=['intermediates']; zoo.eval.attention_maps reads them).
        extra_embeddings [K, D]: input rows for ids V .. V+K-1, tokens outside the vocabulary
        (fine-tuning's delimiter / extract tokens, zoo.models.gpt_classifier); logits still
        cover the V vocabulary tokens only.
        return_hidden: return (logits, hidden [B, T, D]), hidden being the final states after
        ln_f (what the output layer reads).
        """
        cfg = self.config
        config_checks.check_length("GPT", tokens.shape[1], cfg.max_len, "GPTConfig.max_len",
                                   "config.data.seq_len, or the init_from checkpoint's")
        dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        weight_init, residual_init = weight_inits(cfg)
        wte = Embed(cfg.vocab_size, cfg.embed_dim, dtype=dtype, param_dtype=param_dtype,
                    embedding_init=weight_init, name="wte")
        embedded = wte(tokens)
        if extra_embeddings is not None:
            # Embed clamps ids >= V to the last row; those positions take their extra row.
            extra = jnp.take(extra_embeddings, tokens - cfg.vocab_size, axis=0, mode="clip")
            embedded = jnp.where((tokens >= cfg.vocab_size)[..., None],
                                 extra.astype(dtype), embedded)  # (B, T, D)
        x = LearnedPositionalEmbedding(
            cfg.max_len, cfg.embed_dim, decode=self.decode, dtype=dtype, param_dtype=param_dtype,
            embedding_init=weight_init, name="wpe",
        )(embedded, positions=positions)
        x = nn.Dropout(cfg.dropout_rate)(x, deterministic=deterministic)

        # Causal, within each packed document, and (attention_window > 0) only the previous
        # attention_window tokens; in decode mode the KV cache adds the causal part itself.
        window = cfg.attention_window or None
        if self.decode:
            mask = MaskSpec.self_attention(causal=True, window=window) if window else None
        else:
            mask = MaskSpec.self_attention(segment_ids, causal=True, window=window,
                                           packed=segment_ids is not None)
        x = TransformerDecoder(
            num_layers=cfg.num_layers,
            num_heads=cfg.num_heads,
            mlp_dim=cfg.mlp_dim,
            activation="gelu_tanh",
            dropout_rate=cfg.dropout_rate,
            attention_dropout_rate=cfg.attention_dropout_rate,
            layer_norm_epsilon=cfg.layer_norm_epsilon,
            norm_position="pre",
            cross_attention=False,
            decode=self.decode,
            backend=cfg.backend,
            attention_block=cfg.attention_block,
            scan_layers=cfg.scan_layers,
            scan_unroll=cfg.scan_unroll,
            remat=cfg.remat,
            dtype=dtype,
            param_dtype=param_dtype,
            kernel_init=weight_init,
            out_kernel_init=residual_init,
            name="h",
        )(x, self_mask=mask, deterministic=deterministic, sow_weights=sow_weights)
        # The decoder stack ends with the pre-LN final LayerNorm (GPT-2's ln_f).
        logits = wte.attend(x)
        logits = nn.with_logical_constraint(logits, ("act_batch", "act_len", "act_vocab"))
        if return_hidden:
            return logits.astype(jnp.float32), x
        return logits.astype(jnp.float32)
