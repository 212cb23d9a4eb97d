"""The training order of runs: r = 1 is exactly grain's range(n).shuffle(seed).repeat(); longer
runs are consecutive rows of one shard, every row once per epoch, a new order each epoch, and a
process's slice of a batch is a handful of spans."""

import grain
import numpy as np
import pytest

from configs import bert_pretrain
from zoo.data.pipelines.pretraining.run_order import RunOrder, resolve_run_rows
from zoo.errors import ConfigError

SHARD_ROWS = [37, 50, 3, 41]  # a shard smaller than a run, and tails of every length
N = sum(SHARD_ROWS)
OFFSETS = np.cumsum([0, *SHARD_ROWS])


def _rows(order, start, stop):
    return [int(OFFSETS[s]) + r for s, lo, hi, _ in order.spans(start, stop)
            for r in range(lo, hi)]


def test_one_row_runs_are_grains_shuffle_bit_for_bit():
    for seed in (0, 5, 2**32 - 1):
        grain_order = grain.MapDataset.range(N).shuffle(seed=seed).repeat()
        order = RunOrder(SHARD_ROWS, 1, seed)
        assert _rows(order, 0, 3 * N) == [grain_order[i] for i in range(3 * N)]
        # Any window, as a process slice asks for it.
        assert _rows(order, 100, 177) == [grain_order[i] for i in range(100, 177)]


@pytest.mark.parametrize("r", [4, 16, 64])
def test_runs_are_consecutive_rows_every_row_once_per_epoch(r):
    order = RunOrder(SHARD_ROWS, r, seed=3)
    epochs = []
    for epoch in range(3):
        spans = order.spans(epoch * N, (epoch + 1) * N)
        assert all(e == epoch for *_, e in spans)
        rows = [int(OFFSETS[s]) + i for s, lo, hi, _ in spans for i in range(lo, hi)]
        assert sorted(rows) == list(range(N))
        for s, lo, hi, _ in spans:  # a whole run: r rows from a multiple of r, or a tail
            assert lo % r == 0 and (hi - lo == r or hi == SHARD_ROWS[s])
        epochs.append(rows)
    if order.full_runs > 8:  # (4 shards' tails alone have only 24 orders)
        assert epochs[0] != epochs[1] != epochs[2]  # a new order every epoch


def test_a_slice_is_at_most_local_over_r_plus_two_spans():
    shard_rows = [1000, 1000, 997]
    r, local = 16, 40
    order = RunOrder(shard_rows, r, seed=1)
    body = order.full_runs * r
    for start in range(0, body - local, 7):
        assert len(order.spans(start, start + local)) <= local / r + 2


def test_bad_run_rows_and_seed_name_the_key():
    with pytest.raises(ConfigError, match="config.data.read_run_rows=0"):
        RunOrder(SHARD_ROWS, 0, 1)
    with pytest.raises(ConfigError, match="config.data.seed=-1"):
        RunOrder(SHARD_ROWS, 4, -1)


def test_an_automatic_run_length_leaves_every_batch_64_runs():
    # 0 = batch_size // 64 between 1 and 16: tiny BERT's 32 rows keep the row-by-row shuffle.
    assert [resolve_run_rows(0, b) for b in (32, 127, 128, 256, 1024, 65536)] == [
        1, 1, 2, 4, 16, 16]
    assert resolve_run_rows(0, bert_pretrain.get_config("size=tiny").data.batch_size) == 1
    assert resolve_run_rows(5, 32) == 5  # a length given is kept
    for bad in (-1, 2.5, True, "16"):
        with pytest.raises(ConfigError, match=r"config\.data\.read_run_rows=.* must be an int >= 0"):
            resolve_run_rows(bad, 256)
