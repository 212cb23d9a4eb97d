"""`python -m zoo.commands.prepare` as real processes: it prepares a job's data once, train.py
only reads it, two processes joined by jax.distributed share the shards and write what one
process writes, and mistakes are one line naming the key."""

import filecmp
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.train import multihost
from zoo.data.readers import text_files
from zoo.data.synthetic.documents import corpus_splits

ROOT = os.path.dirname(os.path.abspath(__file__ + "/../.."))
SMALL = ["--config=configs/bert_pretrain.py:size=tiny", "--config.data.vocab_size=256",
         "--config.data.seq_len=32", "--config.data.max_predictions_per_seq=5",
         "--config.data.dupe_factor=1", "--config.data.batch_size=8",
         "--config.data.eval_batch_size=8"]


def _run(*args, env=None):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env or multihost.base_env(1, fast_compile=True))


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory):
    directory = tmp_path_factory.mktemp("text")
    splits = corpus_splits(seed=0, num_entities=300)
    for split in ("train", "validation"):
        text_files.write_text_corpus(directory / f"{split}.txt", splits[split])
    return ["--config.data.source=files", f"--config.data.train_files={directory}/train.txt",
            f"--config.data.eval_files={directory}/validation.txt",
            "--config.data.shard_mb=0.01"]  # ~8 shards of the ~80 kB train text


def _tree(root):
    return sorted(os.path.relpath(os.path.join(d, f), root)
                  for d, _, files in os.walk(root) for f in files)


@pytest.mark.slow
def test_prepare_then_train_reads_it(tmp_path, text_corpus):
    prepared = str(tmp_path / "prepared")
    args = [*SMALL, *text_corpus, f"--config.data.prepared_dir={prepared}"]
    proc = _run("-m", "zoo.commands.prepare", f"--workdir={tmp_path / 'run'}", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "prepare: train:" in proc.stdout and "MB/s" in proc.stdout
    files = {f: os.stat(os.path.join(prepared, f)).st_mtime_ns for f in _tree(prepared)}
    assert "tokenizer/spm-bpe-256.model" in files and "train/manifest.json" in files

    proc = _run("train.py", f"--workdir={tmp_path / 'run'}", *args, "--config.train.steps=2",
                "--config.train.eval_every=2", "--config.train.tensorboard=false")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "eval at step 2" in proc.stdout
    # Nothing prepared or trained again: no cache in the workdir, the prepared files untouched.
    assert not os.path.exists(tmp_path / "run" / "data")
    assert {f: os.stat(os.path.join(prepared, f)).st_mtime_ns for f in _tree(prepared)} == files

    proc = _run("train.py", f"--workdir={tmp_path / 'other'}", *args, "--config.data.seq_len=64")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert ("config.data.seq_len=64 (prepared with 32)" in proc.stderr
            and "Traceback" not in proc.stderr)


@pytest.mark.slow
def test_two_processes_prepare_what_one_does(tmp_path, text_corpus):
    args = [*SMALL, *text_corpus]
    one = str(tmp_path / "one")
    proc = _run("-m", "zoo.commands.prepare", f"--workdir={tmp_path / 'w1'}", *args,
                f"--config.data.prepared_dir={one}", "--config.data.prepare_workers=1")
    assert proc.returncode == 0, proc.stdout + proc.stderr

    two, port = str(tmp_path / "two"), multihost.free_port()
    envs = [dict(multihost.base_env(1), JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                 JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(i)) for i in range(2)]
    procs = multihost.launch([sys.executable, "-m", "zoo.commands.prepare",
                              f"--workdir={tmp_path / 'w2'}", *args,
                              f"--config.data.prepared_dir={two}",
                              "--config.data.prepare_workers=1"], envs)
    out = multihost.finish(procs, timeout=300)
    assert "prepare [process 0/2]" in out
    names = _tree(one)
    assert names == _tree(two) and sum(n.startswith("train/shard-") for n in names) > 4
    _, mismatch, errors = filecmp.cmpfiles(one, two, names, shallow=False)
    assert not mismatch and not errors


@pytest.mark.slow
def test_the_command_refuses_other_jobs(tmp_path):
    proc = _run("-m", "zoo.commands.prepare", "--config=configs/gpt.py:size=tiny",
                f"--workdir={tmp_path}")
    assert proc.returncode == 1 and "config.task='lm'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_squad_features_prepared_once_equal_the_jobs_own(tmp_path):
    from configs import squad as squad_config
    from zoo.errors import ConfigError
    from zoo.tasks.squad import SquadTask

    prepared = str(tmp_path / "prepared")
    small = ["--config.data.synthetic_entities=150", "--config.data.vocab_size=256"]
    proc = _run("-m", "zoo.commands.prepare", "--config=configs/squad.py:size=tiny",
                f"--workdir={tmp_path / 'w'}", *small, f"--config.data.prepared_dir={prepared}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "train and" in proc.stdout and "validation windows" in proc.stdout

    def config(**data):
        c = squad_config.get_config("size=tiny")
        c.data.update(synthetic_entities=150, vocab_size=256, **data)
        return c

    own = SquadTask(config(), str(tmp_path / "w"))  # featurized here, same cache_dir
    read = SquadTask(config(prepared_dir=prepared), str(tmp_path / "elsewhere"))
    assert not os.path.exists(tmp_path / "elsewhere")  # nothing featurized or trained there
    for rows in ("train_rows", "eval_rows"):
        mine, theirs = getattr(own, rows), getattr(read, rows)
        assert sorted(mine) == sorted(theirs)
        for k in mine:
            np.testing.assert_array_equal(mine[k], theirs[k])
    for k in own.eval_features:
        np.testing.assert_array_equal(own.eval_features[k], read.eval_features[k])
    assert read.eval_examples == own.eval_examples
    assert read.tokenizer.encode("Who is the mayor?") == own.tokenizer.encode("Who is the mayor?")
    with pytest.raises(ConfigError, match=r"config.data.doc_stride=32 \(prepared with 64\)"):
        SquadTask(config(prepared_dir=prepared, doc_stride=32), str(tmp_path / "x"))
