"""word2vec's host-side data: a word vocabulary, frequent-word subsampling, Mikolov's dynamic
window, and the unigram^0.75 noise distribution that negative samples are drawn from.

Everything here is numpy on the host and follows the reference C tool (word2vec.c, Mikolov et
al. 2013) where it makes a choice:

* Tokens: a sentence is lower-cased and split into words, runs of letters and digits (an inner
  apostrophe kept: "didn't"); the possessive "'s" is a token of its own, so "Lomira's" gives
  "lomira" and "'s", and other punctuation is dropped. The typographic apostrophe U+2019 (the
  World English Bible's "God’s", "don’t") is read as the ASCII one. A sentence is the unit a
  window never crosses, as a line is in the C tool.
* Vocabulary: the words seen at least `min_count` times in the training split, most frequent
  first (ties alphabetical), with their counts. Other words are removed from sentences before
  windows are taken, as the C tool does, so a window reaches past them.
* Subsampling (the C tool's formula, not the paper's 1 - sqrt(t/f)): a word of corpus frequency
  f = count / total is kept with probability min(1, (sqrt(f/t) + 1) * t / f); `t` is
  config.data.sample (the C tool's -sample, default 1e-3; 0 keeps every word).
* Dynamic window: each centre word draws b uniformly from 1..window and pairs with the words at
  most b away (the C tool's `b = rand % window`), so near words are sampled more often.
* Noise: P(w) = count(w)^0.75 / sum_v count(v)^0.75, given as a cumulative table that the device
  step searches with uniform draws (zoo.models.word2vec.sample_negatives).

Training rows are drawn up front: the C tool redraws subsampling and windows on every pass over
the corpus; here config.data.pair_draws such passes are drawn once (each with its own seed) and
the batch iterator cycles through their shuffled union. Tokenising and pairing run in Python
on the host, which suits corpora of up to some tens of millions of tokens.
"""

import dataclasses
import functools
import re
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from zoo.errors import ConfigError

# A word: letters/digits with inner apostrophes ("didn't"), but not a trailing possessive 's,
# which the second alternative takes as a token of its own.
_TOKEN = re.compile(r"[^\W_]+(?:'(?!s\b)[^\W_]+)*|(?<=[^\W_])'s\b")


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens of one sentence (see the module docstring)."""
    return _TOKEN.findall(text.lower().replace("\u2019", "'"))


@dataclasses.dataclass(frozen=True, eq=False)  # eq would compare arrays
class Vocabulary:
    """Words with their training-split counts, most frequent first; a word's id is its index."""

    words: tuple[str, ...]
    counts: np.ndarray  # int64 [V]
    min_count: int = 1

    def __post_init__(self):
        if len(self.words) != len(self.counts):
            raise ValueError(f"Vocabulary: {len(self.words)} words but {len(self.counts)} counts")

    @functools.cached_property
    def _index(self) -> dict[str, int]:
        return {w: i for i, w in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: str) -> bool:
        return word in self._index

    def id(self, word: str) -> int:
        """The id of `word` (lower-cased first, as the corpus was); KeyError naming the word if
        it is not in the vocabulary."""
        key = word.lower()
        if key not in self._index:
            raise KeyError(
                f"word {word!r} is not in the vocabulary ({len(self)} words seen at least "
                f"min_count={self.min_count} times in the training split)")
        return self._index[key]

    def encode(self, tokens: Iterable[str]) -> np.ndarray:
        """int32 ids of the tokens in the vocabulary; others are dropped (not mapped to UNK)."""
        return np.asarray([self._index[t] for t in tokens if t in self._index], np.int32)


def build_vocabulary(sentences: Iterable[Sequence[str]], min_count: int = 1) -> Vocabulary:
    """The vocabulary of tokenised `sentences`: words seen at least `min_count` times."""
    if min_count < 1:
        raise ConfigError(f"config.data.min_count={min_count} must be >= 1")
    counts = Counter(t for sentence in sentences for t in sentence)
    kept = sorted((w for w, c in counts.items() if c >= min_count),
                  key=lambda w: (-counts[w], w))
    if not kept:
        raise ConfigError(f"no word occurs min_count={min_count} times in the training split; "
                          "lower config.data.min_count or add data")
    return Vocabulary(tuple(kept), np.asarray([counts[w] for w in kept], np.int64), min_count)


def keep_probabilities(counts: np.ndarray, sample: float) -> np.ndarray:
    """Per-word probability of being kept by subsampling: min(1, (sqrt(f/t) + 1) * t / f) with
    f = count / sum(counts) and t = `sample` (the C tool's formula); all ones for sample=0."""
    if sample < 0:
        raise ConfigError(f"config.data.sample={sample} must be >= 0 (0 turns subsampling off)")
    counts = np.asarray(counts, np.float64)
    if sample == 0:
        return np.ones(len(counts))
    f = counts / counts.sum()
    return np.minimum(1.0, (np.sqrt(f / sample) + 1.0) * sample / f)


