"""Bengio et al. (2003), "A Neural Probabilistic Language Model" (NNLM).

The next word is predicted from a fixed window of the previous n-1 words: their embeddings are
concatenated, pass one tanh hidden layer, and a softmax over the vocabulary gives the
distribution; optional direct connections add a linear map from the embeddings to the output
(JMLR 3:1137-1155, eq. 1):

    y = b + W x + U tanh(d + H x),   x = (C(w_{t-1}), C(w_{t-2}), ..., C(w_{t-n+1})),
    P(w_t | w_{t-n+1} .. w_{t-1}) = softmax(y)

The lecture notes from NNLM to BERT ("从NNLM到Word2Vec") describe the same three steps: look up the
embeddings, compute, output a softmax over the next word. Parameter names are the paper's: the table
C, the hidden layer H (its bias is d), the output layer U (its bias is b), the direct connections W.

A packed row [B, T] is processed at once: position t predicts the token after t from tokens
t, t-1, ..., t-n+2 of the same document; window slots before the document's start (or the row's
start) hold a learned `start` vector, so packing never leaks context between documents.
"""

import dataclasses
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from zoo.errors import ConfigError
from zoo.nn.embeddings import Embed, default_embed_init
from zoo.nn.linear import Dense


@dataclasses.dataclass(frozen=True)
class NNLMConfig:
    """Attributes:
      vocab_size: |V|, the softmax size.
      context: n - 1, the number of previous tokens the model sees.
      embed_dim: m, the width of a word's feature vector C(w).
      hidden_dim: h, tanh hidden units (0 is allowed: the model is then b + W x, which needs
        direct=True).
      direct: add the direct connections W x from the embeddings to the output.
      dropout_rate: dropout on the tanh hidden layer (the paper used none).
    """

    vocab_size: int
    context: int = 4
    embed_dim: int = 64
    hidden_dim: int = 256
    direct: bool = True
    dropout_rate: float = 0.0
    dtype: str = "float32"
    param_dtype: str = "float32"

    def __post_init__(self):
        for name in ("vocab_size", "context", "embed_dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"NNLMConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_dim < 0 or (self.hidden_dim == 0 and not self.direct):
            raise ConfigError(
                f"NNLMConfig.hidden_dim={self.hidden_dim}: must be >= 1, or 0 with direct=True "
                "(a model with neither a hidden layer nor direct connections ignores its input)"
            )
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ConfigError(f"NNLMConfig.dropout_rate must be in [0, 1), got {self.dropout_rate}")


# (embed_dim, hidden_dim); the window (context) and direct connections are set separately.
SIZES: dict[str, tuple[int, int]] = {
    "tiny": (32, 64),
    "base": (256, 1024),
}


def config_for_size(size: str, **overrides: Any) -> NNLMConfig:
    if size not in SIZES:
        raise ConfigError(f"config.model.size: unknown NNLM size {size!r}; choose from "
                          f"{list(SIZES)}")
    embed_dim, hidden_dim = SIZES[size]
    return NNLMConfig(**{"embed_dim": embed_dim, "hidden_dim": hidden_dim, **overrides})


def matmul_params(cfg: NNLMConfig) -> int:
    """Weights that take part in a matmul per token: H, U and (if direct) W."""
    x_dim = cfg.context * cfg.embed_dim
    return (x_dim * cfg.hidden_dim + cfg.hidden_dim * cfg.vocab_size
            + (x_dim * cfg.vocab_size if cfg.direct else 0))


def flops_per_token(cfg: NNLMConfig) -> float:
    """Training FLOPs per token: 6 per matmul weight (forward 2, backward 4). The embedding
    lookup is a gather, not a matmul, and the window has no quadratic term."""
    return 6.0 * matmul_params(cfg)


def activation_bytes(cfg: NNLMConfig, batch: int, seq_len: int, tensor_parallel: int) -> float:
    """Activation memory one device keeps for the backward pass of a `batch`-row micro-batch of
    `seq_len` tokens (the dry run): x (n-1 slots of m), the tanh output (split like H's
    columns), and the float32 logits with their softmax (split over vocab)."""
    tokens = batch * seq_len
    item = jnp.dtype(cfg.dtype).itemsize
    return tokens * (cfg.context * cfg.embed_dim * item
                     + cfg.hidden_dim * item / tensor_parallel
                     + 2 * cfg.vocab_size * 4 / tensor_parallel)


def shifted(x: jnp.ndarray, shift: int, fill) -> jnp.ndarray:
    """x [B, T, ...] moved `shift` steps later along T: out[:, t] = x[:, t - shift], `fill` where
    t < shift."""
    pad = [(0, 0)] * x.ndim
    pad[1] = (shift, 0)
    return jnp.pad(x, pad, constant_values=fill)[:, : x.shape[1]]


class NNLM(nn.Module):
    config: NNLMConfig

    @nn.compact
    def __call__(self, tokens, *, segment_ids=None, deterministic=True):
        """tokens [B, T] int -> logits [B, T, V] (float32) for the token after each position.

        segment_ids [B, T] (from packing; None = one document per row): the window of position
        t only uses tokens t-j with the same segment id as t, j < context.
        """
        cfg = self.config
        if tokens.ndim != 2:
            raise ValueError(f"NNLM: tokens must be [batch, length], got shape {tokens.shape}")
        if segment_ids is None:
            segment_ids = jnp.zeros_like(tokens)
        elif segment_ids.shape != tokens.shape:
            raise ValueError(f"NNLM: segment_ids shape {segment_ids.shape} must equal tokens "
                             f"shape {tokens.shape}")
        dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)

        emb = Embed(cfg.vocab_size, cfg.embed_dim, dtype=dtype, param_dtype=param_dtype,
                    name="C")(tokens)  # (B, T, m)
        start = self.param("start", nn.with_logical_partitioning(default_embed_init, ("embed",)),
                           (cfg.embed_dim,), param_dtype).astype(dtype)
        # Slot j of position t holds C(token t-j), most recent first as in the paper's x. A slot
        # is in the window when t-j is in the row and in t's segment (segment ids are >= 0, so
        # the -1 fill marks slots before the row start); else it holds the start vector.
        slots = []
        for j in range(cfg.context):
            same_doc = shifted(segment_ids, j, -1) == segment_ids  # (B, T)
            slots.append(jnp.where(same_doc[..., None], shifted(emb, j, 0), start))
        x = jnp.stack(slots, axis=2)  # (B, T, n-1, m): x of every position, flattened by H and W

        logits = jnp.zeros((), dtype)
        if cfg.hidden_dim:
            # d + H x over the (n-1, m) slots: the slot axis is small and never sharded.
            h = jnp.tanh(Dense(cfg.hidden_dim, (None, "embed", "mlp"), num_in=2, dtype=dtype,
                               param_dtype=param_dtype, name="H")(x))  # (B, T, h)
            h = nn.with_logical_constraint(h, ("act_batch", "act_len", "act_mlp"))
            h = nn.Dropout(cfg.dropout_rate)(h, deterministic=deterministic)
            logits = Dense(cfg.vocab_size, ("mlp", "vocab"), dtype=dtype,
                           param_dtype=param_dtype, name="U")(h)  # b + U tanh(.): (B, T, V)
        if cfg.direct:
            # The paper's b belongs to U; without a hidden layer W carries it.
            logits = logits + Dense(cfg.vocab_size, (None, "embed", "vocab"), num_in=2,
                                    use_bias=not cfg.hidden_dim, dtype=dtype,
                                    param_dtype=param_dtype, name="W")(x)  # (B, T, V)
        logits = nn.with_logical_constraint(logits, ("act_batch", "act_len", "act_vocab"))
        return logits.astype(jnp.float32)
