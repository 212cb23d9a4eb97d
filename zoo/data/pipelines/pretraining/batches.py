"""Batches of prepared BERT pretraining examples: an endless, checkpointable train iterator and
ordered eval passes, process-local slices of global batches.

Dynamic masks are drawn here, a whole batch at a time (zoo.data.pipelines.masking.mask_batch), from
keys of (seed, epoch, example index), so a restored iterator redraws the same masks, every
epoch sees new ones and no mask depends on the batch it falls in or on how many processes share
the batch.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Iterator, Sequence

import grain
import numpy as np

from zoo.data.pipelines.batching import iterate, local_batch_size
from zoo.data.pipelines.masking import mask_batch, masking_keys
from zoo.data.pipelines.pretraining import PretrainingSource
from zoo.data.pipelines.pretraining.range_reader import ReadAhead
from zoo.data.pipelines.pretraining.run_order import RunOrder
from zoo.errors import ConfigError

_STARTING = threading.Lock()  # one ReadAhead per _TrainBatches
_MAX_READ_AHEAD = 16  # batches; grain keeps 8 more decoded ones in its own buffer


def _batch(source: PretrainingSource, seed: int, indices, epochs) -> dict[str, np.ndarray]:
    return _masked(source, seed, source.read(indices), indices, epochs)


def _masked(source, seed, batch, indices, epochs) -> dict[str, np.ndarray]:
    if source.dynamic:
        batch.update(mask_batch(batch["input_ids"], masking_keys(seed, epochs, indices),
                                source.masking, source.word_starts))
    return batch


class _TrainBatches(Sequence):
    """Step k -> this process's rows [lo, lo + local) of global batch k of the RunOrder stream
    (a grain data source: its index is the checkpointed position)."""

    _STEPS = 2**40  # "endless": grain needs a length; no run gets near it

    def __init__(self, source: PretrainingSource, batch_size: int, seed: int, lo: int,
                 local: int, run_rows: int, read_ahead: int, stride: int,
                 read_ahead_mb: float = 0):
        self._source, self._batch_size, self._seed = source, batch_size, seed
        self._lo, self._local, self._ahead_depth, self._stride = lo, local, read_ahead, stride
        self._read_ahead_mb = read_ahead_mb
        self.order = RunOrder(source.shard_rows, run_rows, seed)
        self._ahead = None

    def __len__(self) -> int:
        return self._STEPS

    def spans(self, step: int) -> list[tuple[int, int, int, int]]:
        start = step * self._batch_size + self._lo
        return self.order.spans(start, start + self._local)

    def _records(self, step: int) -> np.ndarray:
        return self._source.records([span[:3] for span in self.spans(step)])

    def __getitem__(self, step: int) -> dict[str, np.ndarray]:
        step = int(step)
        if self._ahead_depth and self._ahead is None:
            # grain's two reader threads arrive here together on the first batches: without
            # the lock both built a ReadAhead, and the one overwritten kept its threads and
            # its fetched batches for the rest of the run.
            with _STARTING:
                if self._ahead is None:
                    self._ahead = ReadAhead(self._records, self._ahead_depth, self._stride,
                                            nbytes=lambda records: records.nbytes)
                    # At exit, by a weak reference: many iterators (a notebook) keep none alive.
                    atexit.register(_report_read_ahead, weakref.ref(self))
        spans = self.spans(step)
        records = self._ahead.get(step) if self._ahead else self._records(step)
        indices = np.concatenate([np.arange(self._source.global_index(s, lo),
                                            self._source.global_index(s, hi))
                                  for s, lo, hi, _ in spans])
        epochs = np.concatenate([np.full(hi - lo, e) for _, lo, hi, e in spans])
        return _masked(self._source, self._seed, self._source.decode(records), indices, epochs)

    def __getstate__(self):
        # Pickled into grain workers: each starts its own read-ahead threads.
        return {**self.__dict__, "_ahead": None}


def read_ahead_depth(source: PretrainingSource, local: int, read_ahead_mb: float,
                     num_workers: int) -> int:
    """Batches of `local` rows to read ahead from a bucket (0 for a local directory): ReadAhead
    holds up to 2 x depth of them in each of max(1, num_workers) processes, all within
    `read_ahead_mb`; at most 16."""
    if not source.remote:
        return 0
    held = 2 * max(1, num_workers) * local * source.dtype.itemsize  # bytes per unit of depth
    return min(_MAX_READ_AHEAD, int(read_ahead_mb * 2**20) // held)


def _report_read_ahead(ref: weakref.ref) -> None:
    """One line at exit: the most the read-ahead held, against its bound."""
    batches = ref()
    if batches is not None and batches._ahead is not None:
        mb = batches._read_ahead_mb
        print(f"read ahead from {batches._source.path}: at most "
              f"{batches._ahead.peak_bytes:,} bytes of records held, bound "
              f"config.data.read_ahead_mb={mb:g} ({int(mb * 2**20):,} bytes; "
              f"{batches._ahead_depth} batches ahead)", flush=True)


def train_iterator(
    source: PretrainingSource,
    batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    num_workers: int = 0,
    run_rows: int = 1,
    read_ahead_mb: float = 0,
) -> Iterator[dict[str, np.ndarray]]:
    """Endless, checkpointable (grain get_state/set_state) iterator of process-local batches.

    The order is global (zoo.data.pipelines.pretraining.run_order): every epoch, the rows cut into
    runs of `run_rows` consecutive rows of a shard (config.data.read_run_rows), the runs shuffled
    (a new order each epoch), cut into global batches of `batch_size`; process i takes rows
    [i * B / count, (i + 1) * B / count) of each, and reads only those: from a bucket, one
    ranged GET per run it touches. The stream does not depend on the process count, so a
    checkpoint (the global batch index) resumes on any. A dynamic source is masked here with
    masking_keys(seed, epoch, example index), so masks do not depend on the process count and a
    restored iterator redraws them exactly. run_rows = 1 is exactly the order of grain's
    range(n).shuffle(seed).repeat().

    From a bucket, the batches that come next are read on background threads, as many as fit
    in `read_ahead_mb` of records (config.data.read_ahead_mb; at most 16; 0: none): depth d
    batches ahead hold at most 2 d (zoo.data.pipelines.pretraining.range_reader.ReadAhead), in
    each of max(1, num_workers) processes, so d is chosen for 2 d x processes batches to fit.
    `num_workers` > 0 builds batches in that many grain worker processes
    (config.data.num_workers); the batches are the same as with 0 (threads in this process).
    """
    local = local_batch_size(batch_size, process_count, "config.data.batch_size")
    if len(source) < batch_size:
        raise ConfigError(
            f"config.data.batch_size={batch_size} exceeds the {len(source)} examples of "
            f"{source.path}; lower the batch size or add data"
        )
    if not isinstance(read_ahead_mb, (int, float)) or read_ahead_mb < 0:
        raise ConfigError(f"config.data.read_ahead_mb={read_ahead_mb!r} must be a number >= 0 "
                          "(megabytes of records read ahead from a bucket; 0 = none)")
    batches = _TrainBatches(source, batch_size, seed, process_index * local, local, run_rows,
                            read_ahead_depth(source, local, read_ahead_mb, num_workers),
                            max(1, num_workers), read_ahead_mb)
    return iterate(grain.MapDataset.source(batches), num_workers)


def eval_batches(
    source: PretrainingSource,
    batch_size: int,
    process_index: int = 0,
    process_count: int = 1,
    seed: int = 0,
) -> list[dict[str, np.ndarray]]:
    """One ordered pass; the last global batch is filled with all-zero rows (example_weight 0,
    masked_lm_weights 0) so shapes stay fixed. A dynamic source is masked as epoch 0 of `seed`.
    """
    local = local_batch_size(batch_size, process_count, "config.data.eval_batch_size")
    n = len(source)
    batches = []
    for start in range(0, n, batch_size):
        lo = start + process_index * local
        real = np.arange(lo, min(lo + local, n))
        if len(real):
            batch = _batch(source, seed, real, 0)
        else:  # this process's slice of the last batch is all padding
            batch = {k: v[:0] for k, v in _batch(source, seed, [0], 0).items()}
        batches.append({k: np.concatenate([v, np.zeros((local - len(real),) + v.shape[1:],
                                                        v.dtype)])
                        for k, v in batch.items()})
    return batches
