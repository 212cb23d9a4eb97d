"""The Transformer encoder-decoder's config (zoo.models.encoder_decoder): TransformerConfig and
its checks, the paper's named sizes, the training FLOPs per token the MFU is computed from and
the activation memory the dry run counts. zoo.models.encoder_decoder re-exports every name here.
"""

import dataclasses
from typing import Any

import jax.numpy as jnp

from zoo.data.tokenizers.base import BOS_ID, EOS_ID, PAD_ID
from zoo.errors import ConfigError
from zoo.models.runtime_fields import RuntimeFields
from zoo.nn.attention import check_attention_fields
from zoo.nn.transformer import stack_activation_bytes

SHARE_EMBEDDINGS = ("all", "target", "none")
POSITIONS = ("sinusoidal", "learned")


@dataclasses.dataclass(frozen=True)
class TransformerConfig(RuntimeFields):
    """The encoder-decoder's hyperparameters (defaults: the paper's base model).

    Attributes:
      vocab_size: one joint source/target vocabulary (needed by share_embeddings='all').
      source_vocab_size, target_vocab_size: separate vocabularies; each defaults to vocab_size.
      hidden_size: d_model.
      num_encoder_layers, num_decoder_layers: N of each stack.
      num_heads: h; hidden_size must be divisible by it.
      mlp_dim: d_ff, the feed-forward width.
      dropout_rate: P_drop on every sublayer output and on the embedding + position sums.
      attention_dropout_rate: dropout on attention weights (none in the paper; tensor2tensor's
        later settings use 0.1).
      activation: feed-forward activation, 'relu' as the paper.
      layer_norm_epsilon: 1e-6 as tensor2tensor.
      max_len: longest source or target (BOS included) sequence: the learned position table's
        rows and the cap on `translate`'s output length.
      norm_position: 'post' (the paper) or 'pre' (each stack then ends with a LayerNorm).
      share_embeddings: 'all', 'target' or 'none' (see the module docstring).
      positions: 'sinusoidal' (the paper) or 'learned'.
      backend, attention_block, scan_layers, scan_unroll, remat: as zoo.nn.transformer's
        stacks.
      attention_window: 0 = full attention; w > 0: each source token sees the w tokens either
        side of it, each target token the w before it (cross-attention stays full).
      dtype, param_dtype: compute and parameter dtypes by name ('float32', 'bfloat16').
      pad_id, bos_id, eos_id: special ids; the target input starts with bos_id.
    """

    vocab_size: int | None = None
    source_vocab_size: int | None = None
    target_vocab_size: int | None = None
    hidden_size: int = 512
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    num_heads: int = 8
    mlp_dim: int = 2048
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.0
    activation: str = "relu"
    layer_norm_epsilon: float = 1e-6
    max_len: int = 256
    norm_position: str = "post"
    share_embeddings: str = "all"
    positions: str = "sinusoidal"
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID

    def __post_init__(self):
        if self.share_embeddings not in SHARE_EMBEDDINGS:
            raise ConfigError(
                f"TransformerConfig: share_embeddings={self.share_embeddings!r}; use one of "
                f"{SHARE_EMBEDDINGS}"
            )
        if self.positions not in POSITIONS:
            raise ConfigError(
                f"TransformerConfig: positions={self.positions!r}; use one of {POSITIONS}"
            )
        check_attention_fields("TransformerConfig", self.attention_block, self.attention_window)
        if self.source_vocab is None or self.target_vocab is None:
            raise ValueError(
                "TransformerConfig: pass vocab_size (one joint vocabulary) or both "
                "source_vocab_size and target_vocab_size"
            )
        if self.share_embeddings == "all" and self.source_vocab != self.target_vocab:
            raise ConfigError(
                f"TransformerConfig: share_embeddings='all' needs one vocabulary, got "
                f"source_vocab_size={self.source_vocab} and target_vocab_size={self.target_vocab}; "
                "use share_embeddings='target' or 'none' for separate vocabularies"
            )
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"TransformerConfig: hidden_size={self.hidden_size} is not divisible by "
                f"num_heads={self.num_heads}"
            )
        for name in ("num_encoder_layers", "num_decoder_layers", "num_heads", "mlp_dim",
                     "hidden_size", "max_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"TransformerConfig: {name}={getattr(self, name)} must be >= 1")
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if not 0 <= value < min(self.source_vocab, self.target_vocab):
                raise ConfigError(
                    f"TransformerConfig: {name}={value} is not an id of both vocabularies "
                    f"(sizes {self.source_vocab}, {self.target_vocab})"
                )

    @property
    def source_vocab(self) -> int | None:
        return self.source_vocab_size or self.vocab_size

    @property
    def target_vocab(self) -> int | None:
        return self.target_vocab_size or self.vocab_size


# The paper's Table 3 sizes; tiny is this repo's test size. big uses P_drop 0.3 as the paper's
# EN-DE big model (its EN-FR big model used 0.1: override dropout_rate for that).
SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(num_encoder_layers=2, num_decoder_layers=2, hidden_size=64, num_heads=4,
                 mlp_dim=256),
    "base": dict(num_encoder_layers=6, num_decoder_layers=6, hidden_size=512, num_heads=8,
                 mlp_dim=2048),
    "big": dict(num_encoder_layers=6, num_decoder_layers=6, hidden_size=1024, num_heads=16,
                mlp_dim=4096, dropout_rate=0.3),
}


