"""Orbax checkpoints of {train state, data-iterator position}, so a resumed run continues exactly.

Saves are asynchronous (the next steps run while the previous state is written); orbax commits
a step directory atomically, so a crash mid-save leaves the previous checkpoint as the latest.
"""

import os

import grain
import jax
import orbax.checkpoint as ocp


class MissingParamsError(ValueError):
    """A checkpoint holds none of (or only part of) the parameters asked for."""


class Checkpointer:
    """One directory of step checkpoints.

    With `best_metric`, orbax keeps the `max_to_keep` checkpoints with the best value of that
    eval metric (by `best_mode`, 'min' or 'max') instead of the latest ones.
    """

    def __init__(self, workdir: str, max_to_keep: int = 3, async_save: bool = True,
                 subdir: str = "checkpoints", best_metric: str = "", best_mode: str = "min"):
        if best_mode not in ("min", "max"):
            raise ValueError(f"config.train.best_mode must be 'min' or 'max', got {best_mode!r}")
        self.directory = os.path.join(os.path.abspath(workdir), subdir)
        self.best_metric, self.best_mode = best_metric, best_mode
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True,
                best_fn=(lambda m: m[best_metric]) if best_metric else None,
                best_mode=best_mode,
            ),
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def best_value(self) -> float | None:
        """The best recorded value of best_metric, or None before the first save."""
        step = self._manager.best_step()
        if step is None:
            return None
        return float(self._manager.metrics(step)[self.best_metric])

    def is_better(self, value: float) -> bool:
        best = self.best_value()
        if best is None:
            return True
        return value < best if self.best_mode == "min" else value > best

    def save(self, step: int, state, data_iterator=None, metrics=None) -> None:
        items = {"state": ocp.args.StandardSave(state)}
        if data_iterator is not None:
            items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
        self._manager.save(step, args=ocp.args.Composite(**items),
                           metrics=None if metrics is None else dict(metrics))

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

    def restore_params(self, target_params, step: int | None = None):
        """Only the params of a saved train state, onto `target_params`' shapes and shardings
        (a new run initialised from another run: new optimizer, step 0, other data)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory} to initialise from")
        target = {"params": jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), target_params)}
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.PyTreeRestore(
                    item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                    partial_restore=True)))
        except (ValueError, KeyError) as e:
            raise ValueError(
                f"the params saved in {self.directory} (step {step}) do not fit this model: {e}"
            ) from None
        params = restored["state"]["params"]
        # A partial restore leaves what the checkpoint lacks as ShapeDtypeStruct placeholders
        # instead of failing; a run must never start from them.
        missing = [jax.tree_util.keystr(path) for path, x in
                   jax.tree_util.tree_leaves_with_path(params)
                   if isinstance(x, jax.ShapeDtypeStruct)]
        if missing:
            raise MissingParamsError(
                f"the params saved in {self.directory} (step {step}) lack {len(missing)} of this "
                f"model's parameters, e.g. {missing[:3]}; init_from must be a run of this model "
                "(or of the model this task fine-tunes)")
        return params

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
