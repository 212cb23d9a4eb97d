"""Classification fine-tuning through the one loop: the three strategies of the lecture notes
from NNLM to BERT train exactly what they claim, user TSV files, output files, and init from a
tiny_pretrained_bert directory."""

import json
import os

import jax
import numpy as np
import pytest

from configs import classify as classify_config
from tests.numerics import assert_close
from zoo.checkpoints.checkpoint import Checkpointer
from zoo.commands import jobs
from zoo.convert import hf
from zoo.data.synthetic import classification as synthetic_classification
from zoo.train import init_from

# One device: nothing here is about sharding (tests/train/test_loop.py covers the layouts),
# and 8 fake devices only add compile and collective time.
ONE_DEVICE = jax.devices()[:1]


def _config(root, strategy, **train):
    config = classify_config.get_config(f"size=tiny,strategy={strategy}")
    config.data.update(synthetic_entities=100, vocab_size=512, cache_dir=str(root / "cache"),
                       seq_len=64, batch_size=16, eval_batch_size=16)
    config.train.update(dict(dict(steps=6, eval_every=6, log_every=1, checkpoint_every=6,
                                  tensorboard=False, init_from=str(root / "pretrain")), **train))
    return config


def _final_params(config, workdir):
    setup = jobs.build(config, str(workdir), devices=ONE_DEVICE)
    return Checkpointer(str(workdir)).restore(setup.state).params


