"""A restore decides that a checkpoint is corrupt from evidence only (checksums, missing files,
metadata that does not parse), retries what passes (a storage outage), raises everything else
with its traceback and moves nothing; with several real processes, all make one decision."""

import glob
import logging
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests.train import multihost
from tests.train.saved_states import file_tree, save_steps, small_state
from zoo import paths
from zoo.checkpoints import checksums
from zoo.checkpoints.checkpoint import Checkpointer
from zoo.errors import DataError


def _largest_chunk(state_dir):
    return max(glob.glob(os.path.join(state_dir, "**", "d", "*"), recursive=True),
               key=os.path.getsize)


def _garble(path):
    with open(path, "w") as f:
        f.write("{not json")


# Each as orbax and tensorstore report it (zoo.checkpoints.restore_verdicts.damage_evidence), with
# the checksum record removed so that their own error is the only evidence.
DAMAGE = {
    "deleted chunk file": (lambda s: os.remove(_largest_chunk(s)), "FAILED_PRECONDITION"),
    "truncated chunk file": (lambda s: os.truncate(_largest_chunk(s), 100), "OUT_OF_RANGE"),
    "deleted OCDBT manifest": (lambda s: os.remove(os.path.join(s, "manifest.ocdbt")),
                               "NOT_FOUND"),
    "garbled OCDBT manifest": (lambda s: _garble(os.path.join(s, "manifest.ocdbt")),
                               "DATA_LOSS"),
    "deleted _METADATA": (lambda s: os.remove(os.path.join(s, "_METADATA")),
                          "a file is missing"),
    "garbled array metadata": (
        lambda s: [_garble(p) for p in glob.glob(os.path.join(s, "array_metadatas", "*"))],
        "does not parse"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_each_kind_of_damage_is_evidence(tmp_path, damage, capsys):
    workdir = str(tmp_path)
    save_steps(workdir)
    os.remove(os.path.join(workdir, "checkpoints", "4", checksums.FILENAME))
    harm, reported = DAMAGE[damage]
    harm(os.path.join(workdir, "checkpoints", "4", "state"))
    restored = Checkpointer(workdir).restore(small_state())
    np.testing.assert_array_equal(restored.params["b"], small_state(2.0).params["b"])
    out = capsys.readouterr().out
    assert "checkpoint step 4 in" in out and reported in out


def _inject(monkeypatch, errors):
    """The array read of a restore raises `errors` in turn, then reads."""
    original = ocp.StandardCheckpointHandler.restore
    pending = list(errors)

    def restore(self, *args, **kwargs):
        if pending:
            raise pending.pop(0)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ocp.StandardCheckpointHandler, "restore", restore)


def test_an_error_inside_restore_is_raised_and_nothing_moves(tmp_path, monkeypatch):
    workdir = str(tmp_path)
    save_steps(workdir)
    before = file_tree(workdir)
    # What an out-of-memory looks like from XLA: evidence of nothing about the files.
    _inject(monkeypatch, [RuntimeError("RESOURCE_EXHAUSTED: out of memory allocating 12 GiB")])
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED") as raised:
        Checkpointer(workdir).restore(small_state(), quarantine=True)
    assert raised.traceback[-1].name == "restore"  # raised where it happened, not re-wrapped
    assert file_tree(workdir) == before


def test_a_passing_tensorstore_error_is_retried(tmp_path, monkeypatch, fast_retries, caplog):
    workdir = str(tmp_path)
    save_steps(workdir)
    before = file_tree(workdir)
    _inject(monkeypatch, [ValueError("UNAVAILABLE: HTTP response code: 503")] * 2)
    with caplog.at_level(logging.WARNING, logger="zoo.retry"):
        restored = Checkpointer(workdir).restore(small_state(), quarantine=True)
    np.testing.assert_array_equal(restored.params["b"], small_state(4.0).params["b"])
    retries = [r.getMessage() for r in caplog.records if "restoring checkpoint step 4" in
               r.getMessage()]
    assert len(retries) == 2 and "attempt 1 of 3" in retries[0], retries  # one line each
    assert file_tree(workdir) == before


def test_503s_on_the_first_reads_from_a_bucket_restore_the_same_step(gcs_knobs, gcs_bucket,
                                                                     fast_retries):
    workdir = f"{gcs_bucket}/run"
    save_steps(workdir)
    # More than gcsfs's 6 tries of one request: the first read of the newest step's metadata
    # fails as a whole and zoo.retry reads it again.
    gcs_knobs.fail(503, count=8, object="run/checkpoints/4/state/_METADATA", op="read")
    mark = gcs_knobs.mark()
    restored = Checkpointer(workdir).restore(small_state(), quarantine=True)
    np.testing.assert_array_equal(restored.params["b"], small_state(4.0).params["b"])
    assert sum(r["status"] == 503 for r in gcs_knobs.requests(since=mark)) == 8
    steps = sorted(p.name for p in paths.as_path(f"{workdir}/checkpoints").iterdir())
    assert steps == ["2", "4"]
    assert not paths.as_path(f"{workdir}/checkpoints_corrupt").exists()


# --- several real processes ------------------------------------------------------------------

SCRIPT = os.path.join(multihost.ROOT, "tests", "train", "restore_process.py")
# Each job decides in 3-6 s on the 2-core box (process start-up included); a process still
# running after this has not decided: before the fix, one waited in a barrier the other
# never reached (orbax's restore barrier: 300 s; zoo's quarantine barrier: for ever).
DECIDED_WITHIN_S = 60


def _job(mode, workdir, fault=""):
    """Two processes of restore_process.py; [(exit code, output)] of each, or the test fails
    when any runs past DECIDED_WITHIN_S."""
    port = multihost.free_port()
    envs = [dict(multihost.base_env(1), JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                 JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(i), ZOO_TEST_RESTORE_FAULT=fault)
            for i in range(2)]
    procs = [subprocess.Popen([sys.executable, SCRIPT, mode, workdir], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for env in envs]
    deadline, results = time.monotonic() + DECIDED_WITHIN_S, []
    try:
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"{mode} with {fault or 'no fault'}: process {len(results)} had not "
                            f"decided after {DECIDED_WITHIN_S} s; so far: {results}")
            results.append((proc.returncode, out))
    finally:
        multihost.kill_all(procs)
    return results


@pytest.fixture(scope="module")
def _saved_once(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("saved_by_two") / "run")
    for code, out in _job("save", workdir):
        assert code == 0, out[-3000:]
    return workdir


@pytest.fixture
def saved_by_two(_saved_once, tmp_path):
    """Steps 2 and 4 saved by two processes (a copy for this test)."""
    workdir = str(tmp_path / "run")
    shutil.copytree(_saved_once, workdir)
    return workdir


@pytest.mark.slow
def test_one_process_failing_a_restore_stops_both_with_its_traceback(saved_by_two):
    before = file_tree(saved_by_two)
    (code0, out0), (code1, out1) = _job("restore", saved_by_two, fault="raise:1")
    assert code1 != 0 and "Traceback" in out1, out1[-3000:]
    assert "RuntimeError: injected: RESOURCE_EXHAUSTED" in out1
    assert 'restore_process.py", line' in out1.split("Traceback")[-1]  # down to the raise
    assert code0 != 0, out0[-3000:]
    assert ("CheckpointRestoreError: process 1 of 2 could not restore checkpoint step 4"
            in out0), out0[-3000:]
    assert file_tree(saved_by_two) == before


@pytest.mark.slow
def test_a_file_damaged_for_one_process_only_sends_both_back(saved_by_two):
    (code0, out0), (code1, out1) = _job("restore", saved_by_two, fault="damaged:1")
    assert code0 == 0 and code1 == 0, (out0[-3000:], out1[-3000:])
    assert "RESTORED 2" in out0 and "RESTORED 2" in out1, (out0[-3000:], out1[-3000:])
    assert re.search(r"step 4 in .* is unreadable: on process 1, \d file\(s\) damaged .*"
                     r"ocdbt\.process_1/d/", out0), out0[-3000:]
    assert os.listdir(os.path.join(saved_by_two, "checkpoints_corrupt")) == ["4"]
    assert sorted(os.listdir(os.path.join(saved_by_two, "checkpoints"))) == ["2"]


@pytest.mark.slow
def test_init_from_damage_seen_by_one_process_stops_both_naming_it(saved_by_two):
    """restore_params (config.train.init_from) on two processes, one of which reads a damaged
    params file: both stop within seconds, the other naming it. Before: init_from read through
    orbax's CheckpointManager, whose restore ends in a barrier the damaged one never reaches
    (the other waited there 300 s)."""
    before = file_tree(saved_by_two)
    (code0, out0), (code1, out1) = _job("init", saved_by_two, fault="params_missing:1")
    assert code1 != 0 and "DataError" in out1 and "a file is missing" in out1, out1[-3000:]
    assert code0 != 0, out0[-3000:]
    assert re.search(r"CheckpointRestoreError: .*process 1 of 2 could not read the params of "
                     r"checkpoint step 4 .*a file is missing", out0), out0[-3000:]
    assert file_tree(saved_by_two) == before


# restore_params (config.train.init_from) sorts its reads the same way as restore.
def _inject_params_read(monkeypatch, errors):
    """restore_params' array read (PyTreeCheckpointHandler.restore) raises `errors` in turn,
    then reads."""
    original = ocp.PyTreeCheckpointHandler.restore
    pending = list(errors)

    def restore(self, *args, **kwargs):
        if pending:
            raise pending.pop(0)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ocp.PyTreeCheckpointHandler, "restore", restore)


