"""Preparation piece by piece: the same bytes for any number of workers and processes, a killed
preparation that leaves no shard looking complete and is finished by a rerun doing only the
missing shards, and a directory that refuses a second, different preparation."""

import filecmp
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from zoo.data.pipelines import pretraining as pt
from zoo.data.pipelines.pretraining import examples
from zoo.data.pipelines.pretraining import store
from zoo.data.readers import corpus_pieces, text_files
from zoo import paths
from zoo.errors import DataError

SETTINGS = examples.Settings(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2,
                             seed=3)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))


@pytest.fixture(scope="module")
def text_corpus(corpus, tmp_path_factory):
    directory = tmp_path_factory.mktemp("corpus")
    docs = corpus["train"]
    half = len(docs) // 2
    files = [str(directory / "a.txt"), str(directory / "b.txt")]
    text_files.write_text_corpus(files[0], docs[:half])
    text_files.write_text_corpus(files[1], docs[half:])
    return files


def _pieces(files):
    return corpus_pieces.plan_text(files, sum(os.path.getsize(f) for f in files) // 6 + 1)


@pytest.fixture(scope="module")
def reference(text_corpus, tok, tmp_path_factory):
    """One process, one worker."""
    directory = tmp_path_factory.mktemp("reference") / "prepared"
    pt.prepare_pieces(_pieces(text_corpus), tok, str(directory), SETTINGS)
    return directory


def _same_files(a, b):
    names = sorted(os.listdir(a))
    assert names == sorted(os.listdir(b))
    match, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    assert not mismatch and not errors, (mismatch, errors)


def test_the_shards_are_the_pieces_examples(reference, text_corpus, tok):
    source = pt.PretrainingSource(str(reference))
    assert len(source.manifest["shard_rows"]) == 6
    # Shard 2 is exactly what shard_examples makes from piece 2 alone.
    piece = _pieces(text_corpus)[2]
    docs = examples.encode_documents(tok, list(corpus_pieces.read_piece(piece)))
    want = examples.shard_examples(docs, SETTINGS, 2, tok, examples.word_start_table(tok))
    lo = int(np.sum(source.manifest["shard_rows"][:2]))
    rows = np.arange(lo, lo + len(want["input_ids"]))
    got = source.read(rows)
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v)
    # The batched read equals the row-by-row one, across shard boundaries too.
    some = np.array([0, len(source) - 1, lo, lo - 1, 5, lo])
    stacked = [source[int(i)] for i in some]
    for k, v in source.read(some).items():
        np.testing.assert_array_equal(v, np.stack([r[k] for r in stacked]))


def test_two_workers_write_the_same_bytes(reference, text_corpus, tok, tmp_path):
    pt.prepare_pieces(_pieces(text_corpus), tok, str(tmp_path / "w2"), SETTINGS, workers=2)
    _same_files(reference, tmp_path / "w2")


def test_two_processes_share_the_shards_and_write_the_same_bytes(reference, text_corpus, tok,
                                                                 tmp_path):
    # Two "hosts" as threads of this process; real processes:
    # tests/commands/test_prepare_command.py.
    made, directory = {}, str(tmp_path / "shared")
    real = pt._make_shard

    def run(index):
        pt.prepare_pieces(_pieces(text_corpus), tok, directory, SETTINGS, process_index=index,
                          process_count=2, poll_seconds=0.05)

    def record(task):
        made[task[0]] = threading.current_thread().name
        return real(task)

    pt._make_shard, thread = record, threading.Thread(target=run, args=(1,), name="host1")
    try:
        thread.start()
        run(0)
        thread.join()
    finally:
        pt._make_shard = real
    host0 = threading.current_thread().name
    assert made == {0: host0, 1: "host1", 2: host0, 3: "host1", 4: host0, 5: "host1"}
    _same_files(reference, directory)


_KILLED_RUN = textwrap.dedent("""
    import sys, time
    from zoo.data.pipelines import pretraining as pt
    from zoo.data.pipelines.pretraining import examples
    from zoo.data.readers import corpus_pieces
    from zoo.data.tokenizers import base
    real = pt._make_shard
    def slow(task):  # time for the test to kill this process between shards
        result = real(task)
        print("made", task[0], flush=True)
        time.sleep(0.3)
        return result
    pt._make_shard = slow
    files, directory, model = sys.argv[1:3], sys.argv[3], sys.argv[4]
    pieces = corpus_pieces.plan_text(files, sum(__import__("os").path.getsize(f)
                                                for f in files) // 6 + 1)
    pt.prepare_pieces(pieces, base.load_tokenizer(model), directory, examples.Settings(
        max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2, seed=3))
""")


def test_a_killed_preparation_is_finished_by_a_rerun_doing_only_the_missing_shards(
        reference, text_corpus, tok, tmp_path, monkeypatch):
    model, directory = str(tmp_path / "tok.model"), str(tmp_path / "killed")
    tok.save(model)
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_RUN, *text_corpus, directory, model],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    made = []
    while len(made) < 2:
        line = proc.stdout.readline()
        assert line, "the preparation ended before it could be killed"
        made.append(int(line.split()[1]))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not os.path.exists(os.path.join(directory, store.MANIFEST))
    done = store.done_shards(paths.as_path(directory))
    assert made[:2] == sorted(done)[:2] and len(done) < 6
    for shard, summary in store.read_markers(paths.as_path(directory), done).items():
        # a marker means its shard's file is whole
        rows = np.load(os.path.join(directory, store.shard_file(shard)))
        assert len(rows) == summary["rows"]
    with pytest.raises(DataError, match="incomplete or corrupt"):
        pt.PretrainingSource(directory)

    rerun = []
    real = pt._make_shard
    monkeypatch.setattr(pt, "_make_shard", lambda task: rerun.append(task[0]) or real(task))
    pt.prepare_pieces(_pieces(text_corpus), tok, directory, SETTINGS)
    assert sorted(rerun) == sorted(set(range(6)) - set(done))
    _same_files(reference, directory)


def test_a_directory_refuses_another_preparation(reference, text_corpus, tok):
    other = examples.Settings(**{**SETTINGS.__dict__, "masked_lm_prob": 0.2})
    with pytest.raises(DataError, match=r"another settings .*plan.json differs.*delete"):
        pt.prepare_pieces(_pieces(text_corpus), tok, str(reference), other)
    with pytest.raises(DataError, match=r"another pieces"):
        pt.prepare_pieces(_pieces(text_corpus[:1]), tok, str(reference), SETTINGS)


def test_waiting_hosts_say_what_they_wait_for(text_corpus, tok, tmp_path):
    lines = []
    thread = threading.Thread(target=pt.prepare_pieces, args=(
        _pieces(text_corpus), tok, str(tmp_path / "d"), SETTINGS),
        kwargs=dict(process_index=1, process_count=2, poll_seconds=0.05, report=lines.append))
    thread.daemon = True  # process 0 never comes: the thread is left waiting
    thread.start()
    deadline = time.time() + 5
    while not lines and time.time() < deadline:
        time.sleep(0.05)
    assert lines and "waiting for process 0 to write" in lines[0] and "plan.json" in lines[0]
