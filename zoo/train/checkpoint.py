"""Orbax checkpoints of {train state, data-iterator position}, so a resumed run continues exactly.

Saves are asynchronous (the next steps run while the previous state is written); orbax commits
a step directory atomically, so a crash mid-save leaves the previous checkpoint as the latest.
"""

import os

import grain
import jax
import orbax.checkpoint as ocp


class Checkpointer:
    def __init__(self, workdir: str, max_to_keep: int = 3, async_save: bool = True):
        self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True
            ),
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state, data_iterator=None) -> None:
        items = {"state": ocp.args.StandardSave(state)}
        if data_iterator is not None:
            items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
        self._manager.save(step, args=ocp.args.Composite(**items))

    def restore(self, target, data_iterator=None, step: int | None = None):
        """Restores the state onto `target`'s shapes and shardings (any mesh), and the iterator
        in place. `target`: a state pytree of arrays or jax.ShapeDtypeStruct with shardings."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(
                f"no checkpoint in {self.directory}; train first (train.py --workdir=...)"
            )
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), target
        )
        items = {"state": ocp.args.StandardRestore(abstract)}
        if data_iterator is not None:
            items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
        return self._manager.restore(step, args=ocp.args.Composite(**items))["state"]

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
