"""Pure train and eval steps: (state, batch) -> (state, metrics); metrics are sums.

`loss_fn(params, batch, rng, train) -> dict of sums` comes from the task; it must include
`loss_sum` and `weight_sum`. The optimised objective is loss_sum / weight_sum over the whole
global batch, so neither sharding the batch nor accumulating it in micro-batches changes the
update: micro-batch gradients of the *sum* are added and divided once by the total weight.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from zoo.train.state import TrainState

LossFn = Callable[..., dict[str, jax.Array]]


def _micro_batches(batch: dict[str, jax.Array], k: int) -> dict[str, jax.Array]:
    """[B, ...] -> [k, B/k, ...] taking rows j, j+k, j+2k, ... into micro-batch j.

    Strided rather than contiguous: each device's local rows split evenly across micro-batches,
    so the data-parallel sharding of the batch axis survives the reshape without communication.
    """

    def split(x):
        if x.shape[0] % k:
            raise ValueError(
                f"batch size {x.shape[0]} is not divisible by config.train.grad_accum_steps={k}"
            )
        return jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)

    return jax.tree.map(split, batch)


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    grad_accum_steps: int = 1,
):
    """Builds train_step(state, batch) -> (state, metrics).

    Args:
      grad_accum_steps: split the global batch into this many micro-batches run sequentially
        (lax.scan), so activations for only B/k rows are live at once.

    When the loss or any gradient is NaN/Inf the update is not applied (params and optimizer
    state stay as they were) and metrics['nonfinite'] is 1; whether training then carries on
    or stops is the loop's policy (config.train.nonfinite).
    """
    if grad_accum_steps < 1:
        raise ValueError(f"config.train.grad_accum_steps must be >= 1, got {grad_accum_steps}")

    def sum_grads(params, batch, rng):
        def loss_sum(p):
            sums = loss_fn(p, batch, rng, True)
            return sums["loss_sum"], sums

        (_, sums), grads = jax.value_and_grad(loss_sum, has_aux=True)(params)
        return grads, sums

    def train_step(state: TrainState, batch: dict[str, jax.Array]):
        rng = jax.random.fold_in(state.rng, state.step)
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

        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        # A NaN batch must not poison the params or the Adam moments: keep the old ones.
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
        new_state = state.replace(
            step=state.step + 1,
            params=keep(params, state.params),
            opt_state=keep(opt_state, state.opt_state),
        )
        metrics = dict(sums, grad_norm=grad_norm, nonfinite=1.0 - finite.astype(jnp.float32))
        # A skipped batch's sums (NaN) are left out of the reported means; it is counted in
        # 'nonfinite' instead.
        metrics = {k: (v if k == "nonfinite" else jnp.where(finite, v, 0.0))
                   for k, v in metrics.items()}
        return new_state, metrics

    return train_step


def make_eval_step(loss_fn: LossFn):
    def eval_step(params, batch: dict[str, jax.Array]):
        return loss_fn(params, batch, jax.random.key(0), False)

    return eval_step
