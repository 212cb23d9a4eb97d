"""Pure train and eval steps: (state, batch) -> (state, metrics); metrics are sums.

`loss_fn(params, batch, rng, train) -> dict of sums` comes from the task; it must include
`loss_sum` and `weight_sum`. The optimised objective is loss_sum / weight_sum over the whole
global batch, so sharding the batch never changes the update.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from zoo.train.state import TrainState

LossFn = Callable[..., dict[str, jax.Array]]


def make_train_step(loss_fn: LossFn, optimizer: optax.GradientTransformation):
    def train_step(state: TrainState, batch: dict[str, jax.Array]):
        rng = jax.random.fold_in(state.rng, state.step)

        def objective(params):
            sums = loss_fn(params, batch, rng, True)
            return sums["loss_sum"] / jnp.maximum(sums["weight_sum"], 1.0), sums

        (_, sums), grads = jax.value_and_grad(objective, has_aux=True)(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = dict(sums, grad_norm=optax.global_norm(grads))
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
        return new_state, metrics

    return train_step


def make_eval_step(loss_fn: LossFn):
    def eval_step(params, batch: dict[str, jax.Array]):
        return loss_fn(params, batch, jax.random.key(0), False)

    return eval_step
