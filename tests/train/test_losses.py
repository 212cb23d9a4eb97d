import jax.numpy as jnp
import numpy as np

from zoo.train.losses import cross_entropy_sums


def _reference(logits, targets, weights, eps):
    logits = logits.astype(np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    v = logits.shape[-1]
    q = np.full(logits.shape, eps / v)
    np.put_along_axis(q, targets[..., None], 1 - eps + eps / v, axis=-1)
    loss = -(q * logp).sum(-1)
    nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    return (loss * weights).sum(), (nll * weights).sum(), weights.sum()


def test_matches_float64_reference_with_smoothing_and_weights():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, 11)) * 3
    targets = rng.integers(0, 11, size=(3, 5))
    weights = (rng.random((3, 5)) > 0.3).astype(np.float32)
    for eps in (0.0, 0.1):
        out = cross_entropy_sums(jnp.asarray(logits, jnp.float32), jnp.asarray(targets),
                                 jnp.asarray(weights), label_smoothing=eps)
        loss, nll, w = _reference(logits, targets, weights, eps)
        np.testing.assert_allclose(out["loss_sum"], loss, rtol=1e-5)
        np.testing.assert_allclose(out["nll_sum"], nll, rtol=1e-5)
        assert float(out["weight_sum"]) == w


def test_zero_weight_tokens_do_not_contribute():
    logits = jnp.zeros((1, 2, 4)).at[0, 1].set(jnp.array([100.0, -100.0, 0.0, 0.0]))
    targets = jnp.array([[0, 1]])
    out = cross_entropy_sums(logits, targets, jnp.array([[1.0, 0.0]]))
    np.testing.assert_allclose(out["nll_sum"], np.log(4.0), rtol=1e-6)
    assert float(out["correct_sum"]) in (0.0, 1.0)