def test_restore_params_raises_an_error_inside_its_read_untouched(tmp_path, monkeypatch):
    workdir = str(tmp_path)
    save_steps(workdir)
    _inject_params_read(monkeypatch, [RuntimeError("RESOURCE_EXHAUSTED: out of memory")])
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED") as raised:
        Checkpointer(workdir).restore_params(small_state().params)
    assert not isinstance(raised.value, DataError)
    assert raised.traceback[-1].name == "restore"  # raised where it happened, not re-wrapped


def test_restore_params_retries_a_passing_error(tmp_path, monkeypatch, fast_retries, caplog):
    workdir = str(tmp_path)
    save_steps(workdir)
    _inject_params_read(monkeypatch, [ValueError("UNAVAILABLE: HTTP response code: 503")] * 2)
    with caplog.at_level(logging.WARNING, logger="zoo.retry"):
        params = Checkpointer(workdir).restore_params(small_state().params)
    np.testing.assert_array_equal(params["b"], small_state(4.0).params["b"])
    assert sum("attempt" in r.getMessage() for r in caplog.records) == 2


@pytest.mark.parametrize("missing", ["_METADATA", "manifest.ocdbt"])
def test_restore_params_names_a_missing_file_and_what_to_do(tmp_path, missing):
    workdir = str(tmp_path)
    save_steps(workdir)
    os.remove(os.path.join(workdir, "checkpoints", "4", "state", missing))
    with pytest.raises(DataError) as raised:
        Checkpointer(workdir).restore_params(small_state().params, source="init_from='x'")
    message = str(raised.value)
    assert message.startswith("init_from='x': ")
    assert os.path.join(workdir, "checkpoints", "4") in message
    assert "point init_from at the workdir of a finished run" in message


