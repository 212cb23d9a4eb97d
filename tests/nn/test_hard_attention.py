"""Hard attention: one selected input, by argmax or by sampling, trainable through an estimator."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.numerics import assert_close
from zoo.nn.hard_attention import HardAttention, hard_weights
from zoo.nn.scoring import KeyValueAttention

SCORES = np.array([[0.3, 2.0, -1.0, 0.5, 1.2],
                   [1.0, 0.2, 0.2, -0.4, 0.9]], np.float32)  # (2 queries, 5 inputs)


def _softmax64(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _is_one_hot(w):
    w = np.asarray(w)
    return bool(np.all((w == 0) | (w == 1)) and np.all(w.sum(-1) == 1))


@pytest.mark.parametrize("estimator", ["straight_through", "gumbel"])
def test_argmax_selects_exactly_the_most_probable_position(estimator):
    w = hard_weights(SCORES, estimator=estimator)
    assert _is_one_hot(w)
    np.testing.assert_array_equal(np.argmax(w, -1), np.argmax(_softmax64(SCORES), -1))


@pytest.mark.parametrize("estimator", ["straight_through", "gumbel"])
def test_samples_follow_the_attention_distribution(estimator):
    draws = 20_000
    keys = jax.random.split(jax.random.key(0), draws)
    w = jax.vmap(lambda k: hard_weights(SCORES, selection="sample", estimator=estimator,
                                        rng=k))(keys)  # (draws, 2, 5)
    assert _is_one_hot(w)
    frequencies = np.asarray(w).mean(0)
    # Binomial standard error at p = 0.5 and 20,000 draws is 0.0035: 0.015 is over 4 of them.
    np.testing.assert_allclose(frequencies, _softmax64(SCORES), atol=0.015)


def test_masked_positions_are_never_selected_and_an_empty_row_selects_nothing():
    mask = np.array([[True, False, True, True, True], [False] * 5])
    keys = jax.random.split(jax.random.key(1), 500)
    w = jax.vmap(lambda k: hard_weights(SCORES, mask, selection="sample", rng=k))(keys)
    w = np.asarray(w)
    assert w[:, 0, 1].max() == 0 and _is_one_hot(w[:, 0])  # the best input is masked out
    assert not w[:, 1].any()  # no position may be chosen: all-zero, as masked_softmax gives
    assert np.argmax(hard_weights(SCORES, mask)[0]) == 4  # argmax among the kept positions


def test_straight_through_gradient_is_the_softmax_gradient():
    # d/ds sum_n c_n w_n under w = onehot + p - sg(p) is J_p^T c with J = diag(p) - p p^T.
    c = np.array([[0.5, -1.0, 2.0, 0.1, 0.7], [1.5, 0.0, -0.3, 0.2, -2.0]], np.float32)
    grad = jax.grad(lambda s: jnp.sum(c * hard_weights(s)))(jnp.asarray(SCORES))
    p = _softmax64(SCORES)
    expected = p * (c - (p * c).sum(-1, keepdims=True))  # row-wise (diag(p) - p p^T) c
    assert_close(grad, expected, 1e-5)


def test_gumbel_gradient_is_the_tempered_softmax_gradient_at_the_drawn_noise():
    tau, rng = 0.5, jax.random.key(3)
    c = np.linspace(-1, 1, 10, dtype=np.float32).reshape(2, 5)
    grad = jax.grad(lambda s: jnp.sum(c * hard_weights(
        s, selection="sample", estimator="gumbel", temperature=tau, rng=rng)))(
        jnp.asarray(SCORES))
    g = np.asarray(jax.random.gumbel(rng, SCORES.shape), np.float64)  # the same draw
    y = _softmax64((SCORES + g) / tau)
    expected = y * (c - (y * c).sum(-1, keepdims=True)) / tau
    assert_close(grad, expected, 1e-4)
    w = hard_weights(SCORES, selection="sample", estimator="gumbel", temperature=tau, rng=rng)
    np.testing.assert_array_equal(np.argmax(w, -1), np.argmax(SCORES + g, -1))


def test_module_returns_the_selected_value_row_and_matches_soft_attention_scores():
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=s).astype(np.float32) for s in ((2, 3, 4), (2, 6, 4), (2, 6, 5)))
    hard = HardAttention(score="bilinear", selection="argmax")
    params = hard.init(jax.random.key(0), q, k, v)
    context, weights = hard.apply(params, q, k, v)
    assert _is_one_hot(weights)
    chosen = np.argmax(np.asarray(weights), -1)  # (2, 3)
    np.testing.assert_array_equal(np.asarray(context), v[np.arange(2)[:, None], chosen])
    # The same scorer parameters under soft attention: its distribution's mode is the choice.
    _, soft = KeyValueAttention(score="bilinear").apply(params, q, k, v)
    np.testing.assert_array_equal(chosen, np.argmax(np.asarray(soft), -1))


def test_sampling_needs_the_attention_rng_only_when_not_deterministic():
    q = k = np.ones((1, 2, 4), np.float32)
    module = HardAttention(score="dot", selection="sample")
    module.apply({}, q, k)  # deterministic: argmax, no rng
    with pytest.raises(Exception, match="attention"):
        module.apply({}, q, k, deterministic=False)
    _, w = module.apply({}, q, k, deterministic=False, rngs={"attention": jax.random.key(0)})
    assert _is_one_hot(w)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["straight_through", "gumbel"])
def test_hard_attention_learns_to_point_at_the_queried_input(estimator):
    """Each query is a noisy copy of one of 6 unit keys; the target is that key's position (values
    are one-hot positions). The bilinear scorer starts random and must learn W ~ identity
    through the estimator's surrogate gradient alone."""
    n, d, batch = 6, 8, 64
    model = HardAttention(score="bilinear", selection="sample", estimator=estimator)
    values = jnp.broadcast_to(jnp.eye(n), (batch, n, n))

    def data(key, batch=batch):
        k1, k2, k3 = jax.random.split(key, 3)
        keys = jax.random.normal(k1, (batch, n, d))
        keys = keys / jnp.linalg.norm(keys, axis=-1, keepdims=True)  # unit: the copy scores best
        target = jax.random.randint(k2, (batch,), 0, n)
        query = keys[jnp.arange(batch), target][:, None] + 0.1 * jax.random.normal(k3, (batch, 1, d))
        return query, keys, target

    def accuracy(params, key):
        query, keys, target = data(key, 512)
        _, w = model.apply(params, query, keys, values[:1])  # deterministic: argmax
        return float(jnp.mean(jnp.argmax(w[:, 0], -1) == target))

    params = model.init(jax.random.key(0), *data(jax.random.key(1))[:2], values)
    optimizer = optax.adam(0.05)
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, key):
        k_data, k_attn = jax.random.split(key)
        query, keys, target = data(k_data)

        def loss_fn(p):
            context, _ = model.apply(p, query, keys, values, deterministic=False,
                                     rngs={"attention": k_attn})
            return jnp.mean(jnp.sum((context[:, 0] - jax.nn.one_hot(target, n)) ** 2, -1))

        loss, grads = jax.value_and_grad(loss_fn)(p := params)
        updates, opt_state = optimizer.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, loss

    before = accuracy(params, jax.random.key(99))
    for i in range(200):
        params, opt_state, _ = step(params, opt_state, jax.random.key(100 + i))
    after = accuracy(params, jax.random.key(99))
    assert before < 0.6, before
    assert after >= 0.95, (before, after)
