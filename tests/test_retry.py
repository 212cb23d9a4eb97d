"""zoo.retry: transient errors are retried a bounded number of times with one log line each,
anything else is raised at once; and against the test bucket with injected faults, gs:// reads
and writes in zoo.paths ride out more faults than gcsfs absorbs alone, and give up after the
bound with one clear error."""

import dataclasses
import logging
import os
import random
import subprocess
import sys
import time

import pytest

from zoo import errors, paths, retry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def HttpError(response):  # noqa: N802 - gcsfs's, imported late: gcsfs reads its settings
    # from the environment at import, which the `gcs` fixture sets only when a test uses it
    from gcsfs.retry import HttpError as gcsfs_http_error

    return gcsfs_http_error(response)

FAST = retry.Policy(attempts=3, first_delay_s=0.001, max_delay_s=0.001)


@pytest.mark.parametrize("error, transient", [
    (lambda: HttpError({"code": 503, "message": "backend"}), True),
    (lambda: HttpError({"code": 429, "message": "slow down"}), True),
    (lambda: HttpError({"code": 400, "message": "bad"}), False),
    (lambda: ConnectionResetError(104, "reset by peer"), True),
    (lambda: TimeoutError("read timed out"), True),
    (lambda: FileNotFoundError("gs://b/x"), False),
    (lambda: PermissionError("Forbidden"), False),
    (lambda: ValueError("Expecting value: line 1 column 1"), False),
])
def test_what_counts_as_transient(error, transient):
    assert retry.is_transient(error()) is transient


def test_a_transient_error_raised_from_inside_another_counts():
    try:
        try:
            raise ConnectionResetError("reset")
        except ConnectionResetError as inner:
            raise OSError("read failed") from inner
    except OSError as outer:
        assert retry.is_transient(outer)


def test_transient_errors_are_retried_each_logged_once(caplog):
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise HttpError({"code": 503, "message": "backend"})
        return "done"

    with caplog.at_level(logging.WARNING, logger="zoo.retry"):
        assert retry.retrying(flaky, what="reading gs://b/m.json", policy=FAST) == "done"
    lines = [r.getMessage() for r in caplog.records]
    assert len(calls) == 3 and len(lines) == 2
    assert lines[0].startswith("reading gs://b/m.json: attempt 1 of 3 failed (HttpError: ")
    assert "503" in lines[0] and "attempt 2 of 3" in lines[1]


def test_other_errors_are_raised_at_once():
    calls = []

    def missing():
        calls.append(1)
        raise FileNotFoundError("gs://b/m.json")

    with pytest.raises(FileNotFoundError):
        retry.retrying(missing, what="reading gs://b/m.json", policy=FAST)
    assert len(calls) == 1


def test_after_the_last_attempt_one_error_names_the_object_and_the_attempts():
    calls = []

    def down():
        calls.append(1)
        raise ConnectionResetError(104, "Connection reset by peer")

    with pytest.raises(errors.StorageUnavailableError,
                       match=r"reading gs://b/m.json: failed 3 times .*ConnectionResetError"
                             r".*run again") as caught:
        retry.retrying(down, what="reading gs://b/m.json", policy=FAST)
    assert len(calls) == 3 and isinstance(caught.value.__cause__, ConnectionResetError)
    assert isinstance(caught.value, errors.UserError)  # the CLI prints it as one line


def test_the_backoff_grows_and_is_bounded_with_jitter():
    policy = retry.Policy(attempts=5, first_delay_s=4, multiplier=4, max_delay_s=60)
    delays = [policy.delay(k) for k in (1, 2, 3, 4)]
    assert 2 <= delays[0] <= 4 and 8 <= delays[1] <= 16 and all(30 <= d <= 60
                                                                 for d in delays[2:])


# gcsfs tries each request 6 times; 7 faults make the 7th request, the first of zoo's second
# attempt, fail too, and the 8th succeed.
GCSFS_TRIES = 6


def test_a_write_rides_out_more_503s_than_gcsfs_absorbs(gcs_knobs, gcs_bucket, fast_retries):
    target = f"{gcs_bucket}/prepared/shard-00003.json"
    gcs_knobs.fail(503, count=GCSFS_TRIES + 1, op="write", object="prepared/shard-*")
    mark = gcs_knobs.mark()
    paths.write_atomic(target, '{"rows": 7}')
    writes = [r for r in gcs_knobs.requests(mark) if r["op"] == "write"]
    assert [r["status"] for r in writes] == [503] * (GCSFS_TRIES + 1) + [200]
    assert paths.read_bytes(target) == b'{"rows": 7}'