@pytest.mark.slow
def test_ctrl_c_in_one_process_restore_stops_both(saved_by_two):
    # Before: the interrupted process left the restore at once, and the other waited in the
    # verdict gather for it (past DECIDED_WITHIN_S).
    before = file_tree(saved_by_two)
    (code0, out0), (code1, out1) = _job("restore", saved_by_two, fault="sigint:1")
    assert code1 != 0 and "KeyboardInterrupt" in out1.split("Traceback")[-1], out1[-3000:]
    assert code0 != 0, out0[-3000:]
    assert ("CheckpointRestoreError: process 1 of 2 could not restore checkpoint step 4"
            in out0 and "KeyboardInterrupt" in out0), out0[-3000:]
    assert file_tree(saved_by_two) == before


@pytest.mark.slow
def test_processes_listing_different_steps_stop_naming_both(saved_by_two):
    # Before: process 1, not seeing step 4, restored step 2 while process 0 restored step 4,
    # and both went on (each printed its own RESTORED) with a state of mixed steps.
    before = file_tree(saved_by_two)
    for code, out in _job("restore", saved_by_two, fault="unlisted:1"):
        assert code != 0 and "RESTORED" not in out, out[-3000:]
        assert ("the processes see different checkpoints in "
                f"{os.path.join(saved_by_two, 'checkpoints')}: process 0 lists 2 step(s), the "
                "newest 4; process 1 lists 1 step(s), the newest 2") in out, out[-3000:]
    assert file_tree(saved_by_two) == before


