"""Length-bucketed training batches: every row once per epoch, one bucket per batch, each cut
to its boundary, deterministic, resumable and the same global batch for any process count."""

import numpy as np
import pytest

from zoo.data.pipelines import batching

BOUNDARIES = [4, 6, 8]


def _rows(n=48, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 9, size=n)
    tokens = np.zeros((n, 8), np.int32)
    for i, length in enumerate(lengths):
        tokens[i, :length] = i + 1  # row i's tokens say which row they are
    return {"tokens": tokens, "row": np.arange(n)}, lengths


def _take(iterator, count):
    return [next(iterator) for _ in range(count)]


def test_each_batch_is_one_bucket_cut_to_its_boundary_and_an_epoch_covers_the_rows():
    rows, lengths = _rows()
    bucket = np.searchsorted(BOUNDARIES, lengths, side="left")
    per_epoch = sum(int(np.sum(bucket == k)) // 4 for k in range(3))
    batches = _take(batching.bucketed_train_iterator(rows, lengths, BOUNDARIES, 4, seed=1),
                    per_epoch)
    seen = []
    for b in batches:
        buckets = set(bucket[b["row"]])
        assert len(buckets) == 1
        assert b["tokens"].shape == (4, BOUNDARIES[buckets.pop()])
        # Cutting drops padding only: every row keeps all its tokens.
        np.testing.assert_array_equal((b["tokens"] > 0).sum(axis=1), lengths[b["row"]])
        seen.extend(b["row"])
    assert len(seen) == len(set(seen)) == per_epoch * 4
    # Left out: fewer than a batch per bucket (the remainders), never more.
    assert len(rows["row"]) - len(seen) <= 3 * 3


def test_deterministic_reshuffled_per_epoch_and_resumable():
    rows, lengths = _rows()

    def make():
        return batching.bucketed_train_iterator(rows, lengths, BOUNDARIES, 4, seed=3)

    bucket = np.searchsorted(BOUNDARIES, lengths, side="left")
    per_epoch = sum(int(np.sum(bucket == k)) // 4 for k in range(3))
    first = [b["row"].tolist() for b in _take(make(), 2 * per_epoch)]
    assert first == [b["row"].tolist() for b in _take(make(), 2 * per_epoch)]
    assert first[:per_epoch] != first[per_epoch:]  # a new order each epoch
    iterator = make()
    _take(iterator, 7)
    state = iterator.get_state()
    rest = [b["row"].tolist() for b in _take(iterator, 5)]
    resumed = make()
    resumed.set_state(state)
    assert [b["row"].tolist() for b in _take(resumed, 5)] == rest


def test_processes_take_slices_of_the_same_global_batch():
    rows, lengths = _rows()
    whole = _take(batching.bucketed_train_iterator(rows, lengths, BOUNDARIES, 4, seed=5), 6)
    halves = [_take(batching.bucketed_train_iterator(rows, lengths, BOUNDARIES, 4, seed=5,
                                                     process_index=p, process_count=2), 6)
              for p in (0, 1)]
    for i, b in enumerate(whole):
        np.testing.assert_array_equal(
            np.concatenate([halves[0][i]["tokens"], halves[1][i]["tokens"]]), b["tokens"])


def test_bad_buckets_are_named():
    rows, lengths = _rows()
    with pytest.raises(ValueError, match="length_buckets ends at 6"):
        batching.bucketed_train_iterator(rows, lengths, [4, 6], 4, seed=0)
    with pytest.raises(ValueError, match="strictly increasing"):
        batching.bucketed_train_iterator(rows, lengths, [6, 4, 8], 4, seed=0)
    with pytest.raises(ValueError, match="batch_size=64 is more than any length bucket"):
        batching.bucketed_train_iterator(rows, lengths, BOUNDARIES, 64, seed=0)


@pytest.mark.slow
def test_plain_batches_cover_each_epoch_and_are_the_same_in_worker_processes():
    rows, _ = _rows()
    batches = _take(batching.train_iterator(rows, 8, seed=4), 12)  # two epochs of 48 rows
    for epoch in (batches[:6], batches[6:]):
        assert sorted(np.concatenate([b["row"] for b in epoch])) == list(range(48))
        for b in epoch:  # every array of a row stays with it
            np.testing.assert_array_equal(b["tokens"].max(axis=1), b["row"] + 1)
    assert not np.array_equal(batches[0]["row"], batches[6]["row"])  # reshuffled
    # Process 1 of 2 built in two worker processes: its half of the same global batches.
    workers = batching.train_iterator(rows, 8, seed=4, process_index=1, process_count=2,
                                      num_workers=2)
    for want, got in zip(batches, _take(workers, 12)):
        for k in want:
            np.testing.assert_array_equal(got[k], want[k][4:])
    workers.close()


# In worker processes: 7 iterators each starting 2 workers, ~45 s on the 2-core box: acceptance.
@pytest.mark.parametrize("kind", ["plain", "bucketed", pytest.param(
    "plain in 2 workers", marks=pytest.mark.acceptance)])
def test_a_position_saved_by_2_processes_resumes_on_1_and_4(kind):
    # Classification, translation and the LM jobs checkpoint these iterators: every process
    # must save the same (global) position, and any process count must read on from it.
    rows, lengths = _rows()

    def make(index, count):
        if kind == "bucketed":
            return batching.bucketed_train_iterator(rows, lengths, BOUNDARIES, 8, seed=2,
                                                    process_index=index, process_count=count)
        return batching.train_iterator(rows, 8, seed=2, process_index=index, process_count=count,
                                       num_workers=2 if "workers" in kind else 0)

    whole = [b["row"] for b in _take(make(0, 1), 9)]
    states = []
    for index in (0, 1):
        iterator = make(index, 2)
        _take(iterator, 5)  # into the second epoch: 6 batches of 8 in 48 rows
        states.append(iterator.get_state())
        if hasattr(iterator, "close"):
            iterator.close()
    assert states[0] == states[1]
    for count in (1, 4):
        parts = []
        for index in range(count):
            iterator = make(index, count)
            iterator.set_state(states[0])
            parts.append([b["row"] for b in _take(iterator, 4)])
            if hasattr(iterator, "close"):
                iterator.close()
        for i in range(4):
            np.testing.assert_array_equal(np.concatenate([p[i] for p in parts]), whole[5 + i])