def test_a_read_rides_out_dropped_and_reset_connections(gcs_knobs, gcs_bucket, fast_retries):
    target = f"{gcs_bucket}/prepared/manifest.json"
    paths.write_atomic(target, b"x" * 1000)
    gcs_knobs.fail("drop", count=GCSFS_TRIES + 1, op="read")
    assert paths.read_bytes(target) == b"x" * 1000
    gcs_knobs.fail("reset", count=GCSFS_TRIES + 1, op="read")
    assert paths.read_bytes(target) == b"x" * 1000
    gcs_knobs.fail("drop", count=GCSFS_TRIES + 1, op="read")
    with paths.local_copy(target) as local, open(local, "rb") as f:  # a tokenizer's way in
        assert f.read() == b"x" * 1000


def test_a_corpus_streamed_from_a_bucket_rides_out_failures_mid_stream(gcs_knobs, gcs_bucket,
                                                                      fast_retries,
                                                                      monkeypatch):
    """paths.open_read (the corpus readers' way in): a chunk whose read fails beyond gcsfs's
    tries is read again at the same offset. Before, the corpus stream raised fsspec's error
    (and fsspec's readline fetched a whole block per line: 1 MB took 7 s, now 0.03 s)."""
    import io

    monkeypatch.setattr(paths.RetryingReader, "CHUNK", 4096)  # many chunks, lines across them
    target = f"{gcs_bucket}/corpus/train.txt"
    data = b"".join(f"line {i} {'word ' * (i % 40)}\n".encode() for i in range(3000))
    paths.write_atomic(target, data + b"no newline at the end")
    expected = io.BytesIO(data + b"no newline at the end")
    with paths.open_read(target) as f:
        gcs_knobs.fail("reset", count=GCSFS_TRIES + 1, op="read")  # one zoo attempt's worth
        assert [next(f) for _ in range(10)] == [next(expected) for _ in range(10)]
        gcs_knobs.fail("drop", count=GCSFS_TRIES + 1, op="read")
        assert list(f) == list(expected)
        rng = random.Random(0)
        for _ in range(200):  # seeks, reads and lines of every size, as BytesIO answers them
            pos = rng.randrange(len(data) + 30)
            assert f.seek(pos) == expected.seek(pos) and f.tell() == pos
            for _ in range(3):
                if rng.random() < 0.5:
                    size = rng.choice([-1, 0, 1, 17, 4095, 4096, 9000])
                    assert f.read(size) == expected.read(size)
                else:
                    assert f.readline() == expected.readline()
                assert f.tell() == expected.tell()
    assert all(rule["count"] == 0 for rule in gcs_knobs.state()["faults"])


def test_a_read_gives_up_after_the_bound_with_one_clear_error(gcs_knobs, gcs_bucket,
                                                              fast_retries):
    target = f"{gcs_bucket}/prepared/plan.json"
    paths.write_atomic(target, "{}")
    gcs_knobs.fail(503, count=1000, op="read")
    mark = gcs_knobs.mark()
    with pytest.raises(errors.StorageUnavailableError,
                       match=rf"reading {target}: failed 3 times .*503"):
        paths.read_bytes(target)
    reads = [r for r in gcs_knobs.requests(mark) if r["op"] == "read"]
    assert len(reads) == 3 * GCSFS_TRIES  # bounded: zoo's attempts x gcsfs's tries, no more


def test_a_missing_object_is_not_retried(gcs_knobs, gcs_bucket, fast_retries):
    mark = gcs_knobs.mark()
    with pytest.raises(FileNotFoundError):
        paths.read_bytes(f"{gcs_bucket}/prepared/none.json")
    assert len(gcs_knobs.requests(mark)) == 1


@pytest.mark.slow
def test_a_bucket_that_never_answers_is_given_up_within_the_budget(gcs_knobs, gcs_bucket,
                                                                   fast_retries, monkeypatch):
    """Before, gcsfs sent requests with no timeout: a read of an endpoint that takes the
    connection and never answers waited forever (the issue saw 300 s of silence)."""
    import aiohttp
    import fsspec
    import gcsfs

    target = f"{gcs_bucket}/prepared/manifest.json"
    paths.write_atomic(target, "{}")
    assert fsspec.config.conf["gs"]["requests_timeout"] == aiohttp.ClientTimeout(
        sock_connect=paths.DEFAULT_REQUEST_TIMEOUT_S, sock_read=paths.DEFAULT_REQUEST_TIMEOUT_S)
    # The same, at a test's pace: 1 s of silence fails a request, 10 s the operation.
    for protocol in ("gs", "gcs"):  # gcsfs's two names: fsspec applies both confs
        monkeypatch.setitem(fsspec.config.conf[protocol], "requests_timeout",
                            aiohttp.ClientTimeout(sock_connect=1, sock_read=1))
    gcsfs.GCSFileSystem.clear_instance_cache()
    monkeypatch.setattr(retry, "DEFAULT", dataclasses.replace(retry.DEFAULT, budget_s=10.0))
    gcs_knobs.fail("silent", count=1000, op="read")
    mark, start = gcs_knobs.mark(), time.monotonic()
    with pytest.raises(errors.StorageUnavailableError,
                       match=rf"reading {target}: failed once over \d+ s .*Timeout.*another "
                             r"attempt would end past the 10 s budget"):
        paths.read_bytes(target)
    assert time.monotonic() - start < 15
    silent = [r for r in gcs_knobs.requests(mark) if r["fault"] == "silent"]
    assert len(silent) == GCSFS_TRIES  # each of gcsfs's tries timed out, and zoo gave up
    gcsfs.GCSFileSystem.clear_instance_cache()  # the next test's instances: the default again


