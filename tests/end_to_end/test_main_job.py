"""The README Quickstart's main job, as a user runs it on a fresh machine (one CPU device):
pretrain tiny BERT, fine-tune it on the synthetic SQuAD set, report EM/F1, draw the curves.
Its pretraining stage is the tiny BERT recipe (configs/bert_pretrain.py:size=tiny, 3,000 steps),
so it also proves that recipe learns MLM and NSP; its pretrained encoder then proves the other
fine-tuning acceptance runs: SQuAD v2.0 abstention and classification under each strategy of
the lecture notes from NNLM to BERT. One pretraining shared by all of them: the acceptance tier."""

import json
import os
import subprocess
import sys

import jax
import pytest

from configs import classify as classify_config
from configs import squad as squad_config
from tests.process_env import process_env
from zoo.commands import jobs

pytestmark = pytest.mark.acceptance

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICKSTART = "--config=configs/quickstart.py"
ONE_DEVICE = jax.devices()[:1]  # the fine-tuning runs below, on one device as the main job's


def _run(script, *args):
    # One device, as the README's command runs on a laptop (the suite itself fakes 8).
    env = process_env(1)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise AssertionError(f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("quickstart")
    stdout = _run("train.py", QUICKSTART, f"--workdir={workdir}",
                  "--config.pretrain.train.tensorboard=False",
                  "--config.squad.train.tensorboard=False")
    return workdir, stdout


def test_main_job_pretrains_fine_tunes_and_answers_held_out_questions(quickstart):
    workdir, stdout = quickstart
    assert "stage 1/2: pretrain" in stdout and "stage 2/2: squad" in stdout
    assert "tok/s" in stdout and "ETA" in stdout
    assert "step   3000/3000" in stdout and "step   1500/1500" in stdout
    summary = json.load(open(workdir / "summary.json"))
    # The bar: F1 >= 80 on held-out questions (measured: 94.8 on one CPU device).
    assert summary["squad"]["f1"] >= 80.0, summary["squad"]
    assert summary["pretrain"]["mlm_accuracy"] > 2 * summary["pretrain"]["mlm_majority_accuracy"]
    curves = workdir / "curves.png"
    assert curves.stat().st_size > 10_000 and f"training curves: {curves}" in stdout
    predictions = json.load(open(workdir / "squad" / "predictions" / "predictions.json"))
    assert len(predictions) == summary["squad"]["total"]


def test_tiny_bert_learns_mlm_and_nsp_well_above_chance(quickstart):
    # The BERT pretraining claim of docs/tutorials/bert-pretraining.md, on the same run (the
    # Quickstart's first stage is configs/bert_pretrain.py:size=tiny). Chance = always the most
    # frequent label of the eval set (a model blind to context).
    workdir, _ = quickstart
    summary = json.load(open(workdir / "pretrain" / "summary.json"))
    assert summary["mlm_accuracy"] > 1.4 * summary["mlm_majority_accuracy"]
    assert summary["nsp_accuracy"] > summary["nsp_majority_accuracy"] + 0.06


def test_eval_and_a_rerun_reproduce_the_final_metrics(quickstart):
    workdir, _ = quickstart
    summary = json.load(open(workdir / "summary.json"))
    _run("eval.py", QUICKSTART, f"--workdir={workdir}")
    result = json.load(open(workdir / "squad" / "eval.json"))
    assert result["f1"] == pytest.approx(summary["squad"]["f1"], abs=1e-9)
    # A rerun of the finished job resumes each stage at its end: nothing is retrained.
    stdout = _run("train.py", QUICKSTART, f"--workdir={workdir}",
                  "--config.pretrain.train.tensorboard=False",
                  "--config.squad.train.tensorboard=False")
    assert "starting at step 3000 of 3000" in stdout and "starting at step 1500 of 1500" in stdout
    assert json.load(open(workdir / "summary.json"))["squad"]["f1"] == pytest.approx(
        summary["squad"]["f1"], abs=1e-9)


def _from_pretrained(config, workdir, steps):
    config.data.cache_dir = str(workdir / "data")  # the pipeline's tokenizer
    config.train.update(steps=steps, eval_every=steps, checkpoint_every=steps,
                        tensorboard=False, init_from=str(workdir / "pretrain"))
    return config


def test_squad_v2_learns_to_abstain(quickstart):
    workdir, _ = quickstart
    config = _from_pretrained(squad_config.get_config("size=tiny,version=2.0"), workdir, 1000)
    summary = jobs.train(config, str(workdir / "squad2"), devices=ONE_DEVICE)
    no_answer_share = 100.0 * summary["NoAns_total"] / summary["total"]
    # Always abstaining scores exactly the unanswerable share; never abstaining scores 0 on
    # them. The model must beat the first overall and abstain on a good part of the second.
    assert summary["NoAns_exact"] >= 30.0, summary
    assert summary["f1"] >= no_answer_share + 10.0, summary


@pytest.mark.parametrize("task, strategy, steps, margin", [
    ("fact_check", "full", 600, 12.0), ("relation", "features", 2000, 40.0)])
def test_classification_beats_the_majority_class(quickstart, task, strategy, steps, margin):
    # fact_check (3 balanced classes that need both sentences) needs the whole encoder
    # fine-tuned: measured 52.3% after 500 steps and 59.9% after 1,000 vs the majority's 33.3%
    # (a linear probe on the frozen pooled vector: 39.5%). relation (19 classes, lexical) is
    # read off frozen features (full fine-tuning: 100%) by a probe trained to its plateau:
    # 2,000 steps (~20 s); at 600 it was still climbing. Pretrained encoders measured 71-87%
    # at 2,000 steps vs the majority's 23.2% (60-80% at 600); encoders pretrained on the
    # defective hashed masks of 38ed588 plateau at 61-64% and fail.
    workdir, _ = quickstart
    config = _from_pretrained(
        classify_config.get_config(f"size=tiny,strategy={strategy},task={task}"), workdir, steps)
    summary = jobs.train(config, str(workdir / f"classify_{task}_{strategy}"),
                         devices=ONE_DEVICE)
    majority = json.load(open(workdir / f"classify_{task}_{strategy}" / "summary.json"))[
        "majority_accuracy"]
    assert summary["accuracy"] >= majority + margin, (summary, majority)