# --- init_from of a Hugging Face directory in a bucket, on two processes ---------------------


def _pretrained_dir(tmp_path, hidden_size=None):
    """A tiny BERT (restore_process.PRETRAINED_BERT, or another hidden size) saved as a Hugging
    Face directory, with the weights a hub directory also holds in formats zoo does not read;
    (directory, digest of the params load_pretrained gives)."""
    import flax.linen as nn
    import jax

    from tests.train import restore_process
    from zoo.convert import hf
    from zoo.models import bert

    config = bert.BertConfig(**dict(restore_process.PRETRAINED_BERT,
                                    **({"hidden_size": hidden_size} if hidden_size else {})))
    ids = np.zeros((1, 8), np.int32)
    params = bert.BertForQuestionAnswering(config).init(jax.random.key(7), ids, ids, ids)
    directory = tmp_path / f"qa{hidden_size or ''}"
    hf.save_pretrained(directory, config, nn.unbox(params["params"]))
    for name in ("tf_model.h5", "flax_model.msgpack"):  # never read
        (directory / name).write_bytes(os.urandom(1 << 16))
    _, loaded, _, _ = hf.load_pretrained(directory)
    return directory, restore_process.pretrained_digest(loaded)


def _upload(local, bucket):
    import fsspec

    fsspec.filesystem("gs").put(str(local), f"{bucket}/{local.name}".removeprefix("gs://"),
                                recursive=True)
    return f"{bucket}/{local.name}"


@pytest.mark.slow
def test_init_from_a_bucket_is_read_once_by_process_0_and_broadcast(gcs_knobs, gcs_bucket,
                                                                    tmp_path):
    """Both processes start from the same params as a local load, and the bucket serves the
    weights once, and none of the formats zoo does not read. Before: every process downloaded
    every object of the directory (here 2 x the weights, 2 x the unread copies)."""
    local, digest = _pretrained_dir(tmp_path)
    directory = _upload(local, gcs_bucket)
    mark = gcs_knobs.mark()
    results = _job("pretrained", directory)
    for code, out in results:
        assert code == 0 and f"PRETRAINED {digest}" in out, out[-3000:]
    served = {}
    for request in gcs_knobs.requests(since=mark):
        if request["op"] == "read" and request["status"] in (200, 206):
            name = request["object"].rsplit("/", 1)[-1]
            served[name] = served.get(name, 0) + request["bytes"]
    assert served.get("model.safetensors") == (local / "model.safetensors").stat().st_size
    assert "tf_model.h5" not in served and "flax_model.msgpack" not in served, served


@pytest.mark.slow
def test_init_from_that_process_0_cannot_read_stops_both_naming_it(gcs_bucket, tmp_path):
    """Weights of another hidden size: process 0 (the one reader) finds them wrong, and
    process 1 stops at once with its reason rather than waiting in the broadcast."""
    local, _ = _pretrained_dir(tmp_path, hidden_size=8)
    directory = _upload(local, gcs_bucket)
    (code0, out0), (code1, out1) = _job("pretrained", directory)
    assert code0 != 0 and "parameter shapes differ" in out0, out0[-3000:]
    assert code1 != 0, out1[-3000:]
    assert re.search(r"CheckpointRestoreError: config\.train\.init_from=.*: process 0 of 2, "
                     r"which reads it for every process, could not \(.*parameter shapes "
                     r"differ", out1), out1[-3000:]
