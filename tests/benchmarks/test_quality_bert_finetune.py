"""benchmarks.quality_bert_finetune: the metrics both sides are judged by, the same start (zoo's
classification job through init_from and HF's BertForSequenceClassification loaded with zoo's
initial params give the same logits, and one step of each moves them alike), the command's user
errors, and (acceptance) a --quick run on the fixture corpus."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from benchmarks import quality_bert_finetune as finetune
from tests import process_env

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_scores_are_those_of_the_weighted_rows():
    logits = np.array([[2.0, 0.0], [0.0, 1.0], [1.0, 0.0], [5.0, -5.0]])
    labels = np.array([0, 1, 1, 1])
    weights = np.array([1.0, 1.0, 1.0, 0.0])  # the last row is eval padding
    out = finetune.scores(labels, logits, weights, num_classes=2)
    log_softmax = logits[:3] - np.log(np.exp(logits[:3]).sum(-1, keepdims=True))
    assert out["loss"] == pytest.approx(-np.mean(log_softmax[[0, 1, 2], [0, 1, 1]]))
    assert out["accuracy"] == pytest.approx(200 / 3)
    # Class 1 (spam): precision 1/1, recall 1/2.
    assert out["f1"] == pytest.approx(100 * 2 * 0.5 / 1.5)


def _pretrained_directory(tmp_path, corpus, vocab):
    """A randomly initialised tiny BertForPreTraining written as a Hugging Face directory, in
    place of the benchmark's pretraining run."""
    from zoo.convert import hf_save
    from zoo.data.tokenizers.wordpiece import WordPieceTokenizer
    from zoo.models import bert

    tokenizer = WordPieceTokenizer.from_vocab_file(vocab, lowercase=True)
    config = bert.config_for_size("tiny", vocab_size=tokenizer.vocab_size,
                                  max_position_embeddings=64)
    model = bert.BertForPreTraining(config)
    ids = np.zeros((1, 8), np.int32)
    params = model.init(jax.random.key(0), ids, ids, np.ones_like(ids), np.zeros((1, 2), np.int32),
                        deterministic=True)["params"]
    path = str(tmp_path / "pretrained")
    hf_save.save_pretrained(path, config, jax.device_get(params), tokenizer,
                            architecture="BertForPreTraining")
    return path


@pytest.mark.slow
def test_both_sides_start_from_the_same_weights_and_take_the_same_step(tmp_path):
    from zoo.tasks.classification import ClassificationTask

    corpus = finetune.write_fixture_corpus(str(tmp_path / "corpora"))
    vocab = finetune.quality_bert.train_wordpiece(
        [os.path.join(corpus, "brown", "train.txt")], str(tmp_path), 300)
    pretrained = _pretrained_directory(tmp_path, corpus, vocab)
    config = finetune.classify_config("spam_assassin", corpus, str(tmp_path / "data"), vocab,
                                      pretrained, finetune.QUICK, seed=0)
    assert config.optim.learning_rate == 1e-3 and config.model.dropout_rate == 0.0  # 'tiny'
    config.finetune.classifier_dropout = 0.0  # no dropout: one step must agree closely
    task = ClassificationTask(config, str(tmp_path / "run"))
    zoo = finetune.ZooClassifier(config, task)
    peer = finetune.HFClassifier(config, task, zoo.state.params)
    # The encoder came from the directory (not zoo's random init), the head from zoo's init.
    loaded = np.asarray(zoo.state.params["bert"]["embeddings"]["word_embeddings"]["embedding"])
    assert not np.allclose(loaded, np.asarray(finetune.step_jobs.build(
        config, task).state.params["bert"]["embeddings"]["word_embeddings"]["embedding"]))
    batches = task.eval_batches(0, 1)
    before = {side.name: side.evaluate(batches) for side in (zoo, peer)}
    assert before["zoo"]["loss"] == pytest.approx(before["peer"]["loss"], abs=1e-5)
    batch = next(task.train_batches(0, 1))
    # The first step's lr is 0 (warm-up from 0): two steps, so the weights move.
    for _ in range(2):
        losses = [side.step({k: v.copy() for k, v in batch.items()}) for side in (zoo, peer)]
        assert losses[0] == pytest.approx(losses[1], abs=1e-5)
    after = {side.name: side.evaluate(batches) for side in (zoo, peer)}
    assert abs(after["zoo"]["loss"] - before["zoo"]["loss"]) > 1e-4  # the step did something
    assert after["zoo"]["loss"] == pytest.approx(after["peer"]["loss"], abs=1e-4)


def test_a_missing_corpus_is_one_line_naming_the_file_and_the_fetch(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.quality_bert_finetune", "--corpus",
         str(tmp_path / "nowhere")], capture_output=True, text=True, cwd=ROOT, env=process_env.process_env(),
        timeout=300)
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "nowhere/brown/train.txt not found" in last
    assert "zoo.commands.corpus fetch brown" in last and "Traceback" not in result.stderr


@pytest.mark.acceptance
def test_quick_run_writes_both_tasks_from_one_start(tmp_path):
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.quality_bert_finetune", "--quick", "--out", str(out),
         "--workdir", str(tmp_path / "work")], capture_output=True, text=True, cwd=ROOT,
        env=process_env.process_env(), timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = [json.loads(line) for line in open(out / "quality_bert_finetune.jsonl")]
    records = lines[1:]
    assert {r["task"] for r in records} == set(finetune.TASKS)
    for r in records:
        zoo, peer = r["sides"]["zoo"], r["sides"]["peer"]
        assert zoo["params"] == peer["params"]
        assert zoo["curve"][0][1]["loss"] == pytest.approx(peer["curve"][0][1]["loss"], abs=1e-4)
    assert (out / "quality_bert_finetune.png").stat().st_size > 0
    assert "goal" in (out / "quality_bert_finetune.md").read_text()
