"""Recurrent language models: stacked Elman / LSTM / GRU layers over token embeddings.

The model of Zaremba, Sutskever & Vinyals (2014), "Recurrent Neural Network Regularization":
embeddings feed `num_layers` recurrent layers, the last layer's output a softmax over the next
token. Dropout is applied to the non-recurrent connections only (the embeddings, the outputs of
every layer, hence also before the softmax), never to the state carried from step to step, so
it regularises without eroding the memory. Optionally the output projection is the embedding
table itself (Press & Wolf 2017; Inan et al. 2017), which needs hidden_size == embed_dim.

The cells are zoo.nn.recurrent_cells' (PyTorch gate order, float32 carry). Inputs are the GPT task's
packed rows: several documents share a row, so each layer's state is reset to zeros wherever a
new document starts (segment_ids[t] != segment_ids[t-1]) and never carries one document into the
next. `zoo.nn.recurrent.RNN` has no resets, so the per-layer scan lives here, built from the
cell API (weights / project / step / initialize_carry).

Parameters (G gates: 4 LSTM, 3 GRU, 1 Elman; D = embed_dim; H = hidden_size):

    embed/embedding          (V, D)   ('vocab', 'embed')
    layer_{k}/input_kernel   (D or H, G, H), recurrent_kernel (H, G, H), bias (G, H)
                             [GRU: + recurrent_bias (G, H)]   (see zoo.nn.recurrent_cells)
    output/kernel, bias      (H, V), (V,)   ('embed', 'vocab')   when not tied
    output_bias              (V,)     ('vocab',)                   when tied
"""

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.errors import ConfigError
from zoo.models.config_checks import check_float_dtypes
from zoo.nn.embeddings import Embed
from zoo.nn.linear import Dense
from zoo.nn.recurrent_cells import CELL_KINDS, make_cell

Carries = tuple  # one carry per layer: (c, h) for the LSTM, h for GRU / Elman; each (B, H)


