"""word2vec's host-side data: tokens, vocabulary, subsampling, dynamic windows, CBOW rows."""

import numpy as np
import pytest

from zoo.data.readers import word2vec as w2v


def test_tokenize_lowercases_splits_possessive_and_drops_punctuation():
    assert w2v.tokenize("Lomira's home is in Tavesh.") == ["lomira", "'s", "home", "is", "in",
                                                           "tavesh"]
    assert w2v.tokenize("It didn't rain, 2024!") == ["it", "didn't", "rain", "2024"]


def test_tokenize_reads_the_typographic_apostrophe_as_the_ascii_one():
    # The World English Bible (the bible corpus's English side) writes U+2019: "God’s" must not
    # become "god" + a stray "s" (4,179 of them in the English corpora), nor "don’t" "don" + "t".
    assert w2v.tokenize("God\u2019s people don\u2019t know") == w2v.tokenize(
        "God's people don't know") == ["god", "'s", "people", "don't", "know"]
    # As a closing quote it is still punctuation: "‘day’" is the word day.
    assert w2v.tokenize("He called the light \u2018day\u2019.") == ["he", "called", "the",
                                                                      "light", "day"]


def test_vocabulary_keeps_min_count_words_most_frequent_first():
    sentences = [["b", "a", "c"], ["a", "b", "d"], ["a", "e"]]
    vocab = w2v.build_vocabulary(sentences, min_count=2)
    assert vocab.words == ("a", "b")  # a: 3, b: 2; c, d, e dropped
    np.testing.assert_array_equal(vocab.counts, [3, 2])
    assert vocab.id("B") == 1  # looked up lower-cased, as the corpus was
    np.testing.assert_array_equal(vocab.encode(["c", "b", "a", "zz"]), [1, 0])
    with pytest.raises(KeyError, match="'zz' is not in the vocabulary.*min_count=2"):
        vocab.id("zz")
    with pytest.raises(ValueError, match="min_count"):
        w2v.build_vocabulary(sentences, min_count=4)


def test_keep_probabilities_follow_the_c_tool_formula():
    counts = np.array([5000, 300, 40, 1])
    t = 1e-3
    f = counts / counts.sum()
    expected = [min(1.0, (np.sqrt(fi / t) + 1) * t / fi) for fi in f]
    np.testing.assert_allclose(w2v.keep_probabilities(counts, t), expected, rtol=1e-12)
    assert expected[0] < 0.1 and expected[-1] == 1.0  # frequent words are thinned, rare kept
    np.testing.assert_array_equal(w2v.keep_probabilities(counts, 0.0), np.ones(4))
    # subsample drops each occurrence independently with that probability.
    ids = np.zeros(20000, np.int32)
    kept = w2v.subsample(ids, w2v.keep_probabilities(counts, t), np.random.default_rng(0))
    assert abs(len(kept) / len(ids) - expected[0]) < 0.01


def test_skipgram_pairs_use_each_positions_own_window():
    ids = np.array([10, 11, 12, 13, 14])
    sizes = np.array([1, 2, 1, 3, 1])
    centres, contexts = w2v.skipgram_pairs(ids, sizes)
    expected = [(10, 11),
                (11, 10), (11, 12), (11, 13),
                (12, 11), (12, 13),
                (13, 10), (13, 11), (13, 12), (13, 14),
                (14, 13)]
    assert list(zip(centres.tolist(), contexts.tolist())) == expected


def test_window_sizes_are_uniform_on_one_to_window():
    sizes = w2v.window_sizes(30000, 4, np.random.default_rng(0))
    counts = np.bincount(sizes, minlength=6)
    assert counts[0] == 0 and counts[5] == 0
    np.testing.assert_allclose(counts[1:5] / 30000, 0.25, atol=0.015)


def test_cbow_examples_pad_and_mask_the_window():
    ids = np.array([7, 8, 9])
    context, mask, centres = w2v.cbow_examples(ids, np.array([1, 2, 1]), window=2)
    np.testing.assert_array_equal(centres, [7, 8, 9])
    np.testing.assert_array_equal(context, [[8, 0, 0, 0], [7, 9, 0, 0], [8, 0, 0, 0]])
    np.testing.assert_array_equal(mask, [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0]])
    # A one-word sentence has no context: no example.
    assert len(w2v.cbow_examples(np.array([5]), np.array([2]), window=2)[2]) == 0


def test_training_rows_with_window_one_are_the_adjacent_pairs():
    vocab = w2v.Vocabulary(("a", "b", "c", "d"), np.array([4, 3, 2, 1]))
    sentences = [np.array([0, 1, 2]), np.array([3, 0])]
    rows = w2v.training_rows(sentences, vocab, "skipgram", window=1, sample=0.0, draws=2, seed=0)
    pairs = [(0, 1), (1, 0), (1, 2), (2, 1), (3, 0), (0, 3)] * 2  # two identical draws
    assert list(zip(rows["inputs"][:, 0].tolist(), rows["targets"].tolist())) == pairs
    np.testing.assert_array_equal(rows["weights"], np.ones(12))
    cbow = w2v.training_rows(sentences, vocab, "cbow", window=1, sample=0.0, draws=1, seed=0)
    assert cbow["inputs"].shape == (5, 2) and cbow["targets"].tolist() == [0, 1, 2, 3, 0]
    with pytest.raises(ValueError, match="config.model.mode"):
        w2v.training_rows(sentences, vocab, "glove", window=1, sample=0.0, draws=1, seed=0)


def test_noise_cdf_is_the_cumulative_count_power():
    counts = np.array([100, 10, 1])
    p = counts ** 0.75 / (counts ** 0.75).sum()
    np.testing.assert_allclose(w2v.noise_cdf(counts), np.cumsum(p), rtol=1e-6)
    assert w2v.noise_cdf(counts)[-1] == 1.0
