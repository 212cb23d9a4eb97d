"""The GPT job from the command line, as a user runs it: train.py then eval.py."""

import itertools
import json
import os
import subprocess
import sys

import pytest

from tests.process_env import process_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(script, *args, check=True):
    # Two fake devices: the command's data-parallel path, without 8 device threads that must
    # meet at every all-reduce on a 2-core machine busy with the rest of the suite (a
    # rendezvous that missed XLA's deadline aborted the process once under such load).
    env = process_env(2)
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, script), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("gpt"))
    # The default mesh puts both devices on `data`.
    proc = _run("train.py", "--config=configs/gpt.py:size=tiny", f"--workdir={workdir}",
                "--config.train.steps=150", "--config.train.log_every=50",
                "--config.train.eval_every=150", "--config.train.checkpoint_every=75")
    return workdir, proc.stdout


@pytest.mark.acceptance  # the README command, 150 steps: perplexity under a third of unigram's
def test_training_prints_progress_and_loss_falls(trained):
    workdir, stdout = trained
    assert "tok/s" in stdout and "ETA" in stdout and "step    150/150" in stdout
    records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    train = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train] == [50, 100, 150]
    assert train[-1]["loss"] < train[0]["loss"] - 1.0
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    # 150 CPU steps already beat a unigram model of the same tokens on held-out text by far:
    # the model learned the corpus's structure, not just word frequencies.
    assert summary["perplexity"] < summary["unigram_perplexity"] / 3
    # It ends by sampling text from the trained model (config.sample.num=3 by default).
    # The indented lines under "samples:" (the run's goodput line follows them).
    samples = list(itertools.takewhile(lambda line: line.startswith("  "),
                                       stdout.split("samples:\n", 1)[1].splitlines()))
    assert len(samples) == 3 and all(len(line.split()) >= 3 for line in samples)


@pytest.mark.acceptance  # eval.py and sampling from the same trained run
def test_eval_restores_the_checkpoint_and_reproduces_the_final_eval(trained):
    workdir, _ = trained
    proc = _run("eval.py", "--config=configs/gpt.py:size=tiny", f"--workdir={workdir}",
                "--config.sample.num=2", "--config.sample.prompt=Lomira lives in")
    samples = proc.stdout.split("samples:\n", 1)[1].splitlines()
    assert len(samples) == 2 and all(s.strip().startswith("Lomira lives in") for s in samples)
    result = json.load(open(os.path.join(workdir, "eval.json")))
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    assert result["step"] == 150
    assert result["perplexity"] == pytest.approx(summary["perplexity"], rel=1e-5)


@pytest.mark.slow
def test_config_typo_is_an_error_naming_the_key(tmp_path):
    proc = _run("train.py", "--config=configs/gpt.py", f"--workdir={tmp_path}",
                "--config.train.stepz=3", check=False)
    assert proc.returncode != 0
    assert "stepz" in proc.stderr
    proc = _run("train.py", "--config=configs/gpt.py:sise=tiny", f"--workdir={tmp_path}",
                check=False)
    assert proc.returncode != 0 and "sise" in proc.stderr


def test_eval_without_checkpoint_says_train_first(tmp_path):
    proc = _run("eval.py", "--config=configs/gpt.py", f"--workdir={tmp_path}", check=False)
    assert proc.returncode != 0
    assert "train first" in proc.stderr