@dataclasses.dataclass(frozen=True)
class RNNLMConfig:
    """Attributes:
      vocab_size: |V|, the softmax size.
      cell: 'lstm', 'gru' or 'rnn' (Elman, tanh).
      embed_dim: D, the token embedding width.
      hidden_size: H, units of every recurrent layer.
      num_layers: stacked recurrent layers.
      dropout_rate: dropout on the embeddings, between layers and before the softmax (Zaremba
        et al.); the recurrent connections get none.
      tie_embeddings: the output projection is the embedding table (logits = h E^T + b, b its
        own bias); requires hidden_size == embed_dim.
      dtype: compute dtype of the matmuls; the carries and logits stay float32.
      param_dtype: storage dtype of the parameters.
    """

    vocab_size: int
    cell: str = "lstm"
    embed_dim: int = 64
    hidden_size: int = 64
    num_layers: int = 2
    dropout_rate: float = 0.0
    tie_embeddings: bool = False
    dtype: str = "float32"
    param_dtype: str = "float32"

    def __post_init__(self):
        for name in ("vocab_size", "embed_dim", "hidden_size", "num_layers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"RNNLMConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.cell not in CELL_KINDS:
            raise ConfigError(f"RNNLMConfig.cell must be one of {CELL_KINDS}, got {self.cell!r}")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ConfigError(f"RNNLMConfig.dropout_rate must be in [0, 1), got "
                              f"{self.dropout_rate}")
        if self.tie_embeddings and self.hidden_size != self.embed_dim:
            raise ConfigError(
                f"RNNLMConfig.tie_embeddings needs hidden_size == embed_dim (the last layer's "
                f"output is scored against the embedding table), got hidden_size="
                f"{self.hidden_size}, embed_dim={self.embed_dim}; set them equal or "
                "tie_embeddings=False")
        check_float_dtypes(self, "RNNLMConfig")


# (embed_dim, hidden_size, num_layers). tiny follows the house rule (2 layers, width <= 64) and
# can be tied; base is Zaremba et al.'s "medium" LSTM (650 units, 2 layers).
SIZES: dict[str, tuple[int, int, int]] = {
    "tiny": (64, 64, 2),
    "base": (650, 650, 2),
}


def config_for_size(size: str, **overrides: Any) -> RNNLMConfig:
    if size not in SIZES:
        raise ConfigError(
            f"config.model.size: unknown RNN LM size {size!r}; choose from {list(SIZES)}")
    embed_dim, hidden_size, num_layers = SIZES[size]
    return RNNLMConfig(**{"embed_dim": embed_dim, "hidden_size": hidden_size,
                          "num_layers": num_layers, **overrides})


def num_gates(cell: str) -> int:
    return {"lstm": 4, "gru": 3, "rnn": 1}[cell]


def flops_per_token(cfg: RNNLMConfig) -> float:
    """Training FLOPs per token: 3 x the forward matmuls (forward 1x, backward 2x).

    Forward, per layer with input width D_k (embed_dim for the first, hidden_size above):
    2 * G * H * (D_k + H), the input and recurrent kernels; plus the output projection
    2 * H * V (tied or not, it is a matmul). So

        6 * (sum_k G * H * (D_k + H) + H * V).

    The embedding lookup is a gather and the gate maths element-wise; neither is counted.
    """
    g, h = num_gates(cfg.cell), cfg.hidden_size
    layers = sum(g * h * ((cfg.embed_dim if k == 0 else h) + h) for k in range(cfg.num_layers))
    return 6.0 * (layers + h * cfg.vocab_size)


def activation_bytes(cfg: RNNLMConfig, batch: int, seq_len: int, tensor_parallel: int
                     ) -> float:
    """A rough count of what the scan keeps for the backward pass of a `batch`-row micro-batch
    of `seq_len` tokens on one device (the dry run), per token: the embedding, and per layer
    the gate pre-activations (G x H, compute dtype), the float32 gates and carries the step's
    backward needs (about 2G + 2 float32 vectors of H: gates, their nonlinear outputs, c and h)
    and the layer output (H); then the float32 logits and their softmax. Hidden units and
    vocab are split by tensor parallelism."""
    tokens = batch * seq_len
    item = jnp.dtype(cfg.dtype).itemsize
    g, h = num_gates(cfg.cell), cfg.hidden_size
    per_layer = (g * h * item + (2 * g + 2) * h * 4 + h * item) / tensor_parallel
    return tokens * (cfg.embed_dim * item + cfg.num_layers * per_layer
                     + 2 * cfg.vocab_size * 4 / tensor_parallel)


def initial_carries(cfg: RNNLMConfig, batch: int) -> Carries:
    """Zero state of every layer for `batch` sequences (the decoding state; batch axis 0)."""
    return tuple(
        make_cell(cfg.cell, cfg.hidden_size, dtype=jnp.dtype(cfg.dtype)).initialize_carry(batch)
        for _ in range(cfg.num_layers))


# N(0, 1), PyTorch's nn.Embedding default: with the cells' lecun-normal input kernels the first
# layer's gate pre-activations then start at unit variance. GPT's N(0, 0.02^2) is far too small
# without a LayerNorm after it: every gate starts near its midpoint and h near 0, so training
# starts slowly. Tiny LSTM run (400 steps), held-out perplexity: 20.1 with N(0, 0.02^2), 16.7 with
# U(+-sqrt(3/D)), 10.9 with N(0, 1); tied to a N(0, 0.02^2) table it stays at 185 (unigram: 261).
embedding_init = nn.initializers.normal(stddev=1.0)


def document_starts(segment_ids: jnp.ndarray) -> jnp.ndarray:
    """[B, T] bool: True where a new document begins inside the row (t >= 1 and the segment id
    changes). Position 0 is never marked: there the state is the one passed in."""
    changed = segment_ids[:, 1:] != segment_ids[:, :-1]
    return jnp.pad(changed, ((0, 0), (1, 0)))


class RNNLM(nn.Module):
    config: RNNLMConfig

    @nn.compact
    def __call__(self, tokens, *, segment_ids=None, carries: Carries | None = None,
                 deterministic=True, return_carries=False):
        """tokens [B, T] int -> logits [B, T, V] (float32) for the token after each position.

        Args:
          tokens: [B, T] token ids.
          segment_ids: [B, T] packed-document ids (0 = padding); every layer's state is reset
            to zeros where the id changes. None: each row is one document.
          carries: the state to start from, one carry per layer (see `initial_carries`); None
            starts from zeros. Decoding passes the previous call's carries.
          deterministic: disable dropout; when False, needs a 'dropout' rng.
          return_carries: also return the state after the last position.

        Returns:
          logits, or (logits, carries) with return_carries.
        """
        cfg = self.config
        if tokens.ndim != 2:
            raise ValueError(f"RNNLM: tokens must be [batch, length], got shape {tokens.shape}")
        if segment_ids is not None and segment_ids.shape != tokens.shape:
            raise ValueError(f"RNNLM: segment_ids shape {segment_ids.shape} must equal tokens "
                             f"shape {tokens.shape}")
        batch, length = tokens.shape
        if carries is None:
            carries = initial_carries(cfg, batch)
        elif len(carries) != cfg.num_layers:
            raise ValueError(f"RNNLM: carries needs one entry per layer ({cfg.num_layers}), "
                             f"got {len(carries)}")
        dtype, param_dtype = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        if segment_ids is None:
            resets = jnp.zeros((length, batch), bool)
        else:
            resets = document_starts(segment_ids).T  # (T, B): scanned over time

        embed = Embed(cfg.vocab_size, cfg.embed_dim, dtype=dtype, param_dtype=param_dtype,
                      embedding_init=embedding_init, name="embed")
        x = embed(tokens)  # (B, T, D)
        drop = nn.Dropout(cfg.dropout_rate)
        x = drop(x, deterministic=deterministic)
        new_carries = []
        for k in range(cfg.num_layers):
            cell = make_cell(cfg.cell, cfg.hidden_size, dtype=dtype, param_dtype=param_dtype,
                             name=f"layer_{k}")
            w = cell.weights(x.shape[-1])  # fetched and cast once, outside the loop
            # The input half of every step in one matmul: (B, T, D_k) -> (T, B, G, H).
            xp = cell.project(w, x, time_major=True)
            xp = nn.with_logical_constraint(xp, ("act_len", "act_batch", None, "act_rnn_hidden"))
            zero = cell.initialize_carry(batch)

            def body(carry, inputs, cell=cell, w=w, zero=zero):
                xp_t, reset_t = inputs  # (B, G, H), (B,)
                # A new document starts from the zero state, like the first one in a row.
                carry = jax.tree.map(lambda c, z: jnp.where(reset_t[:, None], z, c), carry, zero)
                carry, h = cell.step(w, carry, xp_t)
                return carry, h.astype(dtype)

            start = jax.tree.map(lambda c, z: jnp.asarray(c, z.dtype), carries[k], zero)
            carry, hs = jax.lax.scan(body, start, (xp, resets))
            new_carries.append(carry)
            x = jnp.swapaxes(hs, 0, 1)  # (T, B, H) -> (B, T, H)
            x = nn.with_logical_constraint(x, ("act_batch", "act_len", "act_rnn_hidden"))
            # Between layers and, after the last, before the softmax.
            x = drop(x, deterministic=deterministic)

        if cfg.tie_embeddings:
            # The table is shared, the bias is not (as in PyTorch's tied decoder): it holds the
            # word frequencies, which h E^T alone would have to encode through every embedding.
            bias = self.param("output_bias", nn.with_logical_partitioning(
                nn.initializers.zeros_init(), ("vocab",)), (cfg.vocab_size,), param_dtype)
            logits = embed.attend(x) + bias.astype(dtype)  # (B, T, V) = h E^T + b
        else:
            logits = Dense(cfg.vocab_size, ("embed", "vocab"), dtype=dtype,
                           param_dtype=param_dtype, name="output")(x)  # (B, T, V)
        logits = nn.with_logical_constraint(logits, ("act_batch", "act_len", "act_vocab"))
        logits = logits.astype(jnp.float32)
        if return_carries:
            return logits, tuple(new_carries)
        return logits
