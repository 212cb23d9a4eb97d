"""The tokenizer's training sample: bounded, seeded, uniform, and the whole stream when it is
small."""

import numpy as np
import pytest

from zoo.data.tokenizers import sample
from zoo.errors import ConfigError


def _stream(n):
    return (f"sentence {i}" for i in range(n))  # a generator: read once, never held


def test_a_small_stream_is_kept_whole_and_in_order():
    drawn = sample.sample_sentences(_stream(5), 10, seed=0)
    assert drawn.sentences == [f"sentence {i}" for i in range(5)] and drawn.seen == 5


def test_the_sample_is_bounded_and_the_same_for_the_same_seed():
    a = sample.sample_sentences(_stream(100_000), 100, seed=1)
    assert len(a.sentences) == 100 and a.seen == 100_000
    assert a == sample.sample_sentences(_stream(100_000), 100, seed=1)
    assert a.sentences != sample.sample_sentences(_stream(100_000), 100, seed=2).sentences


def test_every_sentence_has_the_same_chance():
    # 300 draws of 50 from 1,000: each position's count ~ Binomial(300, 0.05), mean 15. A
    # sampler biased to the start or the end of the stream moves the halves' totals apart.
    counts = np.zeros(1000)
    for seed in range(300):
        for s in sample.sample_sentences(_stream(1000), 50, seed=seed).sentences:
            counts[int(s.split()[1])] += 1
    assert counts.sum() == 300 * 50
    first, second = counts[:500].sum(), counts[500:].sum()
    assert abs(first - second) < 0.06 * counts.sum()  # ~5 standard deviations
    tenths = counts.reshape(10, 100).sum(axis=1)
    assert tenths.min() > 0.8 * 1500 and tenths.max() < 1.2 * 1500


@pytest.mark.parametrize("size", [0, -3, 2.5, "10", True])
def test_a_bad_size_names_the_key(size):
    with pytest.raises(ConfigError, match=r"config.data.tokenizer_sample_sentences=.* must "
                                          "be a positive int"):
        sample.check_size(size, "config.data.tokenizer_sample_sentences")
