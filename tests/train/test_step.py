"""Gradient accumulation equals one large batch; NaN/Inf losses or gradients and guarded loss
spikes never reach the params; bf16 compute keeps float32 params and optimizer state."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.numerics import assert_close, assert_params_close
from zoo.contract import losses
from zoo.models import gpt
from zoo.train import step
from zoo.train.state import TrainState

V, T = 32, 8


@pytest.fixture(scope="module")
def model_and_params():
    cfg = gpt.config_for_size("tiny", vocab_size=V, max_len=T, dropout_rate=0.0,
                              attention_dropout_rate=0.0)
    model = gpt.GPT(cfg)
    params = model.init(jax.random.key(0), jnp.zeros((1, T), jnp.int32))["params"]
    return model, params


def _loss_fn(model):
    def loss_fn(params, batch, rng, train):
        logits = model.apply({"params": params}, batch["inputs"])
        return losses.cross_entropy_sums(logits, batch["targets"], batch["weights"])

    return loss_fn


def _batch(rows=8, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(4, V, size=(rows, T + 1)).astype(np.int32)
    # Uneven padding: even rows are full, odd rows keep one target token, so the strided
    # micro-batches carry very different token counts (a mean of micro-batch means would weight
    # them wrong).
    weights = np.ones((rows, T), np.float32)
    weights[1::2, 1:] = 0.0
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "weights": weights}


def _one_step(model, params, batch, k):
    opt = optax.sgd(1.0)  # plain SGD: the update *is* the gradient, compared exactly
    state = TrainState.create(params, opt, jax.random.key(1))
    train_step = jax.jit(step.make_train_step(_loss_fn(model), opt, grad_accum_steps=k))
    new_state, metrics = train_step(state, batch)
    return new_state, metrics


@pytest.mark.slow
@pytest.mark.parametrize("k", [2, 4])
def test_accumulated_update_equals_one_large_batch(model_and_params, k):
    model, params = model_and_params
    batch = _batch()
    whole, m1 = _one_step(model, params, batch, 1)
    accumulated, mk = _one_step(model, params, batch, k)
    assert_params_close(accumulated.params, whole.params, 2e-5)
    np.testing.assert_allclose(m1["loss_sum"], mk["loss_sum"], rtol=1e-5)
    assert float(m1["weight_sum"]) == float(mk["weight_sum"])


@pytest.mark.slow
def test_mean_of_micro_batch_means_would_differ(model_and_params):
    # The property above is not vacuous: with this padding, averaging per-micro-batch mean
    # gradients gives a different update than the token-weighted mean.
    model, params = model_and_params
    batch = _batch()
    loss_fn = _loss_fn(model)

    def mean_loss(p, b):
        s = loss_fn(p, b, None, True)
        return s["loss_sum"] / s["weight_sum"]

    grad = jax.jit(jax.grad(mean_loss))  # compiled: op-by-op, the model's grad takes seconds
    micro = [jax.tree.map(lambda x, j=j: x[j::2], batch) for j in range(2)]
    mean_of_means = jax.tree.map(lambda a, b: (a + b) / 2, *[grad(params, m) for m in micro])
    exact = grad(params, batch)
    diff = max(float(jnp.max(jnp.abs(a - b)))
               for a, b in zip(jax.tree.leaves(mean_of_means), jax.tree.leaves(exact)))
    assert diff > 1e-4


def test_batch_not_divisible_by_accumulation_is_a_clear_error(model_and_params):
    model, params = model_and_params
    with pytest.raises(ValueError, match="grad_accum_steps=3"):
        _one_step(model, params, _batch(rows=8), 3)


@pytest.mark.slow
def test_nonfinite_batch_is_skipped_and_counted(model_and_params):
    model, params = model_and_params
    batch = _batch()
    batch["weights"] = batch["weights"].copy()
    batch["weights"][0, 0] = np.nan  # poisons the loss and every gradient
    opt = optax.adam(1e-2)
    state = TrainState.create(params, opt, jax.random.key(1))
    train_step = jax.jit(step.make_train_step(_loss_fn(model), opt))
    new_state, metrics = train_step(state, batch)
    assert float(metrics["nonfinite"]) == 1.0
    assert int(new_state.step) == 1
    for a, b in zip(jax.tree.leaves((state.params, state.opt_state)),
                    jax.tree.leaves((new_state.params, new_state.opt_state))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert all(np.isfinite(float(v)) for v in metrics.values())
    # A clean batch afterwards trains normally from the untouched state.
    after, clean = train_step(new_state, _batch(seed=1))
    assert float(clean["nonfinite"]) == 0.0
    assert not np.array_equal(np.asarray(jax.tree.leaves(after.params)[0]),
                              np.asarray(jax.tree.leaves(new_state.params)[0]))


@jax.custom_vjp
def _infinite_gradient(x):
    return x


_infinite_gradient.defvjp(lambda x: (x, None), lambda _, g: (g * jnp.inf,))


@pytest.mark.slow
def test_inf_gradient_under_a_finite_loss_is_skipped(model_and_params):
    model, params = model_and_params

    def loss_fn(p, batch, rng, train):  # the forward value is untouched; only backward is Inf
        logits = _infinite_gradient(model.apply({"params": p}, batch["inputs"]))
        return losses.cross_entropy_sums(logits, batch["targets"], batch["weights"])

    opt = optax.adam(1e-2)
    state = TrainState.create(params, opt, jax.random.key(1))
    batch = _batch()
    assert np.isfinite(float(loss_fn(params, batch, None, True)["loss_sum"]))
    new_state, metrics = jax.jit(step.make_train_step(loss_fn, opt))(state, batch)
    assert float(metrics["nonfinite"]) == 1.0
    for a, b in zip(jax.tree.leaves((state.params, state.opt_state)),
                    jax.tree.leaves((new_state.params, new_state.opt_state))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _scaled_loss_fn(model):
    def loss_fn(params, batch, rng, train):  # batch['scale'] multiplies the loss: a spike
        sums = _loss_fn(model)(params, batch, rng, train)
        return dict(sums, loss_sum=sums["loss_sum"] * batch["scale"][0])

    return loss_fn


@pytest.mark.parametrize("warmup_steps", [1, 10])
def test_spike_guard_skips_spikes_after_warmup_and_tracks_the_mean(model_and_params,
                                                                   warmup_steps):
    model, params = model_and_params
    guard = step.SpikeGuard(factor=3.0, warmup_steps=warmup_steps, decay=0.5)
    opt = optax.sgd(0.1)
    train_step = jax.jit(step.make_train_step(_scaled_loss_fn(model), opt, spike_guard=guard))
    state = TrainState.create(params, opt, jax.random.key(1))
    # Step 2's loss is 10x the others: skipped after warmup, applied within it.
    scales, expected_mean, seen = [1.0, 1.0, 10.0, 1.0], 0.0, 0
    for i, scale in enumerate(scales):
        batch = dict(_batch(seed=i), scale=np.full((8,), scale, np.float32))
        before = state
        state, metrics = train_step(state, batch)
        loss = float(metrics["loss_sum"]) / float(metrics["weight_sum"])
        spiked = scale > 1 and i >= warmup_steps
        assert float(metrics["loss_spike"]) == float(spiked)
        assert float(metrics["spikes_in_a_row"]) == float(spiked)
        assert np.isfinite(loss)  # a spike's loss is reported, not zeroed
        changed = not np.array_equal(np.asarray(jax.tree.leaves(state.params)[0]),
                                     np.asarray(jax.tree.leaves(before.params)[0]))
        assert changed != spiked
        if not spiked:  # float64 reference of the running mean over applied steps
            expected_mean = loss if seen == 0 else 0.5 * expected_mean + 0.5 * loss
            seen += 1
        assert float(state.loss_stats.mean) == pytest.approx(expected_mean, rel=1e-5)
        assert int(state.loss_stats.count) == seen
    assert int(state.step) == len(scales)


def test_spike_guard_settings_are_checked():
    with pytest.raises(ValueError, match="loss_spike.factor=1.0 must be > 1"):
        step.SpikeGuard(factor=1.0)
    with pytest.raises(ValueError, match="loss_spike.decay=1.0"):
        step.SpikeGuard(factor=2.0, decay=1.0)


def test_bf16_compute_keeps_float32_params_and_optimizer_state():
    cfg = gpt.config_for_size("tiny", vocab_size=V, max_len=T, dropout_rate=0.0,
                              attention_dropout_rate=0.0, dtype="bfloat16")
    model = gpt.GPT(cfg)
    params = model.init(jax.random.key(0), jnp.zeros((1, T), jnp.int32))["params"]
    f32_model = gpt.GPT(dataclasses.replace(cfg, dtype="float32"))
    opt = optax.adamw(1e-3)
    batch = _batch()
    state = TrainState.create(params, opt, jax.random.key(1))
    new_state, metrics = jax.jit(step.make_train_step(_loss_fn(model), opt))(state, batch)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(new_state.params))
    assert all(x.dtype in (jnp.float32, jnp.int32)
               for x in jax.tree.leaves(new_state.opt_state))
    # The bf16 forward really ran in bf16 (activations), yet stays close to float32.
    logits = model.apply({"params": params}, batch["inputs"])
    reference = f32_model.apply({"params": params}, batch["inputs"])
    assert not np.array_equal(np.asarray(logits), np.asarray(reference))
    assert_close(logits, reference, 0.1)
    f32_sums = _loss_fn(f32_model)(params, batch, None, True)
    np.testing.assert_allclose(float(metrics["loss_sum"]), float(f32_sums["loss_sum"]),
                               rtol=2e-2)


def test_the_nonfinite_guard_copies_no_optimizer_state(model_and_params):
    """Keeping the old params and Adam moments on a NaN step must not cost a copy of them on
    every step: with the state donated, the update is written in place. (Selecting between the
    new and old trees made XLA copy the moments that two fusions read.)"""
    model, params = model_and_params
    opt = optax.adamw(1e-2)
    state = TrainState.create(params, opt, jax.random.key(1))
    train_step = jax.jit(step.make_train_step(_loss_fn(model), opt), donate_argnums=0)
    hlo = train_step.lower(state, _batch()).compile().as_text()
    # The entry parameters holding Adam's moments, by their argument path's name.
    moments = set(re.findall(r"%(state[\w.]*_(?:mu|nu)_[\w.]*) = f32\[", hlo))
    assert moments, "the compiled step's parameter names changed; find the moments again"
    copied = {m for m in moments if re.search(rf"copy\(%{re.escape(m)}\)", hlo)}
    assert not copied, sorted(copied)