def config_for_size(size: str, **overrides: Any) -> TransformerConfig:
    """The TransformerConfig of a named size; `overrides` (a vocabulary at least) set the rest."""
    if size not in SIZES:
        raise ConfigError(
            f"config.model.size: unknown Transformer size {size!r}; choose from {list(SIZES)}"
        )
    return TransformerConfig(**{**SIZES[size], **overrides})


def flops_per_token(config: TransformerConfig, source_len: int, target_len: int) -> float:
    """Training FLOPs (forward + backward) per input token, source and target tokens both counted.

    For one sentence pair of S source and T target tokens, counted in multiply-accumulates (MACs)
    and then x2 FLOPs per MAC, x3 for forward + backward (the 6N rule):
    * encoder matmuls: S L_enc (4 d^2 + 2 d d_ff) (q, k, v, out, the two feed-forward matrices);
    * decoder matmuls: T L_dec (6 d^2 + 2 d d_ff) (self q, k, v, out; cross q, out; FFN) plus
      S L_dec 2 d^2: the cross-attention keys and values project the S encoder outputs;
    * output projection: T d V_target (tied or not, it is a matmul);
    * attention scores and weighted values, 2 d MACs per query-key pair: S^2 per encoder layer,
      T^2 / 2 per decoder self-attention (causal: on average half the keys) and T S per
      cross-attention.
    Embedding lookups are gathers and the norms, softmax and biases are elementwise: left out.
    Per pair that is flops_per_token * (S + T), matching a task whose tokens_per_batch counts
    both sides.

    Args:
      config: the model.
      source_len: S, source tokens per example (padded width).
      target_len: T, target tokens per example (padded width).
    """
    if source_len < 1 or target_len < 1:
        raise ValueError(
            f"flops_per_token: need source_len >= 1 and target_len >= 1, got {source_len=}, "
            f"{target_len=}"
        )
    d, d_ff = config.hidden_size, config.mlp_dim
    s, t = source_len, target_len
    enc, dec = config.num_encoder_layers, config.num_decoder_layers
    weights = (s * enc * (4 * d * d + 2 * d * d_ff)
               + t * dec * (6 * d * d + 2 * d * d_ff) + s * dec * 2 * d * d
               + t * d * config.target_vocab)
    attention = 2 * d * (enc * s * s + dec * (t * t / 2 + t * s))
    return 3 * 2 * (weights + attention) / (s + t)


def activation_bytes(config: TransformerConfig, batch: int, source_len: int, target_len: int,
                     tensor_parallel: int) -> float:
    """Activation memory one device keeps for the backward pass of a `batch`-row micro-batch
    (the dry run): the encoder over the S source tokens and the decoder over the T target tokens,
    each a layer stack (zoo.nn.transformer.stack_activation_bytes; the decoder's cross-attention
    is counted as a second self-attention of its size)."""
    itemsize = jnp.dtype(config.dtype).itemsize
    encoder = stack_activation_bytes(
        batch, source_len, config.hidden_size, config.num_heads, config.num_encoder_layers,
        config.mlp_dim, itemsize, config.remat, tensor_parallel, config.backend)
    decoder = stack_activation_bytes(
        batch, target_len, config.hidden_size, config.num_heads, 2 * config.num_decoder_layers,
        config.mlp_dim, itemsize, config.remat, tensor_parallel, config.backend)
    return encoder + decoder
