"""BERT: a post-LN bidirectional Transformer encoder with pretraining and fine-tuning heads.

Module and parameter names follow the BERT checkpoints (embeddings/{word,token_type,position}
_embeddings, encoder layers, pooler/dense, predictions, seq_relationship, qa_outputs,
classifier) so Hugging Face and google-research/bert conversion (zoo.convert.bert) is a rename
table plus reshapes. Every model with a head holds the encoder as its `bert` submodule, so the
`bert` params of a pretraining checkpoint drop into the fine-tuning models unchanged.

The masked-LM decoder is tied to the word embeddings and runs only at the `masked_positions`
gathered from the sequence output: [B, P, V] logits, never [B, T, V] (with P ~ 0.15 T, the
full-sequence vocabulary projection would be most of the head's FLOPs and memory for nothing).
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from zoo.errors import ConfigError
from zoo.models import config_checks
from zoo.models.runtime_fields import RuntimeFields
from zoo.nn.attention import check_attention_fields
from zoo.nn.masks import MaskSpec
from zoo.nn.embeddings import Embed, LearnedPositionalEmbedding
from zoo.nn.feedforward import get_activation
from zoo.nn.linear import Dense
from zoo.nn.normalization import LayerNorm
from zoo.nn.transformer import TransformerEncoder, stack_activation_bytes

_EMBED_AXES = ("act_batch", "act_len", "act_embed")


@dataclasses.dataclass(frozen=True)
class BertConfig(RuntimeFields):
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    layer_norm_epsilon: float = 1e-12
    # Standard deviation of every weight matrix and embedding table at initialisation (HF's
    # `initializer_range`; google-research/bert draws a truncated normal of the same scale).
    initializer_range: float = 0.02

    def __post_init__(self):
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"BertConfig: hidden_size={self.hidden_size} is not divisible by "
                f"num_heads={self.num_heads}"
            )
        check_attention_fields("BertConfig", self.attention_block, self.attention_window)


# (num_layers, num_heads, hidden_size), i.e. BERT's L, A, H; intermediate_size is 4 * H.
# mini .. large are the google-research/bert release sizes; tiny is this repo's test size.
SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 2, 64),
    "mini": (4, 4, 256),
    "small": (4, 8, 512),
    "medium": (8, 8, 512),
    "base": (12, 12, 768),
    "large": (24, 16, 1024),
}


def config_for_size(size: str, **overrides: Any) -> BertConfig:
    """The BertConfig of a named size; `overrides` (vocab_size at least) set the other fields."""
    if size not in SIZES:
        raise ConfigError(
            f"config.model.size: unknown BERT size {size!r}; choose from {list(SIZES)}"
        )
    layers, heads, hidden = SIZES[size]
    kw = dict(num_layers=layers, num_heads=heads, hidden_size=hidden, intermediate_size=4 * hidden)
    kw.update(overrides)
    if "vocab_size" not in kw:
        raise ValueError("config_for_size: pass vocab_size=... (the tokenizer's vocabulary size)")
    return BertConfig(**kw)


def flops_per_token(config: BertConfig, seq_len: int, num_predictions: int) -> float:
    """Training FLOPs (forward + backward) per input token, for MFU and the dry run.

    * 6N over the encoder's matmul weights, N = L (4 H^2 + 2 H F): q, k, v, out and the two
      feed-forward matrices (forward 2N per token, backward 4N).
    * Attention scores and the weighted sum of values: 2 * 2 * T * H per token per layer forward,
      x3 with backward = 12 L T H. Bidirectional, so every query sees all T keys (not halved as
      in a causal model).
    * The MLM head (transform H x H + tied decoder H x V) runs only at the P predictions of each
      T-token sequence: 6 (H^2 + H V) P / T per token.
    Embedding lookups are gathers, not matmuls; the pooler and NSP layer run once per sequence
    (6 (H^2 + 2H) / T per token, under 0.1% of the total at base size): both are left out.

    Args:
      config: the model.
      seq_len: T, tokens per sequence.
      num_predictions: P, masked positions predicted per sequence.
    """
    if seq_len < 1 or num_predictions < 0:
        raise ValueError(
            f"flops_per_token: need seq_len >= 1 and num_predictions >= 0, got {seq_len=}, "
            f"{num_predictions=}"
        )
    h, layers = config.hidden_size, config.num_layers
    encoder_weights = layers * (4 * h * h + 2 * h * config.intermediate_size)
    attention = 3 * 2 * 2 * seq_len * h * layers
    mlm_head = 6 * (h * h + h * config.vocab_size) * num_predictions / seq_len
    return 6.0 * encoder_weights + attention + mlm_head


def activation_bytes(config: BertConfig, batch: int, seq_len: int, num_predictions: int,
                     tensor_parallel: int) -> float:
    """Activation memory one device keeps for the backward pass of a `batch`-row micro-batch
    (the dry run): the encoder stack (zoo.nn.transformer.stack_activation_bytes) and, when
    pretraining predicts `num_predictions` masked positions per row, the MLM head's float32
    logits, log-softmax and logits' gradient at those positions (split over vocab by tensor
    parallelism). The question-answering and classification heads are a few values per row."""
    stack = stack_activation_bytes(
        batch, seq_len, config.hidden_size, config.num_heads, config.num_layers,
        config.intermediate_size, jnp.dtype(config.dtype).itemsize, config.remat,
        tensor_parallel, config.backend)
    if not num_predictions:
        return stack
    return stack + 3 * batch * num_predictions * config.vocab_size * 4 / tensor_parallel


def _dtypes(config: BertConfig) -> dict[str, Any]:
    return dict(dtype=jnp.dtype(config.dtype), param_dtype=jnp.dtype(config.param_dtype))


def weight_init(config: BertConfig) -> nn.initializers.Initializer:
    """N(0, initializer_range^2), BERT's initialiser for every kernel and embedding table.

    Not the fan-in scaled lecun_normal of zoo.nn's layers, which at width 64 draws kernels of
    std 0.125 (0.0625 for the FFN output), 3-6x BERT's 0.02, and trains tiny BERT measurably
    worse than the reference does (benchmarks.quality_bert; tests/models/test_init_parity.py
    holds every initial tensor to Hugging Face's).
    """
    return nn.initializers.normal(stddev=config.initializer_range)


def _kernel(config: BertConfig) -> dict[str, Any]:
    return dict(_dtypes(config), kernel_init=weight_init(config))


def attention_spec(attention_mask: jnp.ndarray | None, window: int = 0) -> MaskSpec | None:
    """[B, T] bool/int token validity (1 = real token) and a local window (0 = none) -> the
    encoder's mask description (None: every token sees every token).

    Real tokens attend only to real tokens; padding queries attend nowhere (zero attention
    output), so nothing at a padding position can reach a real one.
    """
    if attention_mask is None:
        return MaskSpec.self_attention(window=window) if window else None
    attention_mask = jnp.asarray(attention_mask)
    if attention_mask.ndim != 2:
        raise ValueError(
            f"attention_mask must be [batch, len] (1 = real token, 0 = padding), got shape "
            f"{attention_mask.shape}"
        )
    if attention_mask.dtype != jnp.bool_:
        if not jnp.issubdtype(attention_mask.dtype, jnp.integer):
            raise ValueError(
                f"attention_mask must be bool or int (1 = real token, 0 = padding), got dtype "
                f"{attention_mask.dtype}; additive float masks are not accepted"
            )
        attention_mask = attention_mask != 0
    return MaskSpec.self_attention(attention_mask, window=window or None)


class BertEmbeddings(nn.Module):
    """Word + segment + learned position embeddings, summed, then LayerNorm and dropout.

    The same three tables as zoo.nn.TokenSegmentPositionEmbedding, held here as named
    attributes so that `attend` (the tied MLM decoder) can reach the word table.
    """

    config: BertConfig

    def setup(self):
        cfg = self.config
        kw = dict(_dtypes(cfg), embedding_init=weight_init(cfg))
        self.word_embeddings = Embed(cfg.vocab_size, cfg.hidden_size, **kw)
        # A 2-row table is not worth splitting over the tensor axis (see TokenSegmentPosition-
        # Embedding).
        self.token_type_embeddings = Embed(
            cfg.type_vocab_size, cfg.hidden_size, axes=(None, "embed"), **kw
        )
        self.position_embeddings = LearnedPositionalEmbedding(
            cfg.max_position_embeddings, cfg.hidden_size, **kw
        )
        self.norm = LayerNorm(epsilon=cfg.layer_norm_epsilon, **_dtypes(cfg))
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def __call__(self, input_ids, token_type_ids=None, positions=None, *, deterministic=True):
        """input_ids [B, T] int; token_type_ids [B, T] (default 0); positions [B, T] or None."""
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        if token_type_ids.shape != input_ids.shape:
            raise ValueError(
                f"BertEmbeddings: token_type_ids shape {token_type_ids.shape} must equal "
                f"input_ids shape {input_ids.shape}"
            )
        config_checks.check_length(
            "BERT", input_ids.shape[1], self.config.max_position_embeddings,
            "BertConfig.max_position_embeddings",
            "config.model.max_position_embeddings, or the init_from checkpoint's")
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        x = self.position_embeddings(x, positions)  # (B, T, H)
        x = self.dropout(self.norm(x), deterministic=deterministic)
        return nn.with_logical_constraint(x, _EMBED_AXES)

    def attend(self, x: jnp.ndarray) -> jnp.ndarray:
        """Tied decoder: x [..., H] -> logits [..., V] against the word embedding table."""
        return self.word_embeddings.attend(x)


class BertPooler(nn.Module):
    """tanh(dense(h_[CLS])): the sentence vector the NSP and classification heads read."""

    config: BertConfig

    @nn.compact
    def __call__(self, sequence_output: jnp.ndarray) -> jnp.ndarray:
        """sequence_output [B, T, H] -> pooled [B, H]."""
        cls = sequence_output[:, 0]  # (B, H): the [CLS] token
        dense = Dense(self.config.hidden_size, ("embed", "mlp"), name="dense",
                      **_kernel(self.config))
        return jnp.tanh(dense(cls))


class BertModel(nn.Module):
    """The BERT encoder: embeddings, a post-LN TransformerEncoder ('gelu' = erf GELU), pooler."""

    config: BertConfig

    def setup(self):
        cfg = self.config
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = TransformerEncoder(
            num_layers=cfg.num_layers,
            num_heads=cfg.num_heads,
            mlp_dim=cfg.intermediate_size,
            activation="gelu",
            dropout_rate=cfg.dropout_rate,
            attention_dropout_rate=cfg.attention_dropout_rate,
            layer_norm_epsilon=cfg.layer_norm_epsilon,
            norm_position="post",
            backend=cfg.backend,
            attention_block=cfg.attention_block,
            scan_layers=cfg.scan_layers,
            scan_unroll=cfg.scan_unroll,
            remat=cfg.remat,
            **_kernel(cfg),
        )
        self.pooler = BertPooler(cfg)

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None, positions=None, *,
                 deterministic=True, sow_weights=False):
        """Encodes a batch of (pairs of) sentences.

        Args:
          input_ids: word-piece ids [B, T] int.
          token_type_ids: segment ids [B, T] (0 = sentence A, 1 = sentence B); None = all 0.
          attention_mask: [B, T] bool or int, 1 = real token, 0 = padding; None = no padding.
          positions: [B, T] int position ids; None = 0 .. T-1.
          deterministic: no dropout when True (otherwise needs a 'dropout' rng).
          sow_weights: store every layer's attention weights [B, heads, T, T] in
            'intermediates' (apply with mutable=['intermediates'];
            zoo.eval.attention_maps reads them).

        Returns:
          (sequence_output [B, T, H], pooled [B, H]), both in config.dtype. Outputs at padding
          positions carry no meaning.
        """
        if input_ids.ndim != 2 or not jnp.issubdtype(input_ids.dtype, jnp.integer):
            raise ValueError(
                f"BertModel: input_ids must be int [batch, len], got {input_ids.dtype} "
                f"{input_ids.shape}"
            )
        mask = attention_spec(attention_mask, self.config.attention_window)
        if attention_mask is not None and mask.k_segments.shape[-1] != input_ids.shape[1]:
            raise ValueError(
                f"BertModel: attention_mask length {mask.k_segments.shape[-1]} != input_ids "
                f"length {input_ids.shape[1]}"
            )
        x = self.embeddings(input_ids, token_type_ids, positions, deterministic=deterministic)
        x = self.encoder(x, mask, deterministic=deterministic,
                         sow_weights=sow_weights)  # (B, T, H)
        return x, self.pooler(x)

    def attend(self, x: jnp.ndarray) -> jnp.ndarray:
        """x [..., H] -> [..., V] through the (transposed) word embedding table."""
        return self.embeddings.attend(x)


def gather_positions(sequence_output: jnp.ndarray, positions: jnp.ndarray) -> jnp.ndarray:
    """sequence_output [B, T, H] and positions [B, P] int -> the rows at those positions [B, P, H].

    Out-of-range positions are clamped (they cannot raise under jit); callers pad P with 0 and
    give those predictions weight 0.
    """
    if positions.ndim != 2 or not jnp.issubdtype(positions.dtype, jnp.integer):
        raise ValueError(
            f"masked_positions must be int [batch, num_predictions], got {positions.dtype} "
            f"{positions.shape}"
        )
    return jnp.take_along_axis(sequence_output, positions[:, :, None], axis=1, mode="clip")


class BertMLMHead(nn.Module):
    """Masked-LM head at the masked positions only: transform (Dense, GELU, LayerNorm), then the
    decoder tied to the word embeddings plus an output bias [V] (cls/predictions)."""

    config: BertConfig

    @nn.compact
    def __call__(self, sequence_output: jnp.ndarray, masked_positions: jnp.ndarray,
                 decoder: Callable[[jnp.ndarray], jnp.ndarray]) -> jnp.ndarray:
        """sequence_output [B, T, H], masked_positions [B, P] int, decoder x -> x @ E^T
        (BertModel.attend) -> logits [B, P, V] float32."""
        cfg = self.config
        kw = _dtypes(cfg)
        h = gather_positions(sequence_output, masked_positions)  # (B, P, H)
        h = Dense(cfg.hidden_size, ("embed", "mlp"), name="transform", **_kernel(cfg))(h)
        h = get_activation("gelu")(h)
        h = LayerNorm(epsilon=cfg.layer_norm_epsilon, name="transform_norm", **kw)(h)
        bias = self.param(
            "output_bias",
            nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",)),
            (cfg.vocab_size,),
            kw["param_dtype"],
        )
        logits = decoder(h).astype(jnp.float32) + bias.astype(jnp.float32)  # (B, P, V)
        return nn.with_logical_constraint(logits, ("act_batch", "act_len", "act_vocab"))


class BertForPreTraining(nn.Module):
    """BertModel with the masked-LM head (`predictions`) and the NSP head (`seq_relationship`)."""

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids, token_type_ids, attention_mask, masked_positions, *,
                 deterministic=True, sow_weights=False):
        """Pretraining logits.

        Args:
          input_ids, token_type_ids, attention_mask: as BertModel ([B, T] each; the last two
            may be None).
          masked_positions: [B, P] int, the positions whose tokens the MLM head predicts.
          deterministic: no dropout when True.

        Returns:
          (mlm_logits [B, P, V], nsp_logits [B, 2]), float32; NSP class 0 = "B follows A".
        """
        bert = BertModel(self.config, name="bert")
        sequence_output, pooled = bert(
            input_ids, token_type_ids, attention_mask, deterministic=deterministic,
            sow_weights=sow_weights,
        )
        mlm_logits = BertMLMHead(self.config, name="predictions")(
            sequence_output, masked_positions, bert.attend
        )
        nsp_logits = Dense(2, ("embed", None), name="seq_relationship",
                           **_kernel(self.config))(pooled)  # (B, 2)
        return mlm_logits, nsp_logits.astype(jnp.float32)


class BertForQuestionAnswering(nn.Module):
    """BertModel plus a per-token span head (`qa_outputs`, as HF and SQuAD fine-tuning).

    The encoder still computes the pooler (so its params are exactly BertModel's and a
    pretraining checkpoint's `bert` subtree fits as is); the span head does not read it.
    """

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids, token_type_ids, attention_mask, *, deterministic=True,
                 sow_weights=False):
        """Answer-span logits.

        Args:
          input_ids, token_type_ids, attention_mask: as BertModel ([B, T] each; the last two
            may be None). For SQuAD, segment 0 is the question and segment 1 the context.
          deterministic: no dropout when True.

        Returns:
          (start_logits [B, T], end_logits [B, T]), float32. Logits at padding positions carry
          no meaning: mask them before a softmax or argmax over positions.
        """
        sequence_output, _ = BertModel(self.config, name="bert")(
            input_ids, token_type_ids, attention_mask, deterministic=deterministic,
            sow_weights=sow_weights,
        )
        # One Dense to 2 outputs per token, as HF's qa_outputs (and google-research's
        # cls/squad/output_weights): channel 0 scores span starts, channel 1 span ends.
        logits = Dense(2, ("embed", None), name="qa_outputs", **_kernel(self.config))(
            sequence_output
        ).astype(jnp.float32)  # (B, T, 2)
        logits = nn.with_logical_constraint(logits, ("act_batch", "act_len", None))
        return logits[..., 0], logits[..., 1]


class BertForSequenceClassification(nn.Module):
    """BertModel plus a classifier over the pooled [CLS] vector: pooled -> dropout -> Dense.

    `encode` (the encoder's pooled vector) and `classify` (the head on it) are also methods of
    their own, so a frozen encoder can run without gradients and feature extraction can compute
    the pooled vectors once and train only `classify` on them (zoo.tasks.classification).

    Attributes:
      config: the encoder.
      num_labels: classes (1 = a regression score, as HF).
      dropout_rate: dropout before the classifier; None uses config.dropout_rate (HF's
        classifier_dropout=None falls back to hidden_dropout_prob the same way).
    """

    config: BertConfig
    num_labels: int
    dropout_rate: float | None = None

    def setup(self):
        if self.num_labels < 1:
            raise ValueError(
                f"BertForSequenceClassification: num_labels must be >= 1, got {self.num_labels}"
            )
        rate = self.config.dropout_rate if self.dropout_rate is None else self.dropout_rate
        self.bert = BertModel(self.config)
        self.dropout = nn.Dropout(rate)
        self.classifier = Dense(self.num_labels, ("embed", None), **_kernel(self.config))

    def __call__(self, input_ids, token_type_ids, attention_mask, *, deterministic=True,
                 sow_weights=False):
        """Class logits.

        Args:
          input_ids, token_type_ids, attention_mask: as BertModel ([B, T] each; the last two
            may be None).
          deterministic: no dropout when True (otherwise needs a 'dropout' rng).

        Returns:
          logits [B, num_labels], float32.
        """
        pooled = self.encode(input_ids, token_type_ids, attention_mask,
                             deterministic=deterministic, sow_weights=sow_weights)
        return self.classify(pooled, deterministic=deterministic)

    def encode(self, input_ids, token_type_ids, attention_mask, *, deterministic=True,
               sow_weights=False):
        """The pooled [CLS] vector [B, H] the classifier reads (config.dtype)."""
        _, pooled = self.bert(input_ids, token_type_ids, attention_mask,
                              deterministic=deterministic, sow_weights=sow_weights)
        return pooled

    def classify(self, pooled, *, deterministic=True):
        """pooled [B, H] -> logits [B, num_labels] float32: the head alone."""
        pooled = self.dropout(pooled, deterministic=deterministic)  # (B, H)
        logits = self.classifier(pooled.astype(self.config.dtype))  # (B, num_labels)
        return nn.with_logical_constraint(logits.astype(jnp.float32), ("act_batch", None))
