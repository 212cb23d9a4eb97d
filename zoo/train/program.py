"""A job's train step as one program, built once: what the loop runs, what `export` lowers for
hardware this machine lacks, and what the compile command hands the TPU compiler.

Each of those used to build its own jit of `step.make_train_step`; a change to one (a new guard,
a different donation) then went unseen by the others. Here the task's loss, the config's
optimizer, gradient accumulation, the NaN and spike guards, the state and batch shardings and
the donation are put together in one place, over a concrete mesh (the loop, the compile
command) or an AbstractMesh of devices that need not exist (export).
"""

import contextlib
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import optax

from zoo import contract
from zoo.train import dropout_rng, optim, partitioning, step
from zoo.train.state import TrainState


def make_optimizer(task, config: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """The job's optimizer (config.optim), leaving the task's frozen subtrees unchanged."""
    return optim.make_optimizer(config.optim, frozen=contract.frozen_subtrees(task))


def init_state_fn(task, optimizer: optax.GradientTransformation) -> Callable[[jax.Array], Any]:
    """rng -> a fresh TrainState (params from task.init_params, the optimizer's state)."""
    def init_state(rng):
        params_rng, state_rng = jax.random.split(rng)
        return TrainState.create(task.init_params(params_rng), optimizer, state_rng)

    return init_state


def jit_train_step(task, optimizer: optax.GradientTransformation,
                   config: ml_collections.ConfigDict, state_sharding, batch_sharding,
                   platforms: tuple[str, ...]):
    """The jitted train_step(state, batch) -> (state, metrics) every caller uses, built for
    `platforms` (they and the batch's device count choose dropout's generator:
    zoo.train.dropout_rng)."""
    devices = math.prod(batch_sharding.mesh.axis_sizes)
    return jax.jit(
        step.make_train_step(
            task.loss_fn, optimizer, config.train.grad_accum_steps,
            step.spike_guard(config.train.loss_spike),
            dropout_generator=dropout_rng.generator(config.train.dropout_rng, platforms,
                                                    devices)),
        in_shardings=(state_sharding, batch_sharding),
        out_shardings=(state_sharding, None),
        donate_argnums=0,  # the old state's buffers are reused for the new one
    )


def mesh_context(mesh) -> contextlib.AbstractContextManager:
    """Enters `mesh`: a concrete Mesh with jax.set_mesh, an AbstractMesh as the abstract one."""
    if isinstance(mesh, jax.sharding.AbstractMesh):
        return jax.sharding.use_abstract_mesh(mesh)
    return jax.set_mesh(mesh)


def abstract_train_step(task, config: ml_collections.ConfigDict, mesh,
                        platforms: tuple[str, ...] | None = None):
    """The job's jitted train step and abstract arguments for it on `mesh`: shapes, dtypes
    and shardings only, so a model too big for this machine is never allocated.

    `platforms`: what the step is built for; None = the devices of `mesh` (a concrete mesh).

    Returns:
      (train_step, (state, batch)) where state and batch are ShapeDtypeStructs carrying their
      shardings; lower or export train_step on them inside `mesh_context(mesh)` and
      nn.logical_axis_rules(rules) (`lowering_context`).

    Raises:
      ConfigError: a parameter or the batch does not divide over the mesh (naming it).
    """
    rules = partitioning.rules_from_config(config.mesh.rules)
    optimizer = make_optimizer(task, config)
    init_state = init_state_fn(task, optimizer)
    with mesh_context(mesh), nn.logical_axis_rules(rules):
        # The key is made inside the trace: even jax.random.key(0) would run eagerly.
        boxed = jax.eval_shape(lambda: init_state(jax.random.key(0)))
        shardings = nn.unbox(partitioning.logical_sharding(boxed, mesh, rules))
    state = nn.unbox(boxed)
    partitioning.check_divisible(state, shardings, mesh)
    batch_sharding = partitioning.batch_sharding(mesh, rules)
    batch = task.init_batch()
    for leaf in jax.tree.leaves(batch):
        partitioning.check_batch(leaf.shape[0], batch_sharding)

    def spec(x, sharding):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    if platforms is None:
        if isinstance(mesh, jax.sharding.AbstractMesh):
            raise ValueError("abstract_train_step: an AbstractMesh has no devices to say what "
                             "the step is built for; pass platforms")
        platforms = dropout_rng.mesh_platforms(mesh)
    train_step = jit_train_step(task, optimizer, config, shardings, batch_sharding, platforms)
    return train_step, (jax.tree.map(spec, state, shardings),
                        jax.tree.map(lambda x: spec(x, batch_sharding), batch))


@contextlib.contextmanager
def lowering_context(config: ml_collections.ConfigDict, mesh):
    """The mesh and logical-axis rules a train step is traced under (the loop's own)."""
    with mesh_context(mesh), nn.logical_axis_rules(
            partitioning.rules_from_config(config.mesh.rules)):
        yield
