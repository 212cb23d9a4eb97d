"""Restoring from damaged checkpoints: checksums catch silent corruption, an unreadable latest
checkpoint falls back to the previous one (on a real process, with losses identical to an
uninterrupted run), a checkpoint of another model is refused at once, and a data position
saved by another process count is re-sharded only when it is global."""

import glob
import json
import os

import numpy as np
import pytest

from tests.train import gpt_process
from tests.train.saved_states import file_tree, save_steps, small_state
from zoo.checkpoints import checksums
from zoo.checkpoints.checkpoint import (
    Checkpointer,
    CheckpointMismatchError,
    CorruptCheckpointError,
    latest_param_shapes,
)
from zoo.checkpoints.data_position import DataReshardError, restore_iterator


def _largest_array_file(workdir, step):
    files = glob.glob(os.path.join(workdir, "checkpoints", str(step), "state", "**", "d", "*"),
                      recursive=True)
    return max(files, key=os.path.getsize)


def _flip_bytes(path, count=16):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        data = f.read(count)
        f.seek(os.path.getsize(path) // 2)
        f.write(bytes(b ^ 0xFF for b in data))


def test_checksums_name_flipped_resized_and_missing_files(tmp_path):
    for name, content in (("a.bin", b"x" * 100), ("sub/b.bin", b"y" * 10), ("c.bin", b"z")):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(content)
    assert checksums.problems(str(tmp_path)) is None  # nothing recorded yet
    checksums.write(str(tmp_path))
    assert checksums.problems(str(tmp_path)) == []
    _flip_bytes(tmp_path / "a.bin", count=1)
    (tmp_path / "sub/b.bin").write_bytes(b"y" * 9)
    (tmp_path / "c.bin").unlink()
    found = checksums.problems(str(tmp_path))
    assert found == ["a.bin has a different CRC-32 than when it was written",
                     "c.bin is missing", "sub/b.bin has 9 bytes, 10 written"]


def test_the_processes_of_a_restore_check_the_files_between_them(tmp_path, monkeypatch):
    """Each of N processes CRCs only its share (the files it wrote, the rest spread by name),
    so a pod reads the checkpoint once between its hosts. Before: every process read it all."""
    save_steps(str(tmp_path))
    directory = str(tmp_path / "checkpoints" / "4")
    real, read = checksums._crc32, []
    monkeypatch.setattr(checksums, "_crc32", lambda path: read.append(str(path)) or real(path))
    every = sorted(json.loads((tmp_path / "checkpoints" / "4" / checksums.FILENAME).read_text()))
    shares = []
    for index in range(3):
        read.clear()
        assert checksums.problems(directory, (index, 3)) == []
        shares.append(sorted(os.path.relpath(p, directory) for p in read))
    assert sorted(sum(shares, [])) == every  # each file once, by one process
    assert all(checksums.owner(rel, 3) == 0 for rel in every if "ocdbt.process_0/" in rel)
    victim = next(rel for rel in every if rel.startswith("state/") and checksums.owner(rel, 3))
    _flip_bytes(os.path.join(directory, victim), count=1)
    found = [checksums.problems(directory, (i, 3)) for i in range(3)]
    assert [bool(f) for f in found] == [i == checksums.owner(victim, 3) for i in range(3)]


def test_every_async_save_commits_its_checksums(tmp_path):
    save_steps(str(tmp_path))
    for step in (2, 4):
        directory = tmp_path / "checkpoints" / str(step)
        record = json.loads((directory / checksums.FILENAME).read_text())
        assert any(name.startswith("state/") for name in record)
        assert checksums.problems(str(directory)) == []


@pytest.mark.parametrize("damage", ["flipped bytes", "truncated file", "garbled metadata"])
def test_unreadable_latest_falls_back_and_is_set_aside(tmp_path, damage, capsys):
    workdir = str(tmp_path)
    save_steps(workdir)
    if damage == "flipped bytes":  # reads fine: only the checksums can tell
        _flip_bytes(_largest_array_file(workdir, 4))
    elif damage == "truncated file":  # without checksums: tensorstore's own read error
        os.remove(os.path.join(workdir, "checkpoints", "4", checksums.FILENAME))
        path = _largest_array_file(workdir, 4)
        os.truncate(path, os.path.getsize(path) // 2)
    else:
        os.remove(os.path.join(workdir, "checkpoints", "4", checksums.FILENAME))
        with open(os.path.join(workdir, "checkpoints", "4", "state", "_METADATA"), "w") as f:
            f.write("{not json")
    damaged_files = file_tree(os.path.join(workdir, "checkpoints", "4"))
    checkpointer = Checkpointer(workdir)
    restored = checkpointer.restore(small_state(), quarantine=True)
    np.testing.assert_array_equal(restored.params["w"], small_state(2.0).params["w"])
    out = capsys.readouterr().out
    assert "checkpoint step 4 in" in out and "is unreadable" in out
    assert "resumed from step 2, the newest readable checkpoint; moved step(s) [4]" in out
    # Set aside whole, not deleted, and out of the way of saving step 4 again.
    assert file_tree(os.path.join(workdir, "checkpoints_corrupt", "4")) == damaged_files
    assert checkpointer.latest_step() == 2
    checkpointer.save(4, small_state(40.0))
    checkpointer.close()
    again = Checkpointer(workdir).restore(small_state())
    np.testing.assert_array_equal(again.params["w"], small_state(40.0).params["w"])


def test_a_step_deleted_after_the_listing_is_not_damage(tmp_path, monkeypatch, capsys):
    """The listing names step 4, then its directory goes (another job's retention, a user's
    rm) before its files are read: the files were not damaged, so nothing is set aside and the
    run resumes from step 2. Before: counted as damage, and moving the vanished directory to
    checkpoints_corrupt/ failed, stopping the run."""
    import shutil

    workdir = str(tmp_path)
    save_steps(workdir)
    checkpointer = Checkpointer(workdir)
    steps = checkpointer.agreed_steps()  # the listing, taken while step 4 was there
    assert steps[0] == 4
    shutil.rmtree(os.path.join(workdir, "checkpoints", "4"))
    restored = checkpointer.restore(small_state(), quarantine=True, agreed=steps)
    np.testing.assert_array_equal(restored.params["w"], small_state(2.0).params["w"])
    out = capsys.readouterr().out
    assert "checkpoint step 4 in" in out and "was deleted after the listing" in out, out
    assert "resumed from step 2, the newest readable checkpoint; step(s) [4] were gone" in out
    assert not os.path.exists(os.path.join(workdir, "checkpoints_corrupt"))


def test_without_quarantine_the_damaged_step_stays_in_place(tmp_path):
    workdir = str(tmp_path)
    save_steps(workdir)
    _flip_bytes(_largest_array_file(workdir, 4))
    restored = Checkpointer(workdir).restore(small_state())  # e.g. eval.py beside a training run
    np.testing.assert_array_equal(restored.params["b"], small_state(2.0).params["b"])
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "4"))
    assert not os.path.exists(os.path.join(workdir, "checkpoints_corrupt"))


