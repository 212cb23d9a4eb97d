"""Faults while a checkpoint is being written, on real processes (CPU): a kill mid-save and a
full disk leave the last complete checkpoint in charge, and resuming from it equals never having
stopped, bit for bit. Faults are injected by tests/train/fault_launcher.py, never by zoo/."""

import errno
import os
import shutil
import signal
import subprocess
import time

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests.train import gpt_process
from zoo.checkpoints import checkpoint as checkpoint_lib
from zoo.checkpoints.checkpoint import Checkpointer, CheckpointWriteError

LAUNCHER = os.path.join(gpt_process.ROOT, "tests", "train", "fault_launcher.py")
STEPS, EVERY, FAULT_STEP = 200, 50, 100
HANG_MARKER = "fault_hanging"  # fault_launcher.HANG_MARKER


def _script(fault):
    return [LAUNCHER, f"--fault={fault}"]


def _run_to_end(workdir):
    return gpt_process.run(workdir, STEPS, EVERY)


def _committed_steps(workdir):
    """The steps orbax itself counts as checkpoints (what a restart chooses from)."""
    manager = ocp.CheckpointManager(os.path.join(workdir, "checkpoints"),
                                    options=ocp.CheckpointManagerOptions(read_only=True))
    steps = sorted(manager.all_steps())
    manager.close()
    return steps


def _partial_dirs(workdir):
    return sorted(n for n in os.listdir(os.path.join(workdir, "checkpoints"))
                  if ".orbax-checkpoint-tmp" in n)


def _assert_identical_runs(resumed, uninterrupted):
    gpt_process.assert_identical_runs(resumed, uninterrupted, STEPS)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("uninterrupted"))
    _run_to_end(workdir)
    assert _committed_steps(workdir) == [100, 150, 200]
    return workdir


@pytest.mark.acceptance  # two 200-step real processes beside the uninterrupted one
def test_sigkill_during_async_save_resumes_from_last_complete_checkpoint(uninterrupted,
                                                                         tmp_path):
    workdir = str(tmp_path)
    partial = os.path.join(workdir, "checkpoints", f"{FAULT_STEP}.orbax-checkpoint-tmp")
    # Files, not pipes: a process blocked on a full pipe would never reach the save.
    log = tmp_path / "hung.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            gpt_process.command(workdir, STEPS, EVERY, _script(f"hang_commit:{FAULT_STEP}")),
            cwd=gpt_process.ROOT, env=gpt_process.env(), stdout=out, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while not os.path.exists(os.path.join(workdir, HANG_MARKER)):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.time() < deadline, "the save of step 100 never reached its commit"
        time.sleep(0.01)

    def assert_mid_save():
        # Every file of step 100 is written (its state/ and data/ items are complete) but the
        # step directory is not committed: orbax has not renamed it or written its marker.
        assert os.path.isdir(os.path.join(partial, "state"))
        assert os.path.isfile(os.path.join(partial, "data", "process_0-of-1.json"))
        assert not os.path.exists(os.path.join(partial, "commit_success.txt"))
        assert not os.path.exists(os.path.join(workdir, "checkpoints", str(FAULT_STEP)))
        assert _committed_steps(workdir) == [FAULT_STEP - EVERY]

    assert_mid_save()  # at kill time
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert_mid_save()  # what the restart finds
    killed_at = gpt_process.logged_steps(workdir)[-1]["step"]
    assert FAULT_STEP <= killed_at < STEPS

    restarted = _run_to_end(workdir)
    assert f"starting at step {FAULT_STEP - EVERY} of {STEPS}" in restarted.stdout
    # Step 100 was saved again over the partial directory, and equals the uninterrupted save.
    assert _partial_dirs(workdir) == []
    assert _committed_steps(workdir) == [100, 150, 200]
    gpt_process.assert_same_state(gpt_process.saved_state(workdir, FAULT_STEP),
                       gpt_process.saved_state(uninterrupted, FAULT_STEP))
    _assert_identical_runs(workdir, uninterrupted)


@pytest.mark.acceptance
def test_full_disk_mid_write_reports_clearly_and_resumes_identically(uninterrupted, tmp_path):
    workdir = str(tmp_path)
    directory = os.path.join(workdir, "checkpoints")
    failed = gpt_process.run(workdir, STEPS, EVERY, _script(f"file_limit:{FAULT_STEP}"),
                             check=False)
    assert failed.returncode == 1, failed.stderr[-3000:]
    # The async write of step 100 failed in the background; the error surfaced at the next
    # save (step 150), naming the step that failed, not the one being saved.
    assert gpt_process.logged_steps(workdir)[-1]["step"] == FAULT_STEP + EVERY
    last_line = failed.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: could not write "
                                f"checkpoint step {FAULT_STEP} to {directory}: "), last_line
    for part in ("a file grew past the file-size limit ([Errno 27] File too large)",
                 f"The previous checkpoint, step {FAULT_STEP - EVERY}, is intact.",
                 "Raise the file-size limit", f"or move {workdir} to a disk with room",
                 "--workdir", "rerun the same command"):
        assert part in last_line, (part, last_line)
    # No trace of step 100 that could pass for a checkpoint (nor its partial files' space).
    assert _committed_steps(workdir) == [FAULT_STEP - EVERY]
    assert _partial_dirs(workdir) == []
    assert not os.path.exists(os.path.join(directory, str(FAULT_STEP)))

    restarted = _run_to_end(workdir)  # the disk has room again
    assert f"starting at step {FAULT_STEP - EVERY} of {STEPS}" in restarted.stdout
    _assert_identical_runs(workdir, uninterrupted)


