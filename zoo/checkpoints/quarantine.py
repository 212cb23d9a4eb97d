"""Where the steps a restore could not read go: checkpoints_corrupt/, beside the checkpoints.

A step whose files are damaged is moved whole (nothing deleted) out of the way of saving that
step again, by process 0 once every process has finished reading, and every process learns
whether the move worked. A step whose directory was deleted after the listing has nothing left
to move.
"""

import jax
from jax.experimental import multihost_utils

from zoo import paths
from zoo.checkpoints import restore_verdicts as verdicts
from zoo.checkpoints.checkpoint_failures import first_line


def set_aside(directory: str, steps: list[int], quarantine: bool) -> list[str]:
    """Moves `steps` (unreadable) of the checkpoint `directory` to `directory`_corrupt/ when
    `quarantine` (the training run, which owns the directory), else leaves them; returns what
    was done, in words, for the warning. Raises (on every process) when the move failed."""
    gone = [s for s in steps if not paths.as_path(paths.join(directory, str(s))).exists()]
    present = [s for s in steps if s not in gone]
    done = [f"step(s) {gone} were gone"] if gone else []
    if not present:
        return done
    if not quarantine:
        return [f"left step(s) {present} in place", *done]
    if jax.process_count() > 1:  # every process has finished reading before anything moves
        multihost_utils.sync_global_devices("zoo_checkpoint_quarantine")
    corrupt_dir = directory + "_corrupt"
    failure = None
    if jax.process_index() == 0:
        try:
            paths.as_path(corrupt_dir).mkdir(parents=True, exist_ok=True)
            for s in present:
                paths.move_tree(paths.join(directory, str(s)),
                                _free_name(paths.join(corrupt_dir, str(s))))
        except Exception as e:  # noqa: BLE001 -- raised below, once all know
            failure = e
    # Instead of a barrier: the others learn whether the move failed, and stop too.
    code, _, reason = verdicts.agree(verdicts.ERROR if failure else verdicts.OK,
                                     first_line(failure) if failure else "")
    if failure is not None:
        raise failure
    if code == verdicts.ERROR:
        raise verdicts.CheckpointRestoreError(
            f"process 0 could not move step(s) {present} of {directory} to {corrupt_dir} "
            f"({reason}); its log has the traceback")
    return [f"moved step(s) {present} to {corrupt_dir}", *done]


def _free_name(path: str) -> str:
    candidate, n = path, 1
    while paths.as_path(candidate).exists():
        candidate, n = f"{path}.{n}", n + 1
    return candidate
