"""Issue 29's done-when: tiny BERT pretraining reads its prepared data where it lies in a bucket
(a real GCS-API server on 127.0.0.1), as 1, 2 and 4 processes, is SIGKILLed after a checkpoint
and resumes - on as many processes, or on 2 -> 1 and 1 -> 2 - with exactly the losses and
parameters of a run that never stopped; no host copies
the prepared directory (HOME and TMPDIR of every process stay empty of it), and the records read
ahead never exceed config.data.read_ahead_mb (each process's own account at exit)."""

import json
import os
import re
import signal
import subprocess
import time

import pytest

from tests.train import multihost
from zoo import paths

pytestmark = pytest.mark.acceptance

STEPS, EVERY = 30, 10
DEVICES = 4  # global devices of every run: 1 process x 4, 2 x 2 or 4 x 1
BATCH = 16
# A bound only a few batches deep (2 at 1 process, 10 at 4), so that a read-ahead holding more
# than it allows would show.
READ_AHEAD_MB = 24 / 1024


def _command(workdir, prepared, script="train.py"):
    argv = multihost.command(workdir, STEPS, EVERY, keep=STEPS)
    argv[1] = os.path.join(multihost.ROOT, script)
    return [*argv, f"--config.data.prepared_dir={prepared}", "--config.data.read_run_rows=4",
            f"--config.data.batch_size={BATCH}", f"--config.data.read_ahead_mb={READ_AHEAD_MB}"]


def _envs(processes, home):
    env = dict(multihost.base_env(DEVICES // processes, fast_compile=True), HOME=home,
               TMPDIR=home)
    port = multihost.free_port()
    return [env if processes == 1 else
            dict(env, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                 JAX_NUM_PROCESSES=str(processes), JAX_PROCESS_ID=str(index))
            for index in range(processes)]


def _killed_after_a_checkpoint(procs, workdir):
    committed = os.path.join(workdir, "checkpoints", str(EVERY))
    deadline = time.time() + 400
    while True:
        logged = multihost.records(workdir, "train") if os.path.exists(
            os.path.join(workdir, "metrics.jsonl")) else {}
        if os.path.isdir(committed) and max(logged, default=0) >= EVERY + 3:
            break
        for index, proc in enumerate(procs):
            if proc.poll() is not None:
                pytest.fail(multihost.failure(index, proc.returncode, proc.stderr.read()))
        assert time.time() < deadline, "no checkpoint in time"
        time.sleep(0.05)
    for proc in procs:
        proc.send_signal(signal.SIGKILL)
    for proc in procs:
        proc.communicate(timeout=60)
    assert max(multihost.records(workdir, "train")) < STEPS


def _local_bytes(home):
    return {os.path.join(d, f): os.path.getsize(os.path.join(d, f))
            for d, _, files in os.walk(home) for f in files}


@pytest.fixture(scope="module")
def bucket_data(gcs, tmp_path_factory):
    prepared = f"gs://{gcs.bucket()}/prepared"
    home = str(tmp_path_factory.mktemp("prepare-home"))
    argv = _command(str(tmp_path_factory.mktemp("prep")), prepared)
    argv[1:2] = ["-m", "zoo.commands.prepare"]
    proc = subprocess.run(argv, cwd=multihost.ROOT, env=_envs(1, home)[0], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    train = paths.as_path(prepared) / "train"
    assert sum(p.name.startswith("examples-") for p in train.iterdir()) >= 1
    # The run crosses an epoch boundary: the next epoch's order is read too.
    assert json.loads((train / "manifest.json").read_text())["num_examples"] < BATCH * STEPS
    return prepared


@pytest.fixture(scope="module")
def uninterrupted(bucket_data, tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("uninterrupted"))
    home = str(tmp_path_factory.mktemp("home"))
    multihost.finish(multihost.launch(_command(workdir, bucket_data), _envs(1, home)))
    return workdir


# (processes before the kill, processes after): the data's position is global (the step), so a
# relaunch on another number of hosts reads on from the same global batch.
@pytest.mark.parametrize("before,after", [(1, 1), (2, 2), (4, 4), (2, 1), (1, 2)])
def test_killed_and_resumed_from_the_bucket_trains_as_if_never_stopped(
        bucket_data, uninterrupted, before, after, tmp_path):
    workdir, home = str(tmp_path / "run"), str(tmp_path / "home")
    os.makedirs(home)
    argv = _command(workdir, bucket_data)
    _killed_after_a_checkpoint(multihost.launch(argv, _envs(before, home)), workdir)
    saved = max(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit())
    out = multihost.finish(multihost.launch(argv, _envs(after, home)))
    assert saved >= EVERY and f"starting at step {saved} of {STEPS}" in out
    held = re.search(r"read ahead from gs://\S+: at most ([\d,]+) bytes of records held, bound "
                     r"config.data.read_ahead_mb=\S+ \(([\d,]+) bytes", out)
    assert held, out[-2000:]
    peak, bound = (int(g.replace(",", "")) for g in held.groups())
    assert 0 < peak <= bound == int(READ_AHEAD_MB * 2**20), out[-2000:]
    multihost.assert_same_training(workdir, uninterrupted, STEPS)
    # No copy of the prepared data on this "host": nothing the size of a shard, no mirror.
    local = _local_bytes(home)
    assert not [f for f in local if "examples-" in f or "prepared" in f], local
    assert sum(local.values()) < 100_000, local
