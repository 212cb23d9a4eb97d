"""Prepared data read where it lies in a bucket (a real GCS-API server on 127.0.0.1): the same
batches as from local disk, a few ranged GETs per step, nothing copied to this host, and clear
errors for a missing or truncated shard object; transient errors are retried."""

import logging
import os
import threading
import time

import fsspec
import numpy as np
import pytest

from zoo import paths
from zoo.data.pipelines import pretraining as pt
from zoo.data.pipelines.pretraining import batches as pb
from zoo.data.pipelines.pretraining import examples
from zoo.data.pipelines.pretraining import store
from zoo.data.pipelines.pretraining import range_reader
from zoo.errors import DataError

SETTINGS = examples.Settings(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2,
                             seed=7, dynamic_masking=True)


@pytest.fixture(scope="module")
def local(corpus, tok, tmp_path_factory):
    return pt.prepare(corpus["validation"], tok, str(tmp_path_factory.mktemp("local")), "v",
                      SETTINGS, num_shards=3).path


def _upload(local_dir, url):
    for name in os.listdir(local_dir):
        paths.as_path(f"{url}/{name}").write_bytes(open(os.path.join(local_dir, name),
                                                        "rb").read())
    return url


def _same(got, want):
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_a_bucket_is_read_in_place_with_few_requests(local, gcs_bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # where a mirror would have gone
    url = _upload(local, f"{gcs_bucket}/prepared")
    remote = store.PretrainingSource(url)
    here = store.PretrainingSource(local)
    assert remote.remote and not here.remote and len(remote) == len(here)
    batch_size, local_rows, r = 16, 8, 4
    for read_ahead_mb in (0, 1):
        want = pb.train_iterator(here, batch_size, 5, 1, 2, run_rows=r)
        got = pb.train_iterator(remote, batch_size, 5, 1, 2, run_rows=r,
                                read_ahead_mb=read_ahead_mb)
        before = remote.requests
        steps = 2 * len(remote) // batch_size
        for _ in range(steps):
            _same(next(got), next(want))
        # One GET per run touched: at most local / r + 2 per step (more only where an epoch's
        # short last runs are), plus what was read ahead.
        assert remote.requests - before <= steps * (local_rows / r + 2) + 16 * 5
    _same(remote.read(np.arange(len(here))), here.read(np.arange(len(here))))
    _same(pb.eval_batches(remote, 10, 0, 2)[-1], pb.eval_batches(here, 10, 0, 2)[-1])
    assert not os.listdir(tmp_path)  # nothing copied to this host


def test_a_missing_or_truncated_shard_object_is_one_clear_error(local, gcs_bucket):
    url = _upload(local, f"{gcs_bucket}/prepared")
    shard = paths.as_path(f"{url}/{store.shard_file(1)}")
    whole = shard.read_bytes()
    shard.write_bytes(whole[:-7])
    with pytest.raises(DataError, match=rf"{shard}.*truncated.*prepare the directory again"):
        store.PretrainingSource(url)
    shard.unlink()
    with pytest.raises(DataError, match=rf"{shard} is missing.*prepare the directory again"):
        store.PretrainingSource(url)
    shard.write_bytes(whole)
    source = store.PretrainingSource(url)
    shard.unlink()  # removed while training reads
    with pytest.raises(DataError, match=rf"{shard} is missing"):
        source.read(np.arange(len(source)))


def test_transient_errors_are_retried_and_logged(local, gcs_bucket, monkeypatch, caplog,
                                                 fast_retries):
    url = _upload(local, f"{gcs_bucket}/prepared")
    source = store.PretrainingSource(url)
    want = store.PretrainingSource(local).read(np.arange(40))
    fs = fsspec.filesystem("gs")
    real, calls = fs.cat_ranges, []

    def flaky(paths_, starts, ends, **kwargs):  # the first call: a dropped connection
        calls.append(len(paths_))
        got = real(paths_, starts, ends, **kwargs)
        return [ConnectionResetError("connection reset by peer")] + got[1:] \
            if len(calls) == 1 else got

    monkeypatch.setattr(fs, "cat_ranges", flaky)
    with caplog.at_level(logging.WARNING, logger="zoo.retry"):
        _same(source.read(np.arange(40)), want)
    assert len(calls) == 2 and calls[1] == 1  # only the failed range again
    retries = [r for r in caplog.records if "attempt 1 of" in r.getMessage()]
    assert len(retries) == 1 and "ConnectionResetError" in retries[0].getMessage()


def test_read_ahead_fetches_the_next_keys_and_holds_a_bounded_number():
    fetched = []

    def fetch(key):
        fetched.append(key)
        return key * 10

    ahead = range_reader.ReadAhead(fetch, depth=3, stride=2)
    assert ahead.get(0) == 0
    deadline = time.time() + 5
    while len(fetched) < 4 and time.time() < deadline:
        time.sleep(0.01)
    assert sorted(fetched) == [0, 2, 4, 6]  # this consumer's next keys, fetched in background
    assert [ahead.get(k) for k in (2, 4)] == [20, 40]
    assert ahead.get(1000) == 10000  # a jump: fetched now, the stale keys dropped
    assert len(ahead._pending) <= 6
    ahead.close()


def test_read_ahead_counts_the_bytes_it_holds_and_stays_within_twice_its_depth():
    size = 1000
    ahead = range_reader.ReadAhead(lambda key: np.zeros(size, np.uint8), depth=3,
                                   nbytes=lambda r: r.nbytes)
    for key in range(20):
        assert ahead.get(key).nbytes == size
        assert ahead.held_bytes <= 2 * 3 * size
    deadline = time.time() + 5
    while ahead.held_bytes < 3 * size and time.time() < deadline:  # keys 20, 21, 22 arrive
        time.sleep(0.01)
    assert ahead.held_bytes == 3 * size
    ahead.get(1000)  # a jump: the keys left behind are dropped, and so are their bytes
    assert ahead.held_bytes <= 3 * size and len(ahead._pending) <= 6
    assert 3 * size <= ahead.peak_bytes <= 2 * 3 * size
    ahead.close()
    assert ahead.held_bytes == 0


def test_the_read_ahead_depth_fits_twice_over_in_read_ahead_mb(local, gcs_bucket):
    remote = store.PretrainingSource(_upload(local, f"{gcs_bucket}/prepared-bound"))
    batch = 8 * remote.dtype.itemsize  # bytes of records in 8 local rows
    mib = lambda n: n * batch / 2**20  # noqa: E731 - n batches, in read_ahead_mb's unit
    # (read_ahead_mb, workers, depth): 2 x depth x max(1, workers) batches fit in the bound.
    for mb, workers, depth in ((mib(5), 0, 2), (mib(4), 0, 2), (mib(3.9), 0, 1), (1, 0, 16),
                               (mib(9), 2, 2), (mib(1), 0, 0), (0, 0, 0)):
        assert pb.read_ahead_depth(remote, 8, mb, workers) == depth, (mb, workers)
    assert pb.read_ahead_depth(store.PretrainingSource(local), 8, 1, 0) == 0  # local: none


def test_one_read_ahead_per_iterator_though_two_threads_start_it(local, gcs_bucket):
    remote = store.PretrainingSource(_upload(local, f"{gcs_bucket}/prepared-once"))
    readers = lambda: [t for t in threading.enumerate() if t.name == "zoo-read-ahead"]  # noqa: E731
    before = len(readers())
    batches = pb.train_iterator(remote, 16, 5, 1, 2, run_rows=4, read_ahead_mb=1)
    for _ in range(4):
        next(batches)
    # grain's two reader threads ask for the first batches at once; one ReadAhead of depth 16
    # starts 16 threads (two of them, 32 threads, each ahead on the same keys).
    assert len(readers()) - before == pb.read_ahead_depth(remote, 8, 1, 0) == 16


def test_a_refused_read_asks_for_access_and_a_failing_bucket_is_not_damage(
        local, gcs_knobs, gcs_bucket, fast_retries):
    """Before: a 403 on the manifest was 'incomplete or corrupt ... delete the directory and
    prepare it again' (advice that destroys good data), and a 503 on word_starts.npy a raw
    HttpError after gcsfs's tries with no zoo retry."""
    from zoo import errors

    url = _upload(local, f"{gcs_bucket}/prepared-guarded")
    gcs_knobs.fail(403, count=1, op="read", object="*/manifest.json")
    with pytest.raises(errors.AccessDeniedError, match=r"manifest\.json was refused") as raised:
        store.PretrainingSource(url)
    assert "delete" not in str(raised.value) and "corrupt" not in str(raised.value)
    gcs_knobs.fail(503, count=1000, op="read", object=f"*/{store.WORD_STARTS}")
    with pytest.raises(errors.StorageUnavailableError,
                       match=rf"reading {url}/{store.WORD_STARTS}: failed 3 times"):
        store.PretrainingSource(url)
    gcs_knobs.reset_behaviour()
    gcs_knobs.fail(503, count=7, op="read", object=f"*/{store.WORD_STARTS}")  # rides it out
    assert len(store.PretrainingSource(url)) == len(store.PretrainingSource(local))
