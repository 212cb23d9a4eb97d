"""BERT pretraining from the command line, as a user runs it: phase 1, eval, phase 2, dry run."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(script, *args, check=True, devices=1):
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(scope="module")
def phase1(tmp_path_factory):
    root = tmp_path_factory.mktemp("bert")
    workdir, cache = str(root / "phase1"), str(root / "cache")
    # A third of the tiny recipe's 3,000 steps is enough to show learning (the full recipe runs
    # in the Quickstart main job, tests/test_main_job.py).
    proc = _run("train.py", "--config=configs/bert_pretrain.py:size=tiny", f"--workdir={workdir}",
                f"--config.data.cache_dir={cache}", "--config.train.steps=1000")
    return root, workdir, cache, proc.stdout


def test_tiny_bert_learns_mlm_and_nsp_well_above_chance(phase1):
    _, workdir, _, stdout = phase1
    assert "tok/s" in stdout and "step   1000/1000" in stdout
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    # Chance = always the most frequent label of the eval set (a model blind to context).
    assert summary["mlm_accuracy"] > 1.4 * summary["mlm_majority_accuracy"]
    assert summary["nsp_accuracy"] > summary["nsp_majority_accuracy"] + 0.06


def test_eval_reports_mlm_and_nsp_accuracy(phase1):
    _, workdir, cache, _ = phase1
    proc = _run("eval.py", "--config=configs/bert_pretrain.py:size=tiny", f"--workdir={workdir}",
                f"--config.data.cache_dir={cache}", "--config.train.steps=1000")
    result = json.load(open(os.path.join(workdir, "eval.json")))
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    assert result["mlm_accuracy"] == pytest.approx(summary["mlm_accuracy"], rel=1e-6)
    assert result["nsp_accuracy"] == pytest.approx(summary["nsp_accuracy"], rel=1e-6)
    assert "mlm_accuracy" in proc.stdout and "nsp_accuracy" in proc.stdout


def test_phase2_starts_from_phase1_params_and_reuses_the_prepared_data(phase1):
    root, workdir, cache, _ = phase1
    before = set(os.listdir(cache))
    phase2 = str(root / "phase2")
    args = ["--config=configs/bert_pretrain.py:size=tiny,phase=2", f"--workdir={phase2}",
            f"--config.data.cache_dir={cache}", f"--config.train.init_from={workdir}",
            "--config.train.steps=4", "--config.train.log_every=2"]
    proc = _run("train.py", *args)
    assert f"initialised params from {workdir}/checkpoints step 1000" in proc.stdout
    added = set(os.listdir(cache)) - before
    # Phase 2 prepared its own 128-token examples once (train + validation), sharing the
    # tokenizer with phase 1 ...
    assert len(added) == 2 and all(name.split("-")[0] in ("train", "validation") for name in added)
    # ... and a rerun (here: a new workdir) regenerates nothing.
    _run("train.py", *args[:1], f"--workdir={root / 'phase2b'}", *args[2:])
    assert set(os.listdir(cache)) == before | added


def test_dry_run_of_bert_base_on_a_pod_sized_mesh(tmp_path):
    proc = _run("train.py", "--config=configs/bert_pretrain.py:size=base,phase=1,optimizer=lamb",
                f"--workdir={tmp_path}", "--config.train.dry_run=True", "--config.mesh.fsdp=4",
                "--config.mesh.tensor=2", "--config.data.vocab_size=512",
                "--config.data.synthetic_entities=100", devices=16)
    out = proc.stdout
    assert "mesh {'data': 2, 'fsdp': 4, 'tensor': 2} (16 devices)" in out
    for item in ("params", "optimizer", "activations", "FLOPs per step"):
        assert item in out