def _leaves_equal(a, b) -> bool:
    return all(np.array_equal(np.asarray(x), np.asarray(y))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _train_losses(workdir):
    records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    return np.array([r["loss"] for r in records if r["split"] == "train"])


@pytest.mark.slow
def test_strategies_train_exactly_what_they_claim(tiny_pretrained_bert):
    results = {}
    for strategy in ("full", "frozen", "features"):
        config = _config(tiny_pretrained_bert, strategy)
        workdir = tiny_pretrained_bert / strategy
        jobs.train(config, str(workdir), devices=ONE_DEVICE)
        results[strategy] = _final_params(config, workdir)
    start = jobs.build(_config(tiny_pretrained_bert, "full"), str(tiny_pretrained_bert / "start"),
                       devices=ONE_DEVICE)
    initial = init_from.init_params(str(tiny_pretrained_bert / "pretrain"), start.state,
                                    "bert").params
    # full fine-tuning moves the encoder; frozen and features leave it bit-identical.
    assert not _leaves_equal(results["full"]["bert"], initial["bert"])
    for strategy in ("frozen", "features"):
        assert _leaves_equal(results[strategy]["bert"], initial["bert"]), strategy
        assert not _leaves_equal(results[strategy]["classifier"], initial["classifier"])


@pytest.mark.slow
def test_feature_extraction_equals_the_frozen_encoder(tiny_pretrained_bert):
    # Without dropout the two strategies compute the same function with the same data order:
    # extracting features once must not change a single loss or parameter.
    losses, params = {}, {}
    for strategy in ("frozen", "features"):
        config = _config(tiny_pretrained_bert, strategy)
        config.finetune.classifier_dropout = 0.0
        workdir = tiny_pretrained_bert / f"{strategy}_nodrop"
        jobs.train(config, str(workdir), devices=ONE_DEVICE)
        losses[strategy] = _train_losses(workdir)
        params[strategy] = _final_params(config, workdir)["classifier"]
    assert len(losses["frozen"]) == 6
    np.testing.assert_allclose(losses["features"], losses["frozen"], rtol=1e-5)
    assert_close(params["features"], params["frozen"], 1e-4)


@pytest.mark.slow
def test_eval_writes_predictions_and_reproduces_metrics(tiny_pretrained_bert):
    config = _config(tiny_pretrained_bert, "full")
    workdir = tiny_pretrained_bert / "full_eval"
    summary = jobs.train(config, str(workdir), devices=ONE_DEVICE)
    assert {"loss", "accuracy", "f1", "mcc"} <= set(summary)
    lines = open(workdir / "predictions" / "predictions.tsv").read().splitlines()
    assert lines[0] == "id\tlabel\tprediction"
    labels = {"entailment", "contradiction", "neutral"}
    rows = [line.split("\t") for line in lines[1:]]
    assert rows and all(r[1] in labels and r[2] in labels for r in rows)
    accuracy = 100.0 * np.mean([r[1] == r[2] for r in rows])
    assert accuracy == pytest.approx(summary["accuracy"], abs=1e-3)
    again = jobs.evaluate(_config(tiny_pretrained_bert, "full"), str(workdir), devices=ONE_DEVICE)
    assert again["accuracy"] == pytest.approx(summary["accuracy"], abs=1e-9)
    assert "majority_accuracy" in again


@pytest.mark.slow
def test_user_jsonl_files_with_explicit_columns(tiny_pretrained_bert, tmp_path):
    splits = synthetic_classification.classification_splits(0, "relation", 100)
    for split in ("train", "validation"):
        rows = [{"sentence": ex["text_a"], "relation": ex["label"]} for ex in splits[split]]
        with open(tmp_path / f"{split}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    config = _config(tiny_pretrained_bert, "full", steps=2, eval_every=2, checkpoint_every=2)
    config.data.update(source="files", train_file=str(tmp_path / "train.jsonl"),
                       eval_file=str(tmp_path / "validation.jsonl"), label="relation")
    summary = jobs.train(config, str(tmp_path / "run"), devices=ONE_DEVICE)
    assert 0.0 <= summary["accuracy"] <= 100.0
    config.data.label = "no_such_key"
    with pytest.raises(ValueError, match="train.jsonl"):
        jobs.train(config, str(tmp_path / "bad"), devices=ONE_DEVICE)


@pytest.mark.slow
def test_init_from_a_hugging_face_directory(tiny_pretrained_bert, tmp_path):
    """A tiny_pretrained_bert directory (here: our pretraining exported with save_pretrained) defines
    the encoder's architecture and the tokenizer, and its weights start the run."""
    from zoo.data.tokenizers.wordpiece import WordPieceTokenizer
    from zoo.models import bert

    words = sorted({w for ex in synthetic_classification.classification_splits(0, "relation", 100)
                    ["train"] for w in ex["text_a"].lower().replace(".", " .").split()})
    tokenizer = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words)
    model_config = bert.config_for_size("tiny", vocab_size=tokenizer.vocab_size,
                                        max_position_embeddings=64)
    model = bert.BertModel(model_config)
    ids = np.zeros((1, 8), np.int32)
    params = model.init(jax.random.key(3), ids)["params"]
    directory = tmp_path / "hf_bert"
    hf.save_pretrained(str(directory), model_config, params, tokenizer)

    config = _config(tiny_pretrained_bert, "frozen", steps=2, eval_every=2, checkpoint_every=2,
                     init_from=str(directory))
    config.data.synthetic_task = "relation"
    run = tmp_path / "from_hf"
    jobs.train(config, str(run), devices=ONE_DEVICE)
    trained = _final_params(config, run)
    # The frozen encoder is exactly the directory's weights.
    assert _leaves_equal(trained["bert"], params)

    config.data.seq_len = 128  # more positions than the checkpoint has
    with pytest.raises(ValueError, match="max_position_embeddings"):
        jobs.train(config, str(tmp_path / "too_long"), devices=ONE_DEVICE)


@pytest.mark.slow
def test_init_from_a_google_research_tf_checkpoint(tiny_pretrained_bert, tmp_path):
    directory = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "convert",
                             "fixtures", "google_bert_tiny")
    _, expected, model_config, _ = hf.load_pretrained(directory)
    config = _config(tiny_pretrained_bert, "frozen", steps=2, eval_every=2, checkpoint_every=2,
                     init_from=directory)
    config.data.update(synthetic_task="relation", seq_len=model_config.max_position_embeddings)
    run = tmp_path / "from_tf"
    jobs.train(config, str(run), devices=ONE_DEVICE)
    trained = _final_params(config, run)
    assert _leaves_equal(trained["bert"], expected["bert"])
