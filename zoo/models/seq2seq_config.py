"""The RNN encoder-decoder's config (zoo.models.seq2seq): Seq2SeqConfig and its checks, the
named sizes, the training FLOPs per token the MFU is computed from and the activation memory
the dry run counts. zoo.models.seq2seq re-exports every name here.
"""

import dataclasses
from typing import Any

import jax.numpy as jnp

from zoo.data.tokenizers.base import BOS_ID, EOS_ID, PAD_ID
from zoo.errors import ConfigError
from zoo.models.config_checks import check_float_dtypes
from zoo.nn.recurrent_cells import CELL_KINDS

ATTENTIONS = ("none", "additive", "dot", "general")
_NUM_GATES = {"lstm": 4, "gru": 3, "rnn": 1}


@dataclasses.dataclass(frozen=True)
class Seq2SeqConfig:
    """The RNN encoder-decoder's hyperparameters.

    Attributes:
      vocab_size: one joint source/target vocabulary (the translation task's shared
        SentencePiece model).
      cell: 'lstm', 'gru' or 'rnn' (Elman, tanh), for encoder and decoder.
      embed_dim: E, the token embedding width.
      hidden_size: H, units per layer (per direction in a bidirectional encoder).
      num_layers: stacked layers of the encoder and of the decoder (layer k initialises k).
      attention: 'none' (the seq2seq of the course slides on sequence generation and
        attention), 'additive' (Bahdanau), 'dot' or 'general' (Luong).
      bidirectional: a bidirectional encoder, its final states bridged to H by Dense + tanh.
      dropout_rate: see the module docstring.
      share_embeddings: one embedding table for source and target (else two).
      dtype, param_dtype: compute and parameter dtypes by name; carries, attention scores and
        logits stay float32.
      pad_id, bos_id, eos_id: special ids; the target input starts with bos_id.
    """

    vocab_size: int | None = None
    cell: str = "lstm"
    embed_dim: int = 64
    hidden_size: int = 64
    num_layers: int = 2
    attention: str = "additive"
    bidirectional: bool = False
    dropout_rate: float = 0.0
    share_embeddings: bool = True
    dtype: str = "float32"
    param_dtype: str = "float32"
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID

    def __post_init__(self):
        if not isinstance(self.vocab_size, int) or self.vocab_size < 1:
            raise ConfigError(f"Seq2SeqConfig.vocab_size must be an int >= 1, got "
                              f"{self.vocab_size!r}")
        if self.cell not in CELL_KINDS:
            raise ConfigError(f"Seq2SeqConfig.cell must be one of {CELL_KINDS}, got {self.cell!r}")
        if self.attention not in ATTENTIONS:
            raise ConfigError(f"Seq2SeqConfig.attention must be one of {ATTENTIONS}, got "
                              f"{self.attention!r}")
        for name in ("embed_dim", "hidden_size", "num_layers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"Seq2SeqConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ConfigError(f"Seq2SeqConfig.dropout_rate must be in [0, 1), got "
                              f"{self.dropout_rate}")
        if self.bidirectional and self.attention == "dot":
            raise ConfigError(
                "Seq2SeqConfig.attention='dot' needs keys as wide as the decoder state, but "
                "bidirectional=True makes the encoder outputs 2 * hidden_size wide; use "
                "attention='general' or 'additive', or bidirectional=False")
        check_float_dtypes(self, "Seq2SeqConfig")
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if not 0 <= value < self.vocab_size:
                raise ConfigError(f"Seq2SeqConfig.{name}={value} is not an id of the vocabulary "
                                  f"of {self.vocab_size}")

    @property
    def memory_size(self) -> int:
        """M, the width of the encoder outputs the attention reads."""
        return 2 * self.hidden_size if self.bidirectional else self.hidden_size

    @property
    def luong(self) -> bool:
        return self.attention in ("dot", "general")


# tiny: the house test size (2 layers, width 64). base: Luong et al. (2015)'s stacking LSTM
# (4 layers, 1000 units, 1000-dim embeddings, dropout 0.2).
SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(embed_dim=64, hidden_size=64, num_layers=2),
    "base": dict(embed_dim=1000, hidden_size=1000, num_layers=4, dropout_rate=0.2),
}


