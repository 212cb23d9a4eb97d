"""The train state: everything a resumed run needs besides the data iterator."""

from typing import Any

import flax
import jax
import optax


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: optimizer updates applied so far
    params: Any
    opt_state: optax.OptState
    rng: jax.Array  # base key; each step folds in `step`, so resumed runs draw the same dropout

    @classmethod
    def create(cls, params, optimizer: optax.GradientTransformation, rng: jax.Array):
        return cls(
            step=jax.numpy.zeros((), jax.numpy.int32),
            params=params,
            opt_state=optimizer.init(params),
            rng=rng,
        )
