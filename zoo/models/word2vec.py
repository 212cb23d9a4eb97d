"""word2vec (Mikolov et al. 2013): CBOW and skip-gram trained with negative sampling.

The lecture notes from NNLM to BERT ("从NNLM到Word2Vec") describe the model as two matrices of
shape [vocab_size, embedding_size]: the Embedding matrix, which maps a (one-hot) input word to its
vector, and the Context matrix, which scores how well a word fits as the output given that
vector. Training pulls each input's vector towards the context vectors of the words it really
occurs with and pushes it away from those of sampled "noise" words (the error
target - sigmoid(score)). Afterwards only the Embedding matrix is kept as the word vectors; the
Context matrix only served to train it and is discarded. Here they are the params `embedding`
and `context`.

* skip-gram: the input is one centre word; the output is a word of its window.
* CBOW: the input is the window's words, their embeddings averaged (padding masked out); the
  output is the centre word.

For an input vector h, its output word o and K noise words n_k, the loss is

    -log sigmoid(c_o . h) - sum_k log sigmoid(-c_{n_k} . h)

with c the Context rows. Initialisation follows the C tool: embeddings uniform in
[-0.5/D, 0.5/D), context vectors zero.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from zoo.errors import ConfigError

MODES = ("skipgram", "cbow")


@dataclasses.dataclass(frozen=True)
class Word2VecConfig:
    """Hyperparameters of one word2vec model (frozen: safe as a static jit argument).

    Attributes:
      vocab_size: rows of both tables.
      embed_dim: vector width D (300 is a common value, the lecture notes from NNLM to BERT say).
      mode: 'skipgram' or 'cbow'.
    """

    vocab_size: int
    embed_dim: int = 300
    mode: str = "skipgram"
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def __post_init__(self):
        if self.mode not in MODES:
            raise ConfigError(f"config.model.mode must be one of {MODES}, got {self.mode!r}")
        if self.vocab_size < 1 or self.embed_dim < 1:
            raise ConfigError(f"Word2VecConfig: vocab_size={self.vocab_size} and "
                              f"embed_dim={self.embed_dim} must be >= 1")


SIZES = {"tiny": dict(embed_dim=32), "base": dict(embed_dim=300)}


def config_for_size(size: str, **overrides) -> Word2VecConfig:
    """A named size ('tiny' for tests and the CPU demo, 'base' = 300-d vectors)."""
    if size not in SIZES:
        raise ConfigError(f"config.model.size={size!r}; choose one of {sorted(SIZES)}")
    for key in ("dtype", "param_dtype"):
        if isinstance(overrides.get(key), str):
            overrides[key] = jnp.dtype(overrides[key])
    return Word2VecConfig(**{**SIZES[size], **overrides})


def _embedding_init(key, shape, dtype=jnp.float32):
    # The C tool's syn0: uniform in [-0.5/D, 0.5/D).
    return jax.random.uniform(key, shape, dtype, -0.5 / shape[-1], 0.5 / shape[-1])


class Word2Vec(nn.Module):
    """The two tables and the scores of output words for an input."""

    config: Word2VecConfig

    def setup(self):
        cfg = self.config
        shape = (cfg.vocab_size, cfg.embed_dim)
        # Kept after training: the word vectors.
        self.embedding = self.param(
            "embedding", nn.with_logical_partitioning(_embedding_init, ("vocab", "embed")),
            shape, cfg.param_dtype)
        # Discarded after training (as the word2vec section of the lecture notes from NNLM to
        # BERT says); zero at the start as the C tool's syn1neg.
        self.context = self.param(
            "context", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab", "embed")),
            shape, cfg.param_dtype)

    def embed(self, ids: jnp.ndarray) -> jnp.ndarray:
        """Rows of the kept `embedding` table: ids [...] -> [..., D]."""
        return jnp.take(self.embedding, ids, axis=0, mode="clip").astype(self.config.dtype)

    def encode(self, inputs: jnp.ndarray, input_weights: jnp.ndarray) -> jnp.ndarray:
        """The input vector h [B, D]: the weighted mean of the inputs' embeddings.

        inputs [B, C] ids, input_weights [B, C] (1 real, 0 padding). Skip-gram has C = 1, so h
        is the centre word's embedding; CBOW averages the window (the C tool's cbow_mean=1),
        and its gradient reaches every context word in full, as the C tool's update does
        (context_mean).
        """
        vectors = self.embed(inputs)  # (B, C, D)
        w = input_weights.astype(jnp.float32)
        total = jnp.einsum("bc,bcd->bd", w, vectors.astype(jnp.float32))
        h = context_mean(total, jnp.maximum(w.sum(axis=1, keepdims=True), 1.0))  # (B, D)
        return nn.with_logical_constraint(h.astype(self.config.dtype), ("act_batch", "act_embed"))

    def __call__(self, inputs: jnp.ndarray, input_weights: jnp.ndarray,
                 outputs: jnp.ndarray) -> jnp.ndarray:
        """Scores c_o . h [B, M] in float32 of output words outputs [B, M] (the true output
        first, then the noise words) for inputs [B, C] with input_weights [B, C]."""
        h = self.encode(inputs, input_weights)  # (B, D)
        c = jnp.take(self.context, outputs, axis=0, mode="clip").astype(self.config.dtype)
        scores = jnp.einsum("bd,bmd->bm", h, c)  # (B, M)
        return nn.with_logical_constraint(scores.astype(jnp.float32), ("act_batch", None))


@jax.custom_vjp
def context_mean(total: jnp.ndarray, count: jnp.ndarray) -> jnp.ndarray:
    """total [B, D] / count [B, 1], whose gradient passes to `total` undivided.

    CBOW's h is the mean of the context embeddings, but the reference's update is not the
    mean's gradient: word2vec.c adds the whole error neu1e to every context word's vector
    (`syn0[c + last_word * layer1_size] += neu1e[c]`), and gensim's cbow_mean=1 does the same
    (it divides the error by the count only when h is the sum, cbow_mean=0). Under their SGD
    recipe (alpha 0.025) the mean's own gradient, 1/count of that, trains the embedding table
    ~4.6x more slowly than they do on the English corpora (the average window's words);
    benchmarks/quality_word2vec.py's ablation 'mean_gradient' measures what it costs.
    """
    return total / count


def _context_mean_fwd(total, count):
    return total / count, count


def _context_mean_bwd(count, cotangent):
    return cotangent, jnp.zeros_like(count)


context_mean.defvjp(_context_mean_fwd, _context_mean_bwd)


def negative_sampling_loss(scores: jnp.ndarray, output_weights: jnp.ndarray) -> jnp.ndarray:
    """Per-example loss [B] = -log sigmoid(s_0) - sum_k w_k log sigmoid(-s_k).

    scores [B, 1 + K]: column 0 the true output's, the rest the noise words'. output_weights
    [B, 1 + K]: column 0 is ignored; w_k = 0 drops a noise word (one equal to the true output,
    which the C tool skips too).
    """
    scores = scores.astype(jnp.float32)
    positive = -jax.nn.log_sigmoid(scores[:, 0])
    negative = -(output_weights[:, 1:].astype(jnp.float32) * jax.nn.log_sigmoid(-scores[:, 1:]))
    return positive + negative.sum(axis=1)


def sample_negatives(rng: jax.Array, cdf: jnp.ndarray, shape: tuple[int, ...]) -> jnp.ndarray:
    """Word ids drawn from the noise distribution given as its cumulative table cdf [V] (last
    entry 1, zoo.data.readers.word2vec.noise_cdf): inverse-CDF sampling by binary search,
    O(log V) per draw, so it stays cheap for large vocabularies."""
    u = jax.random.uniform(rng, shape, jnp.float32)
    ids = jnp.searchsorted(cdf, u, side="right")
    return jnp.minimum(ids, cdf.shape[0] - 1).astype(jnp.int32)


def cosine_neighbours(vectors: np.ndarray, query: np.ndarray, k: int,
                      exclude: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
    """The k rows of vectors [V, D] most cosine-similar to query [D], best first, on the host.

    Returns (ids [k'], similarities [k']) with k' = min(k, V - len(exclude)); rows in `exclude`
    (e.g. the query words themselves) are never returned. Ties go to the lower id.
    """
    vectors = np.asarray(vectors, np.float64)
    query = np.asarray(query, np.float64)
    norms = np.linalg.norm(vectors, axis=1) * np.linalg.norm(query)
    sims = vectors @ query / np.maximum(norms, 1e-12)  # (V,)
    sims[np.asarray(list(exclude), np.int64)] = -np.inf
    order = np.argsort(-sims, kind="stable")[:max(0, min(k, len(sims) - len(set(exclude))))]
    return order, sims[order]
