"""Batches of prepared BERT pretraining examples: an endless, checkpointable train iterator and
ordered eval passes, process-local slices of global batches.

Dynamic masks are drawn here from an rng keyed by (seed, epoch, example index), so a restored
iterator redraws the same masks, every epoch sees new ones and no mask depends on how many
processes share the batch.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import grain
import numpy as np

from zoo.data.pipelines.batching import local_batch_size
from zoo.data.pipelines.pretraining import PretrainingSource
from zoo.data.pipelines.pretraining_examples import mask_example, masking_rng
from zoo.errors import ConfigError


def _features(source: PretrainingSource, index: int, seed: int, epoch: int) -> dict:
    row = source[index]
    if source.dynamic:
        row = mask_example(row, source.masking, source.word_starts,
                           masking_rng(seed, epoch, index))
    return row


def _stack(rows: list[dict]) -> dict[str, np.ndarray]:
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def _train_batch(source, seed, batch_size, process_index, local, step, indices):
    n = len(source)
    # Global position p of the stream is index indices[p % B] of epoch p // n.
    lo = process_index * local
    return _stack([
        _features(source, int(indices[j]), seed, (step * batch_size + j) // n)
        for j in range(lo, lo + local)
    ])


def train_iterator(
    source: PretrainingSource,
    batch_size: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
    read_options: grain.ReadOptions | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Endless, checkpointable (grain get_state/set_state) iterator of process-local batches.

    The order is global: every epoch is a seeded permutation of all examples (a new one each
    epoch), cut into global batches of `batch_size`; process i takes rows
    [i * B / count, (i + 1) * B / count) of each. Only those rows are read. A dynamic source is
    masked here with masking_rng(seed, epoch, example index), so masks do not depend on the
    process count and a restored iterator redraws them exactly.

    `read_options` defaults to a few batches read ahead on 2 threads: building a batch is
    GIL-bound numpy work, so grain's default (16 threads, 500 batches ahead) only burns memory
    and start-up time.
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
    options = read_options or grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)
    return iter(dataset.to_iter_dataset(options))


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
    if n == 0:
        return []
    template = _features(source, 0, seed, 0)
    padding = {k: np.zeros_like(v) for k, v in template.items()}
    batches = []
    for start in range(0, n, batch_size):
        lo = start + process_index * local
        batches.append(_stack([
            _features(source, i, seed, 0) if i < n else padding for i in range(lo, lo + local)
        ]))
    return batches
