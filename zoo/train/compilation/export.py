"""A job's real train step lowered for hardware this machine does not have, with `jax.export`.

The step is the one the loop jits (zoo.train.program: the task's loss, the config's optimizer,
gradient accumulation, the NaN and spike guards), over abstract arrays on an AbstractMesh of
(data, fsdp, tensor) devices: shapes and shardings only, so BERT-base lowers for a TPU pod
slice on a laptop without allocating a parameter. A program that lowers here has passed
tracing, sharding propagation, the Pallas kernels' own lowering (Triton for GPU, Mosaic for
TPU) and StableHLO serialisation; what remains for the hardware is XLA's compilation.
"""

from collections.abc import Sequence

import jax
import ml_collections

from zoo.train import partitioning, program

# Pallas GPU kernels lower to Triton calls, which jax.export refuses by default because their
# binary form carries no compatibility guarantee across jaxlib versions (fine for a program
# compiled and run with the jaxlib that exported it).
_TRITON = jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")


def abstract_mesh(data: int, fsdp: int = 1, tensor: int = 1) -> jax.sharding.AbstractMesh:
    """A (data, fsdp, tensor) mesh of devices that need not exist."""
    return jax.sharding.AbstractMesh(
        (data, fsdp, tensor), partitioning.MESH_AXES,
        axis_types=(jax.sharding.AxisType.Auto,) * len(partitioning.MESH_AXES))


def export_train_step(task, config: ml_collections.ConfigDict, platforms: Sequence[str],
                      mesh: jax.sharding.AbstractMesh) -> jax.export.Exported:
    """Lowers `task`'s train step under `config` for `platforms` ("cuda", "tpu", "cpu").

    Args:
      task: a Task whose init_batch() gives one global batch (its shapes and dtypes are used).
      config: the job config (optim, train.grad_accum_steps, train.loss_spike, mesh.rules).
      platforms: the targets; several lower one multi-platform module.
      mesh: an AbstractMesh (`abstract_mesh`); the batch must divide over its data axes.

    Raises:
      ConfigError: a parameter or the batch does not divide over the mesh (naming it).
    """
    train_step, args = program.abstract_train_step(task, config, mesh, tuple(platforms))
    with program.lowering_context(config, mesh):
        return jax.export.export(train_step, platforms=tuple(platforms),
                                 disabled_checks=[_TRITON])(*args)
