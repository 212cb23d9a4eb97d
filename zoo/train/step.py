"""Pure train and eval steps: (state, batch) -> (state, metrics); metrics are sums.

`loss_fn(params, batch, rng, train) -> dict of sums` comes from the task; it must include
`loss_sum` and `weight_sum`. The optimised objective is loss_sum / weight_sum over the whole
global batch, so neither sharding the batch nor accumulating it in micro-batches changes the
update: micro-batch gradients of the *sum* are added and divided once by the total weight.
"""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from zoo.errors import ConfigError
from zoo.train import dropout_rng
from zoo.train.state import LossStats, TrainState

LossFn = Callable[..., dict[str, jax.Array]]


def _micro_batches(batch: dict[str, jax.Array], k: int) -> dict[str, jax.Array]:
    """[B, ...] -> [k, B/k, ...] taking rows j, j+k, j+2k, ... into micro-batch j.

    Strided rather than contiguous: each device's local rows split evenly across micro-batches,
    so the data-parallel sharding of the batch axis survives the reshape without communication.
    """

    def split(x):
        if x.shape[0] % k:
            raise ConfigError(
                f"batch size {x.shape[0]} is not divisible by config.train.grad_accum_steps={k}"
            )
        return jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)

    return jax.tree.map(split, batch)


@dataclasses.dataclass(frozen=True)
class SpikeGuard:
    """Skips the update of a step whose loss exceeds `factor` x the running mean of the applied
    steps' losses (an exponential moving average with `decay`), once `warmup_steps` steps have
    run: a bad batch or an optimizer blow-up then costs one step instead of the run (PaLM
    restarted from a checkpoint and skipped batches for the same spikes). The loop stops the run
    after config.train.loss_spike.max_in_a_row such steps in a row: by then the loss has moved,
    not spiked."""

    factor: float
    warmup_steps: int = 100
    decay: float = 0.99

    def __post_init__(self):
        if self.factor <= 1.0:
            raise ConfigError(f"config.train.loss_spike.factor={self.factor} must be > 1 (a spike "
                              "is a loss above factor x its running mean); 0 turns the guard off")
        if not 0.0 < self.decay < 1.0:
            raise ConfigError(f"config.train.loss_spike.decay={self.decay} must be in (0, 1)")

    def is_spike(self, loss: jax.Array, stats: LossStats, step: jax.Array) -> jax.Array:
        judged = (step >= self.warmup_steps) & (stats.count > 0)
        return judged & (loss > self.factor * stats.mean)


def spike_guard(loss_spike) -> SpikeGuard | None:
    """The SpikeGuard of config.train.loss_spike (None when its factor is 0: off)."""
    if not loss_spike.factor:
        return None
    if loss_spike.max_in_a_row < 1:
        raise ConfigError(f"config.train.loss_spike.max_in_a_row={loss_spike.max_in_a_row} must "
                          "be >= 1")
    return SpikeGuard(loss_spike.factor, loss_spike.warmup_steps, loss_spike.decay)


