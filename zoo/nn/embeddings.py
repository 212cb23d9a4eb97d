"""Token, segment and position embeddings.

Positions are always explicit or derived: a packed batch passes `positions` [b, t] (each packed
sequence restarts at 0), and a decoder fed one token at a time either passes the absolute
position itself or sets `decode=True`, which keeps a running offset in the 'cache' collection
(created by `init`, advanced by every `apply(..., mutable=['cache'])`).
"""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from zoo.errors import ConfigError
from zoo.nn.precision import broadcast_param, param_einsum

Dtype = Any
Initializer = Any

# BERT and GPT-2 both initialise every embedding table with N(0, 0.02^2).
default_embed_init = nn.initializers.normal(stddev=0.02)


def _inv_timescales(features: int, max_timescale: float) -> np.ndarray:
    """1 / max_timescale^(2j / features) for j = 0 .. ceil(features / 2) - 1, in float64."""
    two_j = 2.0 * np.arange((features + 1) // 2, dtype=np.float64)
    return max_timescale ** (-two_j / features)


def sinusoidal_table(length: int, features: int, max_timescale: float = 10000.0) -> np.ndarray:
    """The Transformer's fixed position table, computed in float64 on the host.

    P[i, 2j] = sin(i / max_timescale^(2j/d)) and P[i, 2j+1] = cos(i / max_timescale^(2j/d)):
    sine and cosine interleaved, as in "Attention Is All You Need" section 3.5 (and the
    positional-encoding formula of the Transformer course slides). Some implementations
    (tensor2tensor, the positional-encoding figure of the Wenzhou University Transformer lecture)
    concatenate all sines then all cosines instead; that is a permutation of the features, not
    the same table.

    Args:
      length: number of positions (rows), starting at position 0.
      features: model width d (columns); may be odd, the last column is then a sine.
      max_timescale: the 10000 of the paper.

    Returns:
      float32 numpy array [length, features].
    """
    if length < 0 or features < 1:
        raise ValueError(
            f"sinusoidal_table: need length >= 0 and features >= 1, got {length=}, {features=}"
        )
    angles = np.arange(length, dtype=np.float64)[:, None] * _inv_timescales(features, max_timescale)
    # (length, ceil(d/2), 2) -> (length, 2*ceil(d/2)): column 2j is sin, column 2j+1 is cos.
    table = np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(length, -1)
    return table[:, :features].astype(np.float32)


def sinusoidal_encoding(
    positions: jnp.ndarray, features: int, max_timescale: float = 10000.0
) -> jnp.ndarray:
    """`sinusoidal_table` rows for arbitrary (traced) integer positions [...] -> [..., features].

    Computed on the fly in float32 (no table to size or embed in the program); the angle's
    rounding error grows with the position, about 1e-7 * position in absolute terms.
    """
    inv = jnp.asarray(_inv_timescales(features, max_timescale), jnp.float32)
    angles = positions.astype(jnp.float32)[..., None] * inv  # (..., ceil(d/2))
    enc = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # (..., ceil(d/2), 2)
    return enc.reshape(*positions.shape, -1)[..., :features]


def _default_positions(module: nn.Module, length: int, decode: bool) -> jnp.ndarray:
    """arange(length) [1, t], offset by the tokens already decoded when `decode` is set."""
    positions = jnp.arange(length, dtype=jnp.int32)[None, :]
    if not decode:
        return positions
    # The counter exists only after init: the init call itself (a full-length dummy input that
    # also sizes the attention KV caches) sees positions 0..t-1 and leaves the counter at 0.
    initialized = module.has_variable("cache", "position_index")
    index = module.variable("cache", "position_index", lambda: jnp.zeros((), jnp.int32))
    if initialized:
        start = index.value
        index.value = start + length
        positions = positions + start
    return positions


def _check_positions(name: str, positions: jnp.ndarray, batch: int, length: int) -> None:
    if positions.ndim != 2 or positions.shape[1] != length or positions.shape[0] not in (1, batch):
        raise ValueError(
            f"{name}: positions must be [batch, length] = [{batch}, {length}] (or [1, {length}]), "
            f"got shape {positions.shape}"
        )


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal encoding of each token's position to x [b, t, d].

    Attributes:
      max_timescale: the 10000 of the paper.
      decode: keep a running position offset in the 'cache' collection for one-token-at-a-time
        decoding (ignored when `positions` is passed).
    """

    max_timescale: float = 10000.0
    decode: bool = False
    dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray, positions: jnp.ndarray | None = None) -> jnp.ndarray:
        """x [b, t, d]; positions [b, t] int (packed rows, decode offsets), None for arange(t)."""
        batch, length, features = x.shape
        if positions is None:
            positions = _default_positions(self, length, self.decode)
        _check_positions("SinusoidalPositionalEncoding", positions, batch, length)
        pe = sinusoidal_encoding(positions, features, self.max_timescale)  # (b or 1, t, d)
        y = x.astype(self.dtype) + pe.astype(self.dtype)
        return nn.with_logical_constraint(y, ("act_batch", "act_len", "act_embed"))


class LearnedPositionalEmbedding(nn.Module):
    """Adds a learned [max_length, features] position table (BERT, GPT-2) to x [b, t, features].

    Attributes:
      max_length: rows in the table; the longest sequence (or largest position) supported.
      features: model width, must equal x's last dim.
      decode: keep a running position offset in the 'cache' collection (see module docstring).
    """

    max_length: int
    features: int
    decode: bool = False
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    embedding_init: Initializer = default_embed_init

    @nn.compact
    def __call__(self, x: jnp.ndarray, positions: jnp.ndarray | None = None) -> jnp.ndarray:
        """x [b, t, features]; positions [b, t] int or None for arange(t) (+ decode offset)."""
        batch, length, features = x.shape
        if features != self.features:
            raise ValueError(
                f"LearnedPositionalEmbedding: x has width {features} but features={self.features}"
            )
        if length > self.max_length:
            raise ConfigError(
                f"LearnedPositionalEmbedding: sequence length {length} exceeds "
                f"max_length={self.max_length}; raise max_length (the model's max_position) or "
                "truncate the inputs"
            )
        table = self.param(
            "embedding",
            nn.with_logical_partitioning(self.embedding_init, ("position", "embed")),
            (self.max_length, self.features),
            self.param_dtype,
        )
        if positions is None:
            positions = _default_positions(self, length, self.decode)
        _check_positions("LearnedPositionalEmbedding", positions, batch, length)
        # Traced positions cannot be range-checked; like Embed, out-of-range ones are clamped.
        pe = jnp.take(table, positions, axis=0, mode="clip")  # (b or 1, t, d)
        # Broadcast over the batch before the cast: the table's gradient sums the batch in
        # float32 (zoo.nn.precision).
        y = x.astype(self.dtype) + broadcast_param(pe, x.shape, self.dtype)
        return nn.with_logical_constraint(y, ("act_batch", "act_len", "act_embed"))


class Embed(nn.Module):
    """Token embedding table [num_embeddings, features], with `attend` for tied output logits.

    Ids outside [0, num_embeddings) cannot raise under jit; they are clamped to the nearest valid
    row (a negative id reads row 0, an id >= num_embeddings reads the last row), never wrapped
    around and never NaN. Validate ids on the host (in the featurizer) if that matters.

    Attributes:
      num_embeddings: vocabulary size.
      features: embedding width.
      axes: logical names of the table's two dims; tiny tables (BERT's 2 token types) pass
        (None, 'embed') so they are never split over the tensor axis.
    """

    num_embeddings: int
    features: int
    axes: tuple[str | None, str | None] = ("vocab", "embed")
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    embedding_init: Initializer = default_embed_init

    def setup(self):
        self.embedding = self.param(
            "embedding",
            nn.with_logical_partitioning(self.embedding_init, tuple(self.axes)),
            (self.num_embeddings, self.features),
            self.param_dtype,
        )

    def __call__(self, ids: jnp.ndarray) -> jnp.ndarray:
        """Integer ids [...] -> embeddings [..., features] in dtype."""
        if not jnp.issubdtype(ids.dtype, jnp.integer):
            raise ValueError(f"Embed: ids must be an integer array, got dtype {ids.dtype}")
        y = jnp.take(self.embedding, ids, axis=0, mode="clip").astype(self.dtype)
        if y.ndim == 3:
            y = nn.with_logical_constraint(y, ("act_batch", "act_len", "act_embed"))
        return y

    def attend(self, x: jnp.ndarray) -> jnp.ndarray:
        """Tied output projection: logits [..., vocab] = x [..., features] @ E^T, in dtype."""
        # The table's gradient from here is summed over every position in float32
        # (zoo.nn.precision), as the lookup's already is.
        logits = param_einsum("...d,vd->...v", x, self.embedding, self.dtype)
        if logits.ndim == 3:
            logits = nn.with_logical_constraint(logits, ("act_batch", "act_len", "act_vocab"))
        return logits


class TokenSegmentPositionEmbedding(nn.Module):
    """BERT's input embedding: word + token-type (segment) + learned position, summed.

    Submodules are named word_embeddings, token_type_embeddings and position_embeddings, as in
    the BERT checkpoints; the LayerNorm and dropout that follow in BERT belong to the model.

    Attributes:
      vocab_size: word-piece vocabulary size.
      features: hidden width.
      max_length: rows of the position table (BERT's max_position_embeddings).
      type_vocab_size: number of segment types (2 in BERT).
    """

    vocab_size: int
    features: int
    max_length: int = 512
    type_vocab_size: int = 2
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    embedding_init: Initializer = default_embed_init

    @nn.compact
    def __call__(
        self,
        ids: jnp.ndarray,
        token_type_ids: jnp.ndarray | None = None,
        positions: jnp.ndarray | None = None,
    ) -> jnp.ndarray:
        """ids [b, t]; token_type_ids [b, t] (default all 0, as BERT); positions [b, t] or None."""
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(ids)
        if token_type_ids.shape != ids.shape:
            raise ValueError(
                f"TokenSegmentPositionEmbedding: token_type_ids shape {token_type_ids.shape} "
                f"must equal ids shape {ids.shape}"
            )
        common = dict(
            dtype=self.dtype, param_dtype=self.param_dtype, embedding_init=self.embedding_init
        )
        words = Embed(self.vocab_size, self.features, name="word_embeddings", **common)(ids)
        types = Embed(
            self.type_vocab_size,
            self.features,
            # A 2-row table is not worth splitting, and a 'vocab' split over tensor would need the
            # tensor axis to divide type_vocab_size.
            axes=(None, "embed"),
            name="token_type_embeddings",
            **common,
        )(token_type_ids)
        return LearnedPositionalEmbedding(
            self.max_length, self.features, name="position_embeddings", **common
        )(words + types, positions)
