"""Resuming after a real process dies equals never having stopped, bit for bit (CPU)."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS, EVERY = 1500, 100


def _command(workdir):
    return [
        sys.executable, os.path.join(ROOT, "train.py"), "--config=configs/gpt.py:size=tiny",
        f"--workdir={workdir}", "--config.data.seq_len=16", "--config.data.batch_size=8",
        "--config.data.vocab_size=128", f"--config.train.steps={STEPS}",
        "--config.train.log_every=1", "--config.train.eval_every=100000",
        f"--config.train.checkpoint_every={EVERY}", "--config.train.tensorboard=false",
        "--config.train.best_metric=",
    ]


def _env():
    # One device per process: the point here is process death, not sharding.
    return dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")


def _run_to_end(workdir):
    proc = subprocess.run(_command(workdir), cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _logged_steps(workdir):
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def _start_and_signal(workdir, sig, after_step):
    proc = subprocess.Popen(_command(workdir), cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        records = _logged_steps(workdir)
        if records and records[-1]["step"] >= after_step:
            break
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(0.01)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def _losses_by_step(workdir):
    # A step logged twice (before the kill and again after resuming) keeps its last value.
    return {r["step"]: r["loss"] for r in _logged_steps(workdir) if r["split"] == "train"}


def _final_state(workdir):
    manager = ocp.CheckpointManager(os.path.join(workdir, "checkpoints"))
    restored = manager.restore(STEPS, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    manager.close()
    return restored["state"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("uninterrupted"))
    _run_to_end(workdir)
    return workdir


def _assert_identical_runs(resumed, uninterrupted):
    expected, got = _losses_by_step(uninterrupted), _losses_by_step(resumed)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert got == expected  # exact float equality, every step
    a, b = _final_state(resumed), _final_state(uninterrupted)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_sigkill_between_checkpoints_then_resume_is_bit_identical(uninterrupted, tmp_path):
    workdir = str(tmp_path)
    code, _, _ = _start_and_signal(workdir, signal.SIGKILL, after_step=EVERY + 30)
    assert code == -signal.SIGKILL
    killed_at = _logged_steps(workdir)[-1]["step"]
    assert killed_at < STEPS, "the run finished before it could be killed"
    proc = _run_to_end(workdir)
    # It resumed from the last checkpoint before the kill, not from scratch.
    resumed_from = (killed_at // EVERY) * EVERY
    assert f"starting at step {resumed_from}" in proc.stdout or \
        f"starting at step {resumed_from - EVERY}" in proc.stdout, proc.stdout[:500]
    _assert_identical_runs(workdir, uninterrupted)


def test_sigterm_saves_exits_zero_and_resumes_bit_identical(uninterrupted, tmp_path):
    workdir = str(tmp_path)
    code, out, err = _start_and_signal(workdir, signal.SIGTERM, after_step=EVERY + 30)
    assert code == 0, err[-3000:]
    stopped_at = _logged_steps(workdir)[-1]["step"]
    assert stopped_at < STEPS, "the run finished before SIGTERM arrived"
    assert f"SIGTERM: saved step {stopped_at}" in out
    manager = ocp.CheckpointManager(os.path.join(workdir, "checkpoints"))
    assert manager.latest_step() == stopped_at  # saved at the step it stopped, not before
    manager.close()
    proc = _run_to_end(workdir)
    assert f"starting at step {stopped_at}" in proc.stdout
    _assert_identical_runs(workdir, uninterrupted)