def _track(stats: LossStats, loss, applied, spike, decay: float) -> LossStats:
    # The first applied step starts the average at its loss rather than at the zero it holds.
    mean = jnp.where(stats.count > 0, decay * stats.mean + (1.0 - decay) * loss, loss)
    return LossStats(
        mean=jnp.where(applied, mean, stats.mean).astype(jnp.float32),
        count=stats.count + applied.astype(jnp.int32),
        spikes_in_a_row=jnp.where(spike, stats.spikes_in_a_row + 1,
                                  jnp.where(applied, 0, stats.spikes_in_a_row)),
    )


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    grad_accum_steps: int = 1,
    spike_guard: SpikeGuard | None = None,
    dropout_generator: str = "threefry",
):
    """Builds train_step(state, batch) -> (state, metrics).

    Args:
      grad_accum_steps: split the global batch into this many micro-batches run sequentially
        (lax.scan), so activations for only B/k rows are live at once.

      spike_guard: also skip the update when the loss spikes (see SpikeGuard); None = off.
      dropout_generator: what draws each step's dropout masks (zoo.train.dropout_rng).

    When the loss or any gradient is NaN/Inf the update is not applied (params and optimizer
    state stay as they were) and metrics['nonfinite'] is 1; whether training then carries on
    or stops is the loop's policy (config.train.nonfinite). A spike skipped by the guard sets
    metrics['loss_spike'] to 1 and metrics['spikes_in_a_row'] counts them.
    """
    if grad_accum_steps < 1:
        raise ConfigError(f"config.train.grad_accum_steps must be >= 1, got {grad_accum_steps}")

    def sum_grads(params, batch, rng):
        def loss_sum(p):
            sums = loss_fn(p, batch, rng, True)
            return sums["loss_sum"], sums

        (_, sums), grads = jax.value_and_grad(loss_sum, has_aux=True)(params)
        return grads, sums

    def train_step(state: TrainState, batch: dict[str, jax.Array]):
        rng = dropout_rng.step_key(state.rng, state.step, dropout_generator)
        if grad_accum_steps == 1:
            grads, sums = sum_grads(state.params, batch, rng)
        else:
            micro = _micro_batches(batch, grad_accum_steps)

            def accumulate(carry, xs):
                index, micro_batch = xs
                grads, sums = sum_grads(state.params, micro_batch, jax.random.fold_in(rng, index))
                return jax.tree.map(jnp.add, carry, (grads, sums)), None

            zeros = jax.eval_shape(sum_grads, state.params,
                                   jax.tree.map(lambda x: x[0], micro), rng)
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zeros)
            (grads, sums), _ = jax.lax.scan(
                accumulate, zeros, (jnp.arange(grad_accum_steps), micro)
            )
        # Divide once by the total token weight of the whole global batch.
        denominator = jnp.maximum(sums["weight_sum"], 1.0)
        grads = jax.tree.map(lambda g: g / denominator, grads)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(sums["loss_sum"]) & jnp.isfinite(grad_norm)
        loss = sums["loss_sum"] / denominator
        stats = state.loss_stats
        spike = (finite & spike_guard.is_spike(loss, stats, state.step) if spike_guard
                 else jnp.zeros((), bool))
        apply = finite & ~spike

        def update(params, opt_state):
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        # A NaN batch must not poison the params or the Adam moments: keep the old ones. A
        # cond, not jnp.where(apply, new, old) over the trees: with the where, XLA fused each
        # param's update with its own copy of the new Adam moments, computed from the old ones,
        # and so copied every old moment that was also updated in place (6 copies, 2 of them
        # [vocab, embed], in the GPT step) and selected over all params and moments.
        params, opt_state = jax.lax.cond(apply, update, lambda p, o: (p, o), state.params,
                                         state.opt_state)
        new_state = state.replace(
            step=state.step + 1,
            params=params,
            opt_state=opt_state,
            loss_stats=_track(stats, loss, apply, spike,
                              spike_guard.decay if spike_guard else SpikeGuard.decay),
        )
        metrics = dict(sums, grad_norm=grad_norm, nonfinite=1.0 - finite.astype(jnp.float32),
                       loss_spike=spike.astype(jnp.float32),
                       spikes_in_a_row=new_state.loss_stats.spikes_in_a_row.astype(jnp.float32))
        # A NaN batch's sums are left out of the reported means; it is counted in 'nonfinite'
        # instead. A spike's loss is real and stays in them (it is what the log should show).
        counters = ("nonfinite", "loss_spike", "spikes_in_a_row")
        metrics = {k: (v if k in counters else jnp.where(finite, v, 0.0))
                   for k, v in metrics.items()}
        return new_state, metrics

    return train_step


def make_eval_step(loss_fn: LossFn):
    def eval_step(params, batch: dict[str, jax.Array]):
        return loss_fn(params, batch, jax.random.key(0), False)

    return eval_step