def _small_state(seed):
    return {"w": jnp.asarray(np.random.default_rng(seed).normal(size=1000), jnp.float32)}


# Orbax's other writes of the failed save complete onto its closed event loop ("Event loop is
# closed"); that is its noise about the failure this test provokes.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_enospc_in_background_write_surfaces_at_close_with_the_failed_step(tmp_path,
                                                                            monkeypatch):
    checkpointer = Checkpointer(str(tmp_path))
    checkpointer.save(1, _small_state(1))
    real_open = open
    failing = f"{os.sep}2.orbax-checkpoint-tmp"

    def full_disk_open(file, mode="r", *args, **kwargs):
        # Orbax writes step 2's metadata and data-iterator files through open() in its
        # background threads; on a full disk those writes fail like this. Not its array
        # metadata: orbax 0.12.8 gathers that write with tensorstore's array writes and, when
        # it fails, abandons them unjoined; this fake disk is full for Python only, so they
        # went on writing (and made the directory again) while close() removed it
        # ("Directory not empty: 'd'"). A real full disk fails them too;
        # test_a_removal_racing_an_abandoned_write_keeps_the_write_error covers what is left.
        if (failing in str(file) and "array_metadatas" not in str(file)
                and any(m in mode for m in "wax")):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", full_disk_open)
    checkpointer.save(2, _small_state(2))  # returns: the write runs in the background
    with pytest.raises(CheckpointWriteError) as raised:
        checkpointer.close()
    monkeypatch.undo()
    error = raised.value
    assert (error.step, error.previous_step, error.errno) == (2, 1, errno.ENOSPC)
    assert str(error).startswith(
        f"could not write checkpoint step 2 to {checkpointer.directory}: no space left on "
        "device ([Errno 28] No space left on device). The previous checkpoint, step 1, is "
        "intact. Free space on that disk, or move ")
    assert sorted(os.listdir(checkpointer.directory)) == ["1"]  # partial step 2 removed
    restored = Checkpointer(str(tmp_path))
    assert restored.latest_step() == 1
    np.testing.assert_array_equal(gpt_process.saved_state(str(tmp_path), 1)["w"], _small_state(1)["w"])
    restored.close()


def test_a_removal_racing_an_abandoned_write_keeps_the_write_error(tmp_path, monkeypatch,
                                                                   capsys):
    # The partial directory of a failed save may still be written into by the writes orbax
    # abandoned with it; its removal then fails, and that must not replace the error saying
    # which step failed and why.
    checkpointer = Checkpointer(str(tmp_path))
    checkpointer.save(1, _small_state(1))
    checkpointer._finish_pending()
    partial = os.path.join(checkpointer.directory, "2.orbax-checkpoint-tmp")
    os.makedirs(os.path.join(partial, "state"))
    checkpointer._pending = 2  # step 2's save is in flight, and its write failed

    def failed_write():
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), partial)

    def still_written(path, *args, **kwargs):
        raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), "d")

    monkeypatch.setattr(checkpointer._manager, "wait_until_finished", failed_write)
    monkeypatch.setattr(shutil, "rmtree", still_written)
    with pytest.raises(CheckpointWriteError) as raised:  # not the removal's OSError
        checkpointer.close()
    assert (raised.value.step, raised.value.previous_step) == (2, 1)
    assert raised.value.errno == errno.ENOSPC
    out = capsys.readouterr().out
    assert f"could not remove {partial} of the failed save of step 2" in out, out
    assert "Directory not empty" in out


def test_preflight_refuses_a_save_that_cannot_fit_before_writing_anything(tmp_path,
                                                                          monkeypatch):
    checkpointer = Checkpointer(str(tmp_path))
    checkpointer.save(1, _small_state(1))
    checkpointer._finish_pending()
    usage = shutil.disk_usage(checkpointer.directory)
    # 1000 float32 need 4,000 bytes; the disk reports 1,000 free.
    monkeypatch.setattr(checkpoint_lib.shutil, "disk_usage",
                        lambda path: usage._replace(free=1000))
    with pytest.raises(CheckpointWriteError) as raised:
        checkpointer.save(2, _small_state(2))
    assert (raised.value.step, raised.value.previous_step) == (2, 1)
    assert raised.value.errno == errno.ENOSPC
    assert str(raised.value).startswith(
        f"not enough free space to save checkpoint step 2 in {checkpointer.directory}: it "
        "needs about 3.9 KiB and 1,000 bytes are free. The previous checkpoint, step 1, is "
        "intact. Free space on that disk, or move ")
    assert sorted(os.listdir(checkpointer.directory)) == ["1"]  # nothing of step 2 written
    monkeypatch.setattr(checkpoint_lib.shutil, "disk_usage",
                        lambda path: usage._replace(free=4000))
    checkpointer.save(2, _small_state(2))  # exactly enough room: saved
    checkpointer.close()
    assert _committed_steps(str(tmp_path)) == [1, 2]
