"""The data iterator's position in a checkpoint: grain's per-process JSON files, read back on
any process count when they agree (zoo's pipelines keep one global order, so the position is the
global batch index, not a per-process cursor)."""

import json

import jax

from zoo import paths
from zoo.checkpoints import restore_verdicts as verdicts
from zoo.errors import UserError


class DataReshardError(UserError, ValueError):
    """The saved data-iterator positions cannot be mapped onto this run's process count."""


def restore_iterator(directory: str, iterator) -> None:
    """Sets `iterator` to the position saved in `directory` (see read_position)."""
    set_position(iterator, read_position(directory))


def set_position(iterator, state) -> None:
    iterator.set_state(state)
    if hasattr(iterator, "start_prefetch"):
        iterator.start_prefetch()


def read_position(directory: str):
    """The data-iterator position saved in `directory` (grain's per-process JSON files).

    Written by another process count, the position still applies when every process saved the
    same one: zoo's pipelines keep one global order and cut each global batch by process (see
    zoo.data.pipelines.batching), so their state is the global batch index, not a per-process
    cursor.
    """
    index, count = jax.process_index(), jax.process_count()
    root = paths.as_path(directory)
    own = root / f"process_{index}-of-{count}.json"

    def read():
        if own.exists():
            return json.loads(own.read_text())
        saved = sorted(p.name for p in root.iterdir() if p.name.startswith("process_"))
        if not saved:
            raise verdicts.Unreadable(f"{directory} holds no data-iterator position")
        states = [json.loads((root / name).read_text()) for name in saved]
        if any(s != states[0] for s in states):
            writers = saved[0].rsplit("-of-", 1)[1].removesuffix(".json")
            raise DataReshardError(
                f"the data positions in {directory} differ between the {writers} processes "
                f"that saved them, so this data pipeline cannot be re-sharded onto {count} "
                f"process(es); resume with {writers} processes (JAX_NUM_PROCESSES={writers})")
        return states[0]

    try:
        return verdicts.read(read, what=f"reading the data-iterator position in {directory}")
    except verdicts.Unreadable as e:
        raise verdicts.Unreadable(f"its data-iterator position is unreadable ({e})") from e
