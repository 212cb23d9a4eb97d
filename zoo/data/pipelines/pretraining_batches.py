"""Batches of prepared BERT pretraining examples: an endless, checkpointable train iterator and
ordered eval passes, process-local slices of global batches.

Dynamic masks are drawn here, a whole batch at a time (zoo.data.pipelines.masking.mask_batch), from
keys of (seed, epoch, example index), so a restored iterator redraws the same masks, every
epoch sees new ones and no mask depends on the batch it falls in or on how many processes share
the batch.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence

import grain
import numpy as np

from zoo.data.pipelines.batching import iterate, local_batch_size
from zoo.data.pipelines.masking import mask_batch, masking_keys
from zoo.data.pipelines.pretraining import PretrainingSource
from zoo.errors import ConfigError


def _read(source: PretrainingSource, indices: Sequence[int]) -> dict[str, np.ndarray]:
    """The stored features of rows `indices`, stacked [len(indices), ...]."""
    return source.read(indices)


def _batch(source: PretrainingSource, seed: int, indices, epochs) -> dict[str, np.ndarray]:
    batch = _read(source, indices)
    if source.dynamic:
        batch.update(mask_batch(batch["input_ids"], masking_keys(seed, epochs, indices),
                                source.masking, source.word_starts))
    return batch


def _train_batch(source, seed, batch_size, process_index, local, step, indices):
    # Global position p of the stream is index indices[p % B] of epoch p // n; only this
    # process's rows [lo, lo + local) are read.
    lo = process_index * local
    epochs = (step * batch_size + np.arange(lo, lo + local)) // len(source)
    return _batch(source, seed, indices[lo:lo + local], epochs)


def train_iterator(
    source: PretrainingSource,
    batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    num_workers: int = 0,
) -> Iterator[dict[str, np.ndarray]]:
    """Endless, checkpointable (grain get_state/set_state) iterator of process-local batches.

    The order is global: every epoch is a seeded permutation of all examples (a new one each
    epoch), cut into global batches of `batch_size`; process i takes rows
    [i * B / count, (i + 1) * B / count) of each. Only those rows are read. A dynamic source is
    masked here with masking_keys(seed, epoch, example index), so masks do not depend on the
    process count and a restored iterator redraws them exactly.

    `num_workers` > 0 builds batches in that many grain worker processes
    (config.data.num_workers); the batches are the same as with 0 (threads in this process).
    """
    local = local_batch_size(batch_size, process_count, "config.data.batch_size")
    if len(source) < batch_size:
        raise ConfigError(
            f"config.data.batch_size={batch_size} exceeds the {len(source)} examples of "
            f"{source.path}; lower the batch size or add data"
        )
    dataset = (
        grain.MapDataset.range(len(source))
        .shuffle(seed=seed)
        .repeat()  # reshuffles every epoch
        .batch(batch_size, drop_remainder=True)
        .map_with_index(functools.partial(_train_batch, source, seed, batch_size,
                                          process_index, local))
    )
    return iterate(dataset, num_workers)


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
