"""BERT pretraining from the command line, as a user runs it: phase 1, eval, phase 2, dry run.
That the tiny recipe learns MLM and NSP is proven on its full 3,000 steps by the acceptance
tier (tests/end_to_end/test_main_job.py::test_tiny_bert_learns_mlm_and_nsp_well_above_chance)."""

import json
import os
import subprocess
import sys

import pytest

from tests.process_env import process_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PHASE1_STEPS = 40
# A smaller synthetic world than the recipe's, for every command below: phase 2 must find the
# tokenizer phase 1 trained, so all of them share these data settings.
SMALL_DATA = ["--config.data.synthetic_entities=200", "--config.data.vocab_size=512",
              "--config.data.dupe_factor=1"]


def _run(script, *args, check=True, devices=1):
    env = process_env(devices)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(scope="module")
def phase1(tmp_path_factory):
    root = tmp_path_factory.mktemp("bert")
    workdir, cache = str(root / "phase1"), str(root / "cache")
    # A short phase 1 of the tiny recipe: these tests are about the command line, eval.py and
    # phase 2's start, not about how much it learns.
    proc = _run("train.py", "--config=configs/bert_pretrain.py:size=tiny", f"--workdir={workdir}",
                f"--config.data.cache_dir={cache}", f"--config.train.steps={PHASE1_STEPS}",
                f"--config.train.eval_every={PHASE1_STEPS}", *SMALL_DATA)
    return root, workdir, cache, proc.stdout


@pytest.mark.slow
def test_phase1_prints_progress_and_reports_mlm_and_nsp(phase1):
    _, workdir, _, stdout = phase1
    assert "tok/s" in stdout and f"step {PHASE1_STEPS:>6}/{PHASE1_STEPS}" in stdout
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    for key in ("mlm_accuracy", "mlm_majority_accuracy", "nsp_accuracy", "nsp_majority_accuracy"):
        assert 0.0 <= summary[key] <= 1.0, key


@pytest.mark.slow
def test_eval_reports_mlm_and_nsp_accuracy(phase1):
    _, workdir, cache, _ = phase1
    proc = _run("eval.py", "--config=configs/bert_pretrain.py:size=tiny", f"--workdir={workdir}",
                f"--config.data.cache_dir={cache}", f"--config.train.steps={PHASE1_STEPS}",
                *SMALL_DATA)
    result = json.load(open(os.path.join(workdir, "eval.json")))
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    assert result["mlm_accuracy"] == pytest.approx(summary["mlm_accuracy"], rel=1e-6)
    assert result["nsp_accuracy"] == pytest.approx(summary["nsp_accuracy"], rel=1e-6)
    assert "mlm_accuracy" in proc.stdout and "nsp_accuracy" in proc.stdout


@pytest.mark.slow
def test_phase2_starts_from_phase1_params_and_reuses_the_prepared_data(phase1):
    root, workdir, cache, _ = phase1
    before = set(os.listdir(cache))
    phase2 = str(root / "phase2")
    args = ["--config=configs/bert_pretrain.py:size=tiny,phase=2", f"--workdir={phase2}",
            f"--config.data.cache_dir={cache}", f"--config.train.init_from={workdir}",
            "--config.train.steps=4", "--config.train.log_every=2", *SMALL_DATA]
    proc = _run("train.py", *args)
    assert f"initialised params from {workdir}/checkpoints step {PHASE1_STEPS}" in proc.stdout
    added = set(os.listdir(cache)) - before
    # Phase 2 prepared its own 128-token examples once (train + validation), sharing the
    # tokenizer with phase 1 ...
    assert len(added) == 2 and all(name.split("-")[0] in ("train", "validation") for name in added)
    # ... and a rerun regenerates nothing: here a dry run in a new workdir, which builds the
    # task (tokenizer and prepared data, as train.py does) and stops before compiling anything.
    _run("train.py", *args[:1], f"--workdir={root / 'phase2b'}", *args[2:],
         "--config.train.dry_run=True")
    assert set(os.listdir(cache)) == before | added


@pytest.mark.slow
def test_dry_run_of_bert_base_on_a_pod_sized_mesh(tmp_path):
    proc = _run("train.py", "--config=configs/bert_pretrain.py:size=base,phase=1,optimizer=lamb",
                f"--workdir={tmp_path}", "--config.train.dry_run=True", "--config.mesh.fsdp=4",
                "--config.mesh.tensor=2", "--config.data.vocab_size=512",
                "--config.data.synthetic_entities=100", devices=16)
    out = proc.stdout
    assert "mesh {'data': 2, 'fsdp': 4, 'tensor': 2} (16 devices)" in out
    for item in ("params", "optimizer", "activations", "FLOPs per step"):
        assert item in out
