"""word2vec's model: the negative-sampling loss, CBOW averaging, noise sampling, neighbours."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.data.readers import word2vec as w2v_data
from zoo.models import word2vec as w2v


def _log_sigmoid(x):
    return -np.log1p(np.exp(-x))


def _params(config, seed=0):
    """Random params (the context table is zero at init, which would hide mistakes)."""
    rng = np.random.default_rng(seed)
    shape = (config.vocab_size, config.embed_dim)
    return {"embedding": rng.normal(size=shape).astype(np.float32),
            "context": rng.normal(size=shape).astype(np.float32)}


def test_negative_sampling_loss_matches_float64_reference():
    config = w2v.Word2VecConfig(vocab_size=11, embed_dim=8, mode="cbow")
    params = _params(config)
    inputs = np.array([[1, 2, 3, 0], [4, 0, 0, 0], [5, 6, 0, 0]], np.int32)
    input_weights = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]], np.float32)
    outputs = np.array([[7, 8, 9, 7], [2, 10, 3, 3], [0, 1, 2, 4]], np.int32)  # true, 3 noise
    output_weights = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 1, 1]], np.float32)
    scores = w2v.Word2Vec(config).apply({"params": params}, inputs, input_weights, outputs)
    loss = w2v.negative_sampling_loss(scores, output_weights)

    e = params["embedding"].astype(np.float64)
    c = params["context"].astype(np.float64)
    expected = []
    for b in range(3):
        h = sum(w * e[i] for i, w in zip(inputs[b], input_weights[b])) / input_weights[b].sum()
        s = c[outputs[b]] @ h
        value = -_log_sigmoid(s[0]) - sum(
            w * _log_sigmoid(-x) for x, w in zip(s[1:], output_weights[b, 1:]))
        expected.append(value)
    assert_close(np.asarray(loss), np.asarray(expected), 1e-5)


def test_cbow_input_is_the_mean_of_the_real_context_embeddings():
    config = w2v.Word2VecConfig(vocab_size=9, embed_dim=4, mode="cbow")
    params = _params(config, seed=1)
    model = w2v.Word2Vec(config)
    weights = np.array([[1, 1, 1, 0]], np.float32)
    h = model.apply({"params": params}, np.array([[2, 5, 7, 0]]), weights, method="encode")
    assert_close(np.asarray(h)[0], params["embedding"][[2, 5, 7]].mean(0), 1e-6)
    # Whatever id sits in a padded slot, it does not count.
    h2 = model.apply({"params": params}, np.array([[2, 5, 7, 8]]), weights, method="encode")
    np.testing.assert_array_equal(np.asarray(h), np.asarray(h2))


def test_cbow_error_reaches_every_context_word_in_full_as_in_the_c_tool():
    """word2vec.c (and gensim's cbow_mean=1) add the whole error neu1e to each context word's
    vector, not neu1e / count (the mean's own gradient): under the reference's SGD step the
    embedding table would otherwise learn ~4.6x more slowly on real text (the average window)."""
    config = w2v.Word2VecConfig(vocab_size=9, embed_dim=4, mode="cbow")
    params = _params(config, seed=2)
    model = w2v.Word2Vec(config)
    inputs = np.array([[2, 5, 7, 0], [3, 0, 0, 0]], np.int32)
    weights = np.array([[1, 1, 1, 0], [1, 0, 0, 0]], np.float32)
    probe = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)  # dL/dh per row

    def loss(p):
        return jnp.sum(model.apply({"params": p}, inputs, weights, method="encode") * probe)

    grad = np.asarray(jax.grad(loss)(params)["embedding"])
    for word in (2, 5, 7):  # three context words: each gets dL/dh itself, not a third of it
        assert_close(grad[word], probe[0], 1e-6)
    assert_close(grad[3], probe[1], 1e-6)  # a single context word: the same either way
    assert_close(grad[[0, 1, 4, 6, 8]], np.zeros((5, 4)), 1e-6)  # padding and absent words
    # The value is still the mean (test_cbow_input_is_the_mean_of_the_real_context_embeddings).


def test_initial_loss_is_log2_per_output_word():
    # Context vectors start at zero (the C tool's syn1neg), so every score is 0 and each of the
    # 1 + K output words costs log 2, whatever the embeddings.
    config = w2v.config_for_size("tiny", vocab_size=20, mode="skipgram")
    model = w2v.Word2Vec(config)
    inputs, weights = np.array([[3], [4]]), np.ones((2, 1), np.float32)
    outputs = np.array([[1, 2, 3], [5, 6, 7]])
    params = nn.unbox(model.init(jax.random.key(0), inputs, weights, outputs)["params"])
    assert params["embedding"].shape == params["context"].shape == (20, 32)
    assert np.abs(params["embedding"]).max() <= 0.5 / 32
    loss = w2v.negative_sampling_loss(model.apply({"params": params}, inputs, weights, outputs),
                                      np.ones((2, 3)))
    np.testing.assert_allclose(np.asarray(loss), 3 * np.log(2.0), rtol=1e-6)


def test_negatives_follow_count_to_the_three_quarters():
    counts = np.array([1000, 200, 50, 10, 1])
    cdf = jnp.asarray(w2v_data.noise_cdf(counts))
    draws = np.asarray(w2v.sample_negatives(jax.random.key(0), cdf, (200, 1000)))
    freq = np.bincount(draws.ravel(), minlength=5) / draws.size
    expected = counts ** 0.75 / (counts ** 0.75).sum()
    # 200k draws: a standard error below 0.0011 for every word.
    np.testing.assert_allclose(freq, expected, atol=0.004)
    # ... and clearly not the raw unigram distribution.
    assert abs(freq[0] - counts[0] / counts.sum()) > 0.05


def test_cosine_neighbours_match_brute_force_and_exclude():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(30, 5))
    query = rng.normal(size=5)
    ids, sims = w2v.cosine_neighbours(vectors, query, 4, exclude=[3, 7])
    cos = vectors @ query / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(query))
    cos[[3, 7]] = -np.inf
    np.testing.assert_array_equal(ids, np.argsort(-cos)[:4])
    np.testing.assert_allclose(sims, cos[ids])


def test_config_rejects_unknown_mode_and_size():
    with pytest.raises(ValueError, match="config.model.mode"):
        w2v.Word2VecConfig(vocab_size=5, mode="glove")
    with pytest.raises(ValueError, match="config.model.size"):
        w2v.config_for_size("huge", vocab_size=5)