@pytest.mark.slow
def test_the_job_config_bounds_requests_and_operations(gcs_knobs, gcs_bucket, fast_retries):
    """config.train.storage (zoo.paths.configure, which every job calls before its first
    request): before, the bounds were an environment variable and a constant."""
    import aiohttp
    import fsspec
    import gcsfs

    target = f"{gcs_bucket}/prepared/manifest.json"
    paths.write_atomic(target, "{}")  # a gs:// path seen: clients exist with the defaults
    try:
        paths.configure({"request_timeout_s": 1, "operation_budget_s": 10})
        assert fsspec.config.conf["gs"]["requests_timeout"] == aiohttp.ClientTimeout(
            sock_connect=1, sock_read=1)
        assert os.environ["TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS"] == "1"
        gcs_knobs.fail("silent", count=1000, op="read")
        start = time.monotonic()
        with pytest.raises(errors.StorageUnavailableError,
                           match=r"failed once over \d+ s .*config\.train\.storage\.request_"
                                 r"timeout_s.*past the 10 s budget"):
            paths.read_bytes(target)
        assert time.monotonic() - start < 15
    finally:
        paths.configure(None)  # the defaults again, for the next test
    assert paths.request_timeout_s() == paths.DEFAULT_REQUEST_TIMEOUT_S
    assert retry.DEFAULT.budget_s == retry.Policy.budget_s
    gcsfs.GCSFileSystem.clear_instance_cache()


@pytest.mark.parametrize("storage, message", [
    ({"request_timeout_s": "soon"}, r"config\.train\.storage\.request_timeout_s='soon' must"),
    ({"operation_budget_s": -1}, r"config\.train\.storage\.operation_budget_s=-1 must"),
    ({"timeout": 5}, r"config\.train\.storage\.timeout: unknown key"),
])
def test_a_bad_storage_setting_names_its_key(storage, message):
    with pytest.raises(errors.ConfigError, match=message):
        paths.configure(storage)


# A tensorstore read (orbax's arrays) as a process reads it once zoo has seen a gs:// path.
_TENSORSTORE_READ = """
import sys, time
from zoo import paths
paths.is_remote(sys.argv[1])  # zoo's request settings, set at the first gs:// path
import tensorstore as ts
from orbax.checkpoint._src.serialization import tensorstore_utils
context = tensorstore_utils.get_ts_context(use_ocdbt=False)  # what orbax reads with
bucket, _, name = sys.argv[1][len("gs://"):].partition("/")
store = ts.KvStore.open({"driver": "gcs", "bucket": bucket}, context=context).result()
started = time.monotonic()
try:
    store.read(name).result()
    print("read")
except Exception as e:
    print(f"gave up after {time.monotonic() - started:.0f} s: {str(e)[:300]}")
"""


@pytest.mark.slow
def test_a_tensorstore_read_of_a_silent_bucket_is_given_up(gcs_knobs, gcs_bucket):
    """Before, tensorstore's requests had no timeout (a read of an endpoint that never answers
    waited forever: this test's 120 s), and 32 retries waiting up to 32 s each."""
    target = f"{gcs_bucket}/run/checkpoints/4/state/manifest.ocdbt"
    paths.write_atomic(target, "x")
    gcs_knobs.fail("silent", count=1000, op="read")
    mark = gcs_knobs.mark()
    proc = subprocess.run([sys.executable, "-c", _TENSORSTORE_READ, target], cwd=ROOT,
                          env=dict(os.environ, **{paths.REQUEST_TIMEOUT_ENV: "1"}),
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.startswith("gave up after "), (proc.stdout, proc.stderr[-2000:])
    silent = [r for r in gcs_knobs.requests(mark) if r["fault"] == "silent"]
    # 1 + max_retries requests of 1 s each, the waits between them (1, 2, 4, 8, 8 s) between.
    assert len(silent) == 1 + paths.TENSORSTORE_RETRIES["max_retries"], silent
    assert int(proc.stdout.split()[3]) < 6 + 23 + 15, proc.stdout


def test_a_bad_request_timeout_names_the_variable(monkeypatch):
    # The variable is read only where no job configured a timeout: a job run in this process
    # before (any test's) leaves its config.train.storage value in force.
    monkeypatch.setattr(paths, "_configured_timeout_s", None)
    monkeypatch.setenv(paths.REQUEST_TIMEOUT_ENV, "soon")
    with pytest.raises(errors.ConfigError, match="ZOO_GCS_REQUEST_TIMEOUT_S='soon'"):
        paths.request_timeout_s()
