"""The hang watchdog (zoo/train/hosts/watchdog.py): its rules on a fake clock, its config errors,
and real train.py processes whose step or checkpoint save hangs (tests/train/fault_launcher.py):
each exits 1 with every thread's stack, and the relaunch resumes as if nothing had happened."""

import os
import shutil
import subprocess
import sys
import time

import ml_collections
import pytest

from tests.train import gpt_process
from zoo.errors import ConfigError
from zoo.train.hosts import watchdog as watchdog_lib

LAUNCHER = os.path.join(gpt_process.ROOT, "tests", "train", "fault_launcher.py")
HANG_MARKER = "fault_hanging"  # fault_launcher.HANG_MARKER


def _cfg(factor=20.0, min_s=300.0, limit_s=3600.0):
    return ml_collections.ConfigDict(dict(factor=factor, min_s=min_s, limit_s=limit_s))


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _watchdog(cfg):
    clock = _Clock()
    dog = watchdog_lib.Watchdog(cfg, clock=clock, on_hang=pytest.fail)
    dog.close()  # the rules are asked directly; no thread
    return dog, clock


def _run_phases(dog, clock, kind, seconds, count, first=1):
    for step in range(first, first + count):
        with dog.phase(kind, step):
            clock.now += seconds


def test_factor_rule_waits_for_a_median_and_ignores_the_first_steps_compile():
    dog, clock = _watchdog(_cfg(factor=10, min_s=1, limit_s=0))
    with dog.phase("step", 1):
        clock.now += 500.0  # the first step's compile: nothing to compare it with yet
        assert dog.overdue() is None
    _run_phases(dog, clock, "step", 0.5, watchdog_lib.MIN_SAMPLES - 1, first=2)
    assert dog.overdue() is None
    with dog.phase("step", 6):
        clock.now += 4.9  # median 0.5 s (the compile is one of 5): 9.8 x, not yet
        assert dog.overdue() is None
        clock.now += 0.2
        reason = dog.overdue()
    assert reason.startswith("step 6 has run 5.1 s, 10 x the median 0.5 s of the last 5 steps")
    assert "config.train.watchdog.factor=10" in reason


def test_min_s_floor_and_kinds_keep_their_own_medians():
    dog, clock = _watchdog(_cfg(factor=10, min_s=60, limit_s=0))
    _run_phases(dog, clock, "step", 0.01, 10)
    _run_phases(dog, clock, "save", 5.0, 5)
    with dog.phase("step", 11):
        clock.now += 59.0  # 5,900 x the median, under the floor
        assert dog.overdue() is None
        clock.now += 2.0
        assert dog.overdue().startswith("step 11 has run 61.0 s")
    with dog.phase("save", 6):
        clock.now += 49.0  # a save is judged against saves (median 5 s), not steps
        assert dog.overdue() is None
        clock.now += 12.0
        assert "x the median 5 s of the last 5 saves" in dog.overdue()


def test_absolute_limit_applies_from_the_first_phase():
    dog, clock = _watchdog(_cfg(factor=0, min_s=0, limit_s=100))
    with dog.phase("final save", 40):
        clock.now += 100.0
        assert dog.overdue() is None
        clock.now += 0.5
        assert dog.overdue() == ("final save 40 has run 100.5 s, past "
                                 "config.train.watchdog.limit_s=100")
    assert dog.overdue() is None  # between phases nothing is overdue


def test_defaults_never_fire_on_a_healthy_run():
    from configs import common
    dog, clock = _watchdog(common.train_config(10).watchdog)
    with dog.phase("step", 1):
        clock.now += 1800.0  # a half-hour first compile
        assert dog.overdue() is None
    _run_phases(dog, clock, "step", 2.0, 20, first=2)
    with dog.phase("step", 22):
        clock.now += 290.0  # a 145 x slower step (a host hiccup) is still under min_s
        assert dog.overdue() is None


@pytest.mark.parametrize("key, value, wanted", [
    ("factor", 0.5, "must be > 1"), ("factor", "x", "must be a number >= 0"),
    ("min_s", -1, "must be a number >= 0"), ("limit_s", None, "must be a number >= 0"),
])
def test_bad_values_name_their_key(key, value, wanted):
    bad = dict(_cfg().to_dict(), **{key: value})
    with pytest.raises(ConfigError, match=rf"config\.train\.watchdog\.{key}=.*{wanted}"):
        watchdog_lib.validate(bad)


def test_a_real_thread_fires_while_the_main_thread_is_blocked():
    fired = []
    dog = watchdog_lib.Watchdog(_cfg(factor=0, min_s=0, limit_s=0.2), poll_s=0.02,
                                on_hang=fired.append)
    started = time.monotonic()
    with dog.phase("step", 1):
        while not fired and time.monotonic() - started < 10:
            time.sleep(0.01)  # the main thread is busy; the watchdog's thread notices
    dog.close()
    assert fired and fired[0].startswith("step 1 has run 0.")


# A phase stuck in native code that keeps the GIL: ctypes.PyDLL calls libc's sleep without
# releasing it, so no Python thread (the watchdog's own included) runs until it returns.
_GIL_HOLDING_HANG = """
import ctypes, ml_collections
from zoo.train.hosts import watchdog
dog = watchdog.Watchdog(ml_collections.ConfigDict(dict(factor=0, min_s=0, limit_s=1)))
with dog.phase("step", 3):
    ctypes.PyDLL(None).sleep(120)
print("the hang ended by itself")
"""


