"""Batches of in-memory rows (a dict of equally long arrays): endless training batches and
one padded eval pass.

Every global batch is the same whatever the process count: the (seeded, per-epoch reshuffled)
order of rows is global, and each process takes its contiguous slice of each global batch.
"""

from collections.abc import Callable, Iterator, Sequence

import grain
import numpy as np


class _Rows(Sequence):
    """Random access to row i of a dict of equally long arrays (a grain data source)."""

    def __init__(self, rows: dict[str, np.ndarray]):
        self._rows = rows
        self._n = len(next(iter(rows.values())))

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        return {k: v[i] for k, v in self._rows.items()}


def local_batch_size(batch_size: int, process_count: int, key: str) -> int:
    """This process's rows of a global batch; an error naming the config `key` unless the
    global batch is a positive multiple of the process count."""
    if batch_size < 1 or batch_size % process_count:
        raise ValueError(
            f"{key}={batch_size} must be a positive multiple of the process count "
            f"{process_count}"
        )
    return batch_size // process_count


def _local_slice(batch: dict, process_index: int, local: int) -> dict:
    return {k: v[process_index * local : (process_index + 1) * local] for k, v in batch.items()}


def train_iterator(
    rows: dict[str, np.ndarray],
    batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    transform: Callable[[dict], dict] | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Endless, checkpointable (grain get_state/set_state) iterator of process-local batches.

    `transform` maps each process-local batch as it is drawn (e.g. row indices -> features
    computed after the iterator was made); the checkpointed position is unaffected.
    """
    local = local_batch_size(batch_size, process_count, "config.data.batch_size")
    n = len(_Rows(rows))
    if n < batch_size:
        raise ValueError(
            f"config.data.batch_size={batch_size} exceeds the {n} training rows; lower "
            "the batch size or seq_len, or add data"
        )
    dataset = (
        grain.MapDataset.source(_Rows(rows))
        .shuffle(seed=seed)
        .repeat()
        .batch(batch_size, drop_remainder=True)
        .map(lambda b: _local_slice(b, process_index, local))
    )
    if transform is not None:
        dataset = dataset.map(transform)
    # A few batches ahead on 2 threads: batching is GIL-bound numpy work, and grain's default
    # (16 threads, 500 batches ahead) only costs memory and start-up time.
    options = grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)
    return iter(dataset.to_iter_dataset(options))


def eval_batches(
    rows: dict[str, np.ndarray], batch_size: int, process_index: int = 0, process_count: int = 1
) -> list[dict[str, np.ndarray]]:
    """One ordered pass; the last batch is padded with weight-0 rows so shapes stay fixed."""
    local = local_batch_size(batch_size, process_count, "config.data.eval_batch_size")
    n = len(_Rows(rows))
    num = -(-n // batch_size)
    padded = {
        k: np.concatenate([v, np.zeros((num * batch_size - n,) + v.shape[1:], v.dtype)])
        for k, v in rows.items()
    }
    return [
        _local_slice({k: v[i * batch_size : (i + 1) * batch_size] for k, v in padded.items()},
                     process_index, local)
        for i in range(num)
    ]
