"""The train state: everything a resumed run needs besides the data iterator."""

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class LossStats:
    """Running statistics of the applied steps' training loss (the loss-spike guard's memory;
    kept in the state so a resumed run judges spikes exactly as the uninterrupted one)."""

    mean: jax.Array  # float32: exponential moving average of the loss of applied steps
    count: jax.Array  # int32: applied steps folded into `mean`
    spikes_in_a_row: jax.Array  # int32: consecutive steps skipped as spikes

    @classmethod
    def create(cls):
        return cls(mean=jnp.zeros((), jnp.float32), count=jnp.zeros((), jnp.int32),
                   spikes_in_a_row=jnp.zeros((), jnp.int32))


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: train steps taken (skipped ones included)
    params: Any
    opt_state: optax.OptState
    rng: jax.Array  # base key; each step folds in `step`, so resumed runs draw the same dropout
    loss_stats: LossStats

    @classmethod
    def create(cls, params, optimizer: optax.GradientTransformation, rng: jax.Array):
        return cls(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=optimizer.init(params),
            rng=rng,
            loss_stats=LossStats.create(),
        )
