"""A bounded, seeded, uniform sample of a stream of sentences, for training a tokenizer.

SentencePiece holds every sentence it is given in memory (its own `input_sentence_size` samples
only after loading them, unseeded): on a 20 GB corpus that is the whole corpus. Reservoir
sampling keeps at most `size` sentences while the corpus streams past once, and every
sentence has the same chance to be kept. Algorithm L (Li 1994) draws O(size * log(n / size))
random numbers instead of one per sentence: the stream is skipped through, not sampled
sentence by sentence, which matters at billions of sentences.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Iterable

from zoo.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Sample:
    sentences: list[str]
    seen: int  # sentences in the stream


def check_size(size, key: str) -> int:
    """`size` as an int >= 1, else a ConfigError naming `key`."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(
            f"{key}={size!r} must be a positive int: the most sentences the tokenizer is "
            "trained on (a uniform sample of the corpus; 10,000,000 takes ~1-2 GB of memory)")
    return size


def sample_sentences(sentences: Iterable[str], size: int, seed: int) -> Sample:
    """At most `size` of `sentences`, each kept with the same probability, the same ones for
    the same stream and seed. A stream of at most `size` sentences is kept whole, in order."""
    stream = iter(sentences)
    kept = list(itertools.islice(stream, size))
    seen = len(kept)
    if seen < size:
        return Sample(kept, seen)
    rng = random.Random(seed)

    def uniform() -> float:  # in (0, 1]: its log is finite
        return 1.0 - rng.random()

    w = math.exp(math.log(uniform()) / size)
    while True:
        # Sentences to pass over before the next one kept; the geometric gap of Algorithm L.
        gap = math.log1p(-w)
        skip = math.floor(math.log(uniform()) / gap) if gap < 0 else math.inf
        if skip == math.inf:
            seen += sum(1 for _ in stream)
            return Sample(kept, seen)
        passed = sum(1 for _ in itertools.islice(stream, skip))
        seen += passed
        nxt = next(stream, None) if passed == skip else None
        if nxt is None:
            return Sample(kept, seen)
        seen += 1
        kept[rng.randrange(size)] = nxt
        w *= math.exp(math.log(uniform()) / size)