@pytest.mark.slow
def test_a_hang_that_holds_the_gil_is_reported_and_exits():
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _GIL_HOLDING_HANG], cwd=gpt_process.ROOT,
                          capture_output=True, text=True, timeout=90)
    took = time.monotonic() - started
    # The Python thread never got the GIL (before the backstop, the process slept the whole
    # 120 s); faulthandler's C thread fired at limit_s + grace.
    assert proc.returncode == watchdog_lib.HANG_EXIT_CODE, proc.stderr[-2000:]
    assert "Timeout (0:00:06)!" in proc.stderr, proc.stderr[-2000:]
    assert 'File "<string>", line 6' in proc.stderr  # the hung line, in the main thread's stack
    assert "ended by itself" not in proc.stdout
    assert took < 1 + watchdog_lib.BACKSTOP_GRACE_S + 30, took  # start-up and a loaded box
    print(f"GIL-holding hang reported {took:.1f} s after start (limit_s=1)")


_QUICK_PHASES_THEN_IDLE = """
import time, ml_collections
from zoo.train.hosts import watchdog
dog = watchdog.Watchdog(ml_collections.ConfigDict(dict(factor=0, min_s=0, limit_s=0.5)))
for step in range(3):
    with dog.phase("step", step):
        pass
time.sleep(0.5 + watchdog.BACKSTOP_GRACE_S + 1)  # between phases: nothing is armed
print("alive")
"""


@pytest.mark.slow
def test_a_finished_phase_disarms_the_backstop():
    proc = subprocess.run([sys.executable, "-c", _QUICK_PHASES_THEN_IDLE], cwd=gpt_process.ROOT,
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0 and proc.stdout.strip() == "alive", proc.stderr[-2000:]


# Real processes: the acceptance tier (three tiny-GPT runs of a few seconds each, plus compile).
STEPS, EVERY = 40, 10
# A healthy tiny-GPT step here takes ~10 ms; a hang is declared at 5 x the median and 3 s.
WATCHDOG = ["--config.train.watchdog.factor=5", "--config.train.watchdog.min_s=3",
            "--config.train.watchdog.limit_s=300"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("uninterrupted"))
    gpt_process.run(workdir, STEPS, EVERY)
    return workdir


def _hang(workdir, fault, every=EVERY):
    argv = gpt_process.command(workdir, STEPS, every,
                               [LAUNCHER, f"--fault={fault}"]) + WATCHDOG
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=gpt_process.ROOT, env=gpt_process.env(),
                          capture_output=True, text=True, timeout=300)
    hung_at = os.path.getmtime(os.path.join(workdir, HANG_MARKER))
    # The marker is written as the hang begins: the watchdog's detection time from there.
    return proc, time.time() - hung_at, time.monotonic() - started


@pytest.mark.acceptance
def test_hung_step_dumps_every_stack_exits_and_the_relaunch_resumes(uninterrupted, tmp_path):
    workdir = str(tmp_path)
    proc, detected_s, _ = _hang(workdir, "hang_step:25")
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = next(x for x in proc.stderr.splitlines() if x.startswith("error: hang:"))
    assert line.startswith("error: hang: step 25 has run "), line
    assert "x the median" in line and "config.train.watchdog.factor=5" in line
    # Every thread's stack, the main thread's ending in the hung step.
    assert proc.stderr.count("Thread 0x") + proc.stderr.count("Current thread 0x") >= 2
    assert 'fault_launcher.py", line' in proc.stderr and "in hanging" in proc.stderr
    assert detected_s < 3 + 10, detected_s  # min_s, plus a loaded 2-core box's slack
    print(f"hung step detected after {detected_s:.1f} s")
    relaunched = gpt_process.run(workdir, STEPS, EVERY)
    assert f"starting at step 20 of {STEPS}" in relaunched.stdout
    gpt_process.assert_identical_runs(workdir, uninterrupted, STEPS)


@pytest.mark.acceptance
def test_hung_checkpoint_commit_is_caught_at_the_next_save(tmp_path):
    # Saves every 2 steps: 5 healthy saves give the median before step 12's commit hangs; the
    # next save (step 14) waits on it.
    workdir = str(tmp_path)
    proc, detected_s, _ = _hang(workdir, "hang_commit:12", every=2)
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = next(x for x in proc.stderr.splitlines() if x.startswith("error: hang:"))
    assert line.startswith("error: hang: save 14 has run "), line
    assert "saves (config.train.watchdog.factor=5" in line
    assert "wait_until_finished" in proc.stderr  # the main thread's stack: waiting on step 12
    print(f"hung save detected {detected_s:.1f} s after the commit hung")
    relaunched = gpt_process.run(workdir, STEPS, 2)
    assert f"starting at step 10 of {STEPS}" in relaunched.stdout


@pytest.mark.acceptance
def test_a_hang_before_the_loop_is_caught_by_the_limit(uninterrupted, tmp_path):
    # A workdir with checkpoints: the relaunch's restore (a phase before the loop, with no
    # median to judge it by) hangs; limit_s alone catches it. Before, nothing watched it.
    workdir = str(tmp_path / "run")
    shutil.copytree(uninterrupted, workdir)
    argv = gpt_process.command(workdir, STEPS, EVERY, [LAUNCHER, "--fault=hang_restore:0"])
    argv += ["--config.train.watchdog.factor=0", "--config.train.watchdog.limit_s=20"]
    proc = subprocess.run(argv, cwd=gpt_process.ROOT, env=gpt_process.env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = next(x for x in proc.stderr.splitlines() if x.startswith("error: hang:"))
    assert line.startswith("error: hang: restore has run 2"), line
    assert "past config.train.watchdog.limit_s=20" in line
    assert "in restore" in proc.stderr  # the main thread's stack ends in the hung restore
    assert time.time() - os.path.getmtime(os.path.join(workdir, HANG_MARKER)) < 20 + 15