def test_no_readable_checkpoint_names_each_and_moves_nothing(tmp_path):
    workdir = str(tmp_path)
    save_steps(workdir)
    for step in (2, 4):
        _flip_bytes(_largest_array_file(workdir, step))
    before = file_tree(workdir)
    with pytest.raises(CorruptCheckpointError,
                       match=r"no readable checkpoint .*step 4: .*CRC-32.*step 2: .*CRC-32.*"
                             r"Nothing was moved"):
        Checkpointer(workdir).restore(small_state(), quarantine=True)
    assert file_tree(workdir) == before


def test_checkpoint_of_another_model_is_refused_not_skipped(tmp_path):
    workdir = str(tmp_path)
    save_steps(workdir)
    before = file_tree(workdir)
    with pytest.raises(CheckpointMismatchError,
                       match=r"step 4 .* another model or config .*\['w'\]: checkpoint "
                             r"\(32, 32\), this model \(16, 16\).*new --workdir"):
        Checkpointer(workdir).restore(small_state(width=16), quarantine=True)
    assert file_tree(workdir) == before  # the older step was not tried, nothing was moved


def test_a_train_state_from_another_zoo_version_is_named(tmp_path):
    old = small_state(2.0)
    # The train state before it kept loss statistics: the same arrays, one field fewer.
    saver = Checkpointer(str(tmp_path))
    saver.save(2, {"step": old.step, "params": old.params, "opt_state": old.opt_state,
                   "rng": old.rng})
    saver.close()
    with pytest.raises(CheckpointMismatchError,
                       match=r"fields \['opt_state', 'params', 'rng', 'step'\], and this version "
                             r"of zoo keeps \['loss_stats', .*--config\.train\.init_from="):
        Checkpointer(str(tmp_path)).restore(small_state(), quarantine=True)


