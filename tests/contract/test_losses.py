import jax
import jax.numpy as jnp
import numpy as np

from zoo.contract.losses import cross_entropy_sums


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


def test_gradient_is_softmax_minus_smoothed_one_hot():
    """d loss_sum / d logits = w * (softmax - q), q the (smoothed) target distribution: the
    logsumexp form differentiates to what the float64 reference says."""
    import jax

    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 3, 7)) * 4
    targets = rng.integers(0, 7, size=(2, 3))
    weights = rng.random((2, 3)).astype(np.float32)
    for eps in (0.0, 0.2):
        grad = jax.grad(lambda x, eps=eps: cross_entropy_sums(
            x, jnp.asarray(targets), jnp.asarray(weights), label_smoothing=eps)["loss_sum"])(
            jnp.asarray(logits, jnp.float32))
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        q = np.full(logits.shape, eps / 7)
        np.put_along_axis(q, targets[..., None], 1 - eps + eps / 7, axis=-1)
        np.testing.assert_allclose(grad, weights[..., None] * (p - q), atol=1e-6)


def test_correct_is_argmax_with_ties_going_to_the_lowest_index():
    # Tied maxima (a zero-initialised head gives all-equal logits): argmax's answer, the
    # first of them, is the only prediction counted correct.
    logits = jnp.array([[0.0, 0.0, 0.0], [1.0, 3.0, 3.0], [1.0, 3.0, 3.0], [5.0, -1.0, 2.0]])
    targets = jnp.array([0, 1, 2, 0])
    out = cross_entropy_sums(logits[None], targets[None])
    assert float(out["correct_sum"]) == 3.0
    for target in range(3):
        row = cross_entropy_sums(logits[:1], jnp.array([target]))
        assert float(row["correct_sum"]) == float(target == 0)


def test_across_devices_the_logits_stay_sharded_and_the_sums_agree():
    """Batch over 'data', vocabulary over 'tensor' (4 x 2 of the 8 test devices): the compiled
    loss reduces where the logits lie, gathering no [.., V] array (lax.top_k did: every
    device's logits onto every device), and its sums equal the single-device ones."""
    from jax.sharding import NamedSharding, PartitionSpec

    v = 1030  # a width no other array in the program has
    rng = np.random.default_rng(2)
    logits = jnp.asarray(rng.normal(size=(8, 4, v)), jnp.float32).at[0, 0, :3].set(9.0)
    targets = jnp.asarray(rng.integers(0, v, size=(8, 4))).at[0, 0].set(1)  # a tie, lost
    weights = jnp.ones((8, 4), jnp.float32)
    single = cross_entropy_sums(logits, targets, weights)
    mesh = jax.make_mesh((4, 2), ("data", "tensor"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    rows = NamedSharding(mesh, PartitionSpec("data"))
    with jax.set_mesh(mesh):
        sharded = jax.jit(cross_entropy_sums, in_shardings=(
            NamedSharding(mesh, PartitionSpec("data", None, "tensor")), rows, rows))
        hlo = sharded.lower(logits, targets, weights).compile().as_text()
        out = sharded(logits, targets, weights)
    gathers = [line for line in hlo.splitlines() if " all-gather(" in line and str(v) in line]
    assert not gathers, gathers
    for key in single:
        np.testing.assert_allclose(out[key], single[key], rtol=1e-6)
    assert float(single["correct_sum"]) == float((np.argmax(logits, -1) == targets).sum())
