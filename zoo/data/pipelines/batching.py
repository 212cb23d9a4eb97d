"""Batches of in-memory rows (a dict of equally long arrays): endless training batches (plain,
or grouped by length into buckets) and one padded eval pass.

Every global batch is the same whatever the process count: the (seeded, per-epoch reshuffled)
order of rows is global, and each process takes its contiguous slice of each global batch.
"""

import functools
from collections.abc import Callable, Iterator, Sequence

import grain
import numpy as np
from absl import flags

from zoo.errors import ConfigError


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
        raise ConfigError(
            f"{key}={batch_size} must be a positive multiple of the process count "
            f"{process_count}"
        )
    return batch_size // process_count


def _local_slice(batch: dict, process_index: int, local: int) -> dict:
    return {k: v[process_index * local : (process_index + 1) * local] for k, v in batch.items()}


def iterate(dataset: grain.MapDataset, num_workers: int = 0) -> Iterator:
    """A checkpointable iterator over `dataset` (a MapDataset of whole batches), built in this
    process or in `num_workers` grain worker processes (config.data.num_workers).

    In-process, a few batches are read ahead on 2 threads: batching is GIL-bound numpy work, and
    grain's default (16 threads, 500 batches ahead) only costs memory and start-up time. With
    workers, worker w builds batches w, w + n, w + 2n, ... and grain interleaves them back in
    order, so the stream (and a restored iterator's) is the same for any worker count.
    """
    if not isinstance(num_workers, int) or num_workers < 0:
        raise ConfigError(f"config.data.num_workers={num_workers!r} must be an int >= 0 (0: "
                          "build batches in the training process)")
    if not num_workers:
        return iter(dataset.to_iter_dataset(
            grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)))
    # grain reads its absl flags when it starts workers; a caller outside absl.app (a test, a
    # notebook, a benchmark) has not parsed them, and their defaults are what we want.
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    # Inside a worker, no threads: the processes are the parallelism, each a batch or two ahead.
    per_worker = dataset.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    return iter(per_worker.mp_prefetch(
        grain.MultiprocessingOptions(num_workers=num_workers, per_worker_buffer_size=2)))


def _gather(rows: dict[str, np.ndarray], indices: np.ndarray, process_index: int,
            local: int) -> dict[str, np.ndarray]:
    index = _local_slice({"i": indices}, process_index, local)["i"]
    return {k: v[index] for k, v in rows.items()}


def train_iterator(
    rows: dict[str, np.ndarray],
    batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    transform: Callable[[dict], dict] | None = None,
    num_workers: int = 0,
) -> Iterator[dict[str, np.ndarray]]:
    """Endless, checkpointable (grain get_state/set_state) iterator of process-local batches.

    `transform` maps each process-local batch as it is drawn (e.g. row indices -> features
    computed after the iterator was made); the checkpointed position is unaffected.
    `num_workers` > 0 builds batches in grain worker processes (see `iterate`).
    """
    local = local_batch_size(batch_size, process_count, "config.data.batch_size")
    n = len(_Rows(rows))
    if n < batch_size:
        raise ConfigError(
            f"config.data.batch_size={batch_size} exceeds the {n} training rows; lower "
            "the batch size or seq_len, or add data"
        )
    # Batches of row indices, then one fancy-index gather per array for this process's slice:
    # the same rows as batching row dicts, without a dict and a stack per row.
    dataset = (
        grain.MapDataset.range(n)
        .shuffle(seed=seed)
        .repeat()
        .batch(batch_size, drop_remainder=True)
        .map(functools.partial(_gather, rows, process_index=process_index, local=local))
    )
    if transform is not None:
        dataset = dataset.map(transform)
    return iterate(dataset, num_workers)


class _BucketedBatches(Sequence):
    """Global batch i of an endless plan: every epoch, each length bucket's rows are shuffled
    and cut into full batches, and the batches of all buckets are shuffled together.

    A batch holds rows of one bucket only, and its 2-D arrays are cut to that bucket's
    boundary: short rows stop paying for the longest row's padding, at the cost of one compiled
    shape per boundary. Each epoch leaves out a bucket's last rows that do not fill a batch
    (other rows each epoch, as the shuffle differs).
    """

    _EPOCHS = 1_000_000  # "endless": grain needs a length; no run gets near it

    def __init__(self, rows: dict[str, np.ndarray], lengths: np.ndarray,
                 boundaries: Sequence[int], batch_size: int, seed: int):
        self._rows, self._batch_size, self._seed = rows, batch_size, seed
        self._bounds = [int(b) for b in boundaries]
        if not self._bounds or any(b >= c for b, c in zip(self._bounds, self._bounds[1:])):
            raise ConfigError(f"config.data.length_buckets={list(boundaries)} must be strictly "
                              "increasing lengths")
        if lengths.max() > self._bounds[-1]:
            raise ConfigError(f"config.data.length_buckets ends at {self._bounds[-1]} but a row "
                              f"has {lengths.max()} tokens; end it at the row length")
        # side='left': a length equal to a boundary falls in that boundary's bucket.
        bucket = np.searchsorted(np.asarray(self._bounds), lengths, side="left")
        self._buckets = [np.flatnonzero(bucket == k) for k in range(len(self._bounds))]
        self._per_epoch = sum(len(b) // batch_size for b in self._buckets)
        if not self._per_epoch:
            raise ConfigError(f"config.data.batch_size={batch_size} is more than any length "
                              f"bucket's rows ({[len(b) for b in self._buckets]}); use fewer "
                              "buckets or a smaller batch")

    def __len__(self) -> int:
        return self._per_epoch * self._EPOCHS

    @functools.lru_cache(maxsize=2)  # noqa: B019 (one plan per epoch, two epochs in flight)
    def _plan(self, epoch: int) -> list[tuple[int, np.ndarray]]:
        rng = np.random.default_rng([self._seed, epoch])
        batches = []
        for k, rows in enumerate(self._buckets):
            rows = rng.permutation(rows)
            batches += [(k, rows[i * self._batch_size:(i + 1) * self._batch_size])
                        for i in range(len(rows) // self._batch_size)]
        return [batches[i] for i in rng.permutation(len(batches))]

    def __getitem__(self, i):
        k, index = self._plan(i // self._per_epoch)[i % self._per_epoch]
        width = self._bounds[k]
        return {name: v[index][:, :width] if v.ndim >= 2 else v[index]
                for name, v in self._rows.items()}


def bucketed_train_iterator(
    rows: dict[str, np.ndarray],
    lengths: np.ndarray,
    boundaries: Sequence[int],
    batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
) -> Iterator[dict[str, np.ndarray]]:
    """Like train_iterator, but each global batch holds rows of one length bucket, with every
    2-D array cut to the bucket's boundary (see _BucketedBatches).

    Args:
      rows: equally long arrays; 2-D ones are [N, L] token rows, left-aligned (padding last).
      lengths: [N] the tokens each row needs (for pairs: the longer side).
      boundaries: increasing bucket lengths; the last must cover every row.
    """
    local = local_batch_size(batch_size, process_count, "config.data.batch_size")
    dataset = grain.MapDataset.source(
        _BucketedBatches(rows, np.asarray(lengths), boundaries, batch_size, seed)
    ).map(lambda b: _local_slice(b, process_index, local))
    return iterate(dataset)


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