class _Position:
    def __init__(self):
        self.state = None

    def set_state(self, state):
        self.state = state


def _write_positions(directory, positions):
    os.makedirs(directory)
    for index, position in enumerate(positions):
        with open(os.path.join(directory, f"process_{index}-of-{len(positions)}.json"), "w") as f:
            json.dump(position, f)


def test_a_global_data_position_resumes_under_another_process_count(tmp_path):
    _write_positions(tmp_path / "data", [{"next_index": 7}, {"next_index": 7}])
    iterator = _Position()
    restore_iterator(str(tmp_path / "data"), iterator)  # this test is 1 process of 1
    assert iterator.state == {"next_index": 7}


def test_per_process_data_positions_cannot_be_resharded(tmp_path):
    _write_positions(tmp_path / "data", [{"next_index": 7}, {"next_index": 9}])
    with pytest.raises(DataReshardError, match=r"differ between the 2 processes.*"
                                               r"resume with 2 processes \(JAX_NUM_PROCESSES=2\)"):
        restore_iterator(str(tmp_path / "data"), _Position())


# --- on a real process -----------------------------------------------------------------------

STEPS, EVERY = 60, 20


@pytest.mark.acceptance  # three real train.py runs; the fall-back itself is proven in-process above
def test_a_run_resumes_from_the_checkpoint_before_a_corrupted_one(tmp_path):
    uninterrupted, workdir = str(tmp_path / "uninterrupted"), str(tmp_path / "run")
    gpt_process.run(uninterrupted, STEPS, EVERY)
    gpt_process.run(workdir, 2 * EVERY, EVERY)
    _flip_bytes(_largest_array_file(workdir, 2 * EVERY))
    out = gpt_process.run(workdir, STEPS, EVERY).stdout
    assert f"checkpoint step {2 * EVERY} in {workdir}/checkpoints is unreadable" in out
    assert f"starting at step {EVERY} of {STEPS}" in out
    assert os.path.isdir(os.path.join(workdir, "checkpoints_corrupt", str(2 * EVERY)))
    gpt_process.assert_identical_runs(workdir, uninterrupted, STEPS)


def test_latest_param_shapes_read_the_metadata_and_make_no_directory(tmp_path):
    """What a fine-tuning task checks before restoring (a GPT's vocabulary and positions) is
    read here, from the latest step's metadata: no workdir made for a mistyped path, {} for a
    run without checkpoints or with unreadable metadata."""
    assert latest_param_shapes(str(tmp_path / "typo")) == {}
    assert not (tmp_path / "typo").exists()
    save_steps(str(tmp_path / "run"), steps=(2,))
    assert latest_param_shapes(str(tmp_path / "run")) == {"['b']": (32,), "['w']": (32, 32)}
    with open(tmp_path / "run" / "checkpoints" / "2" / "state" / "_METADATA", "w") as f:
        f.write("{not json")  # as test_unreadable_latest_falls_back_and_is_set_aside garbles it
    assert latest_param_shapes(str(tmp_path / "run")) == {}
