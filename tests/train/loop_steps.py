"""Driving the loop's compiled train step by hand, for the tests that compare layouts."""

import flax.linen as nn
import jax

from zoo.train import loop


def train(setup: loop.Setup, config, batches) -> tuple:
    """(final state, per-step mean losses) of `batches` through setup's compiled train step."""
    train_step = loop.make_train_step(setup, config)
    state, losses = setup.state, []
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
        for batch in batches:
            state, m = train_step(state, loop._to_global(batch, setup.batch_sharding))
            losses.append(float(m["loss_sum"]) / float(m["weight_sum"]))
    return state, losses