def config_for_size(size: str, **overrides: Any) -> Seq2SeqConfig:
    """The Seq2SeqConfig of a named size; `overrides` (a vocabulary at least) set the rest."""
    if size not in SIZES:
        raise ConfigError(f"config.model.size: unknown seq2seq size {size!r}; choose from "
                          f"{list(SIZES)}")
    return Seq2SeqConfig(**{**SIZES[size], **overrides})


def flops_per_token(config: Seq2SeqConfig, source_len: int, target_len: int) -> float:
    """Training FLOPs (forward + backward) per input token, source and target tokens both counted.

    Per sentence pair of S source and T target tokens, in multiply-accumulates (MACs), then x2
    FLOPs per MAC and x3 for forward + backward:
    * encoder: S * dirs * sum_k G H (D_k + H), D_0 = E, D_k = dirs * H above;
    * decoder: T * sum_k G H (D_k + H), D_0 = E (+ M with additive attention or + H with input
      feeding), D_k = H above;
    * attention: the keys once per sentence (S M H for additive and general), then per target
      step the query projection (H^2, additive), the scores (S H additive, S M dot/general),
      the context (S M) and Luong's h~ = tanh(W_c [c; h]) ((M + H) H);
    * output layer: T H V.
    Bridges, gathers, gate maths and softmaxes are left out.
    """
    if source_len < 1 or target_len < 1:
        raise ValueError(f"flops_per_token: need source_len >= 1 and target_len >= 1, got "
                         f"{source_len=}, {target_len=}")
    g, e, h, m = _NUM_GATES[config.cell], config.embed_dim, config.hidden_size, config.memory_size
    s, t, dirs = source_len, target_len, 2 if config.bidirectional else 1
    encoder = s * dirs * sum(g * h * ((e if k == 0 else dirs * h) + h)
                             for k in range(config.num_layers))
    extra = {"none": 0, "additive": m}.get(config.attention, h)
    decoder = t * sum(g * h * ((e + extra if k == 0 else h) + h) for k in range(config.num_layers))
    if config.attention == "additive":
        attention = s * m * h + t * (h * h + s * h + s * m)
    elif config.luong:
        attention = (s * m * h if config.attention == "general" else 0) + t * (
            2 * s * m + (m + h) * h)
    else:
        attention = 0
    output = t * h * config.vocab_size
    return 3 * 2 * (encoder + decoder + attention + output) / (s + t)


def activation_bytes(config: Seq2SeqConfig, batch: int, source_len: int, target_len: int,
                     tensor_parallel: int) -> float:
    """A rough count of what the backward pass keeps, per device, for a `batch`-row micro-batch
    of S source and T target tokens (the dry run).

    Each scan keeps, per step and layer, the gate pre-activations and the (c, h) carry
    (G + 2 float32 values per unit; each direction of a bidirectional encoder counts);
    additive attention keeps its tanh hidden layer (B, S, H) per target step and every
    attention its weights (B, S); the logits are kept in float32 with their softmax. Hidden
    units and the vocabulary are split over the tensor axis; embeddings are left out.
    """
    b, s, t = batch, source_len, target_len
    g = _NUM_GATES[config.cell]
    dirs = 2 if config.bidirectional else 1
    per_unit = 4 * (g + 2) * config.hidden_size * config.num_layers
    recurrent = b * (s * dirs + t) * per_unit
    attention = 0
    if config.attention != "none":
        width = config.hidden_size + 1 if config.attention == "additive" else 1
        attention = 4 * b * t * s * width
    logits = 2 * 4 * b * t * config.vocab_size
    return (recurrent + attention + logits) / max(tensor_parallel, 1) + (
        b * s * config.memory_size * jnp.dtype(config.dtype).itemsize)