def noise_distribution(counts: np.ndarray, power: float = 0.75) -> np.ndarray:
    """P(w) proportional to count(w)^power (0.75 in word2vec), float64 [V]."""
    weights = np.asarray(counts, np.float64) ** power
    return weights / weights.sum()


def noise_cdf(counts: np.ndarray, power: float = 0.75) -> np.ndarray:
    """The cumulative noise distribution as float32 [V], its last entry exactly 1: a uniform
    u in [0, 1) falls in bucket searchsorted(cdf, u, side='right')."""
    cdf = np.cumsum(noise_distribution(counts, power))
    cdf[-1] = 1.0  # no float rounding gap above the last word
    return cdf.astype(np.float32)


def subsample(ids: np.ndarray, keep: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The ids of one sentence that survive subsampling (`keep` from keep_probabilities)."""
    return ids[rng.random(len(ids)) < keep[ids]]


def window_sizes(length: int, window: int, rng: np.random.Generator) -> np.ndarray:
    """Each position's effective window, uniform on 1..window (the dynamic window)."""
    if window < 1:
        raise ConfigError(f"config.data.window={window} must be >= 1")
    return rng.integers(1, window + 1, size=length)


def skipgram_pairs(ids: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(centre, context) id pairs of one sentence: position i pairs with every j != i with
    |i - j| <= sizes[i]; in position order of the centre, then of the context."""
    centres, contexts = [], []
    for i, b in enumerate(sizes):
        for j in range(max(0, i - b), min(len(ids), i + b + 1)):
            if j != i:
                centres.append(ids[i])
                contexts.append(ids[j])
    return np.asarray(centres, np.int32), np.asarray(contexts, np.int32)


def cbow_examples(ids: np.ndarray, sizes: np.ndarray, window: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CBOW examples of one sentence: for each position i with at least one context word,
    (context [2*window] ids, mask [2*window] (1 = a real context word), centre id). Context
    words are those with 0 < |i - j| <= sizes[i], left to right, padded with id 0 / mask 0."""
    contexts, masks, centres = [], [], []
    for i, b in enumerate(sizes):
        near = [ids[j] for j in range(max(0, i - b), min(len(ids), i + b + 1)) if j != i]
        if not near:
            continue
        row = np.zeros(2 * window, np.int32)
        row[:len(near)] = near
        mask = np.zeros(2 * window, np.float32)
        mask[:len(near)] = 1.0
        contexts.append(row)
        masks.append(mask)
        centres.append(ids[i])
    if not centres:
        return (np.zeros((0, 2 * window), np.int32), np.zeros((0, 2 * window), np.float32),
                np.zeros((0,), np.int32))
    return np.stack(contexts), np.stack(masks), np.asarray(centres, np.int32)


def training_rows(sentences: Sequence[np.ndarray], vocab: Vocabulary, mode: str, window: int,
                  sample: float, draws: int, seed: int, stream: int = 0
                  ) -> dict[str, np.ndarray]:
    """Rows for the batch iterator from `draws` passes of subsampling + dynamic windows.

    Args:
      sentences: each sentence's vocabulary ids (out-of-vocabulary words already dropped).
      mode: 'skipgram' (inputs [N, 1] = the centre word, targets = a context word) or 'cbow'
        (inputs [N, 2*window] = the context words, targets = the centre word).
      seed, stream: pass d draws from np.random.default_rng([seed, stream, d]); the eval
        split uses another stream than training.

    Returns:
      {'inputs' int32 [N, C], 'input_weights' float32 [N, C] (1 for real inputs), 'targets'
      int32 [N], 'weights' float32 [N] (all 1; eval padding adds 0-weight rows)}.
    """
    if mode not in ("skipgram", "cbow"):
        raise ConfigError(f"config.model.mode must be 'skipgram' or 'cbow', got {mode!r}")
    if draws < 1:
        raise ConfigError(f"config.data.pair_draws={draws} must be >= 1")
    keep = keep_probabilities(vocab.counts, sample)
    inputs, input_weights, targets = [], [], []
    for draw in range(draws):
        rng = np.random.default_rng([seed, stream, draw])
        for ids in sentences:
            ids = subsample(ids, keep, rng)
            sizes = window_sizes(len(ids), window, rng)
            if mode == "skipgram":
                centres, contexts = skipgram_pairs(ids, sizes)
                inputs.append(centres[:, None])
                input_weights.append(np.ones((len(centres), 1), np.float32))
                targets.append(contexts)
            else:
                context, mask, centres = cbow_examples(ids, sizes, window)
                inputs.append(context)
                input_weights.append(mask)
                targets.append(centres)
    width = 1 if mode == "skipgram" else 2 * window
    rows = {
        "inputs": np.concatenate(inputs or [np.zeros((0, width), np.int32)]).astype(np.int32),
        "input_weights": np.concatenate(input_weights or [np.zeros((0, width), np.float32)]),
        "targets": np.concatenate(targets or [np.zeros((0,), np.int32)]).astype(np.int32),
    }
    rows["weights"] = np.ones(len(rows["targets"]), np.float32)
    return rows
