"""Resuming after a real process dies equals never having stopped, bit for bit (CPU)."""

import json
import os
import re
import signal
import subprocess
import time

import orbax.checkpoint as ocp
import pytest

from tests.train import gpt_process

# The signal lands after step EVERY + 30; the 470 steps left (several seconds even on a loaded
# machine) keep the run alive until it arrives, and `< STEPS` asserts below say if not.
STEPS, EVERY = 600, 100


def _run_to_end(workdir):
    return gpt_process.run(workdir, STEPS, EVERY)


def _start_and_signal(workdir, sig, after_step):
    proc = subprocess.Popen(gpt_process.command(workdir, STEPS, EVERY), cwd=gpt_process.ROOT,
                            env=gpt_process.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        records = gpt_process.logged_steps(workdir)
        if records and records[-1]["step"] >= after_step:
            break
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(0.01)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("uninterrupted"))
    _run_to_end(workdir)
    return workdir


def _goodput(workdir):
    with open(os.path.join(workdir, "goodput.json")) as f:
        return json.load(f)


def _summary(workdir):
    with open(os.path.join(workdir, "summary.json")) as f:
        return json.load(f)


def _assert_identical_runs(resumed, uninterrupted):
    gpt_process.assert_identical_runs(resumed, uninterrupted, STEPS)


@pytest.mark.slow
def test_sigkill_between_checkpoints_then_resume_is_bit_identical(uninterrupted, tmp_path):
    workdir = str(tmp_path)
    code, _, _ = _start_and_signal(workdir, signal.SIGKILL, after_step=EVERY + 30)
    assert code == -signal.SIGKILL
    killed_at = gpt_process.logged_steps(workdir)[-1]["step"]
    assert killed_at < STEPS, "the run finished before it could be killed"
    time.sleep(2)  # a scheduler's delay before the relaunch: goodput's recovery
    proc = _run_to_end(workdir)
    # It resumed from the last checkpoint before the kill, not from scratch.
    resumed_from = (killed_at // EVERY) * EVERY
    assert f"starting at step {resumed_from}" in proc.stdout or \
        f"starting at step {resumed_from - EVERY}" in proc.stdout, proc.stdout[:500]
    _assert_identical_runs(workdir, uninterrupted)
    # Goodput (zoo.train.goodput) counts the steps done again and the time between the runs.
    killed, whole = _goodput(workdir), _goodput(uninterrupted)
    assert (killed["runs"], whole["runs"]) == (2, 1)
    assert killed["lost_s"]["wasted"] > 0 and killed["lost_s"]["recovery"] > 2, killed
    assert whole["lost_s"]["wasted"] == whole["lost_s"]["recovery"] == 0, whole
    for account in (killed, whole):
        assert all(account["lost_s"][b] > 0 for b in ("startup", "compile", "checkpoint", "eval"))
        assert account["wall_s"] == pytest.approx(account["productive_s"]
                                                  + sum(account["lost_s"].values()))
        assert 0 < account["goodput"] < 1
    assert killed["lost_s"]["restore"] > 0 and whole["lost_s"]["restore"] == 0
    assert re.search(r"^goodput \d+\.\d% of \d+ s: .*wasted", proc.stdout, re.M), proc.stdout
    # summary.json: the same final eval bit for bit, and the whole run's account beside it.
    killed_summary, whole_summary = _summary(workdir), _summary(uninterrupted)
    for summary, account in ((killed_summary, killed), (whole_summary, whole)):
        assert summary.pop("goodput") == {k: account[k] for k in (
            "wall_s", "productive_s", "goodput", "lost_s", "runs")}
    assert killed_summary == whole_summary and "step" in killed_summary


@pytest.mark.slow
def test_sigterm_saves_exits_zero_and_resumes_bit_identical(uninterrupted, tmp_path):
    workdir = str(tmp_path)
    code, out, err = _start_and_signal(workdir, signal.SIGTERM, after_step=EVERY + 30)
    assert code == 0, err[-3000:]
    stopped_at = gpt_process.logged_steps(workdir)[-1]["step"]
    assert stopped_at < STEPS, "the run finished before SIGTERM arrived"
    assert f"SIGTERM: saved step {stopped_at}" in out
    manager = ocp.CheckpointManager(os.path.join(workdir, "checkpoints"))
    assert manager.latest_step() == stopped_at  # saved at the step it stopped, not before
    manager.close()
    proc = _run_to_end(workdir)
    assert f"starting at step {stopped_at}" in proc.stdout
    _assert_identical_runs(workdir, uninterrupted)
