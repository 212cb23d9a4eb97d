"""ELMo end to end on the synthetic world: the biLM trains through the one loop, and a
classifier on its frozen features (or on frozen word2vec vectors) trains only what it claims."""

import json
import os

import jax
import numpy as np
import pytest

from configs import elmo as elmo_config
from configs import feature_classify as feature_config
from configs import word2vec as word2vec_config
from zoo.checkpoints.checkpoint import Checkpointer
from zoo.commands import jobs
from zoo.train import init_from

# One device: nothing here is about sharding (tests/train/test_loop.py covers the layouts),
# and 8 fake devices only add compile and collective time.
ONE_DEVICE = jax.devices()[:1]

ENTITIES = 100  # a small world: ~80 documents, ~500 relation examples


def _records(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _summary(workdir):
    with open(os.path.join(workdir, "summary.json")) as f:
        return json.load(f)


def _final_params(config, workdir):
    setup = jobs.build(config, str(workdir), devices=ONE_DEVICE)
    return Checkpointer(str(workdir)).restore(setup.state).params


def _shrunk(config, steps):
    config.train.update(steps=steps, eval_every=steps, checkpoint_every=steps, log_every=10,
                        tensorboard=False)
    return config


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """(elmo workdir, word2vec workdir), each trained once on the same small corpus."""
    root = tmp_path_factory.mktemp("pretrained")
    config = _shrunk(elmo_config.get_config("size=tiny"), 120)
    config.model.hidden_size = 16
    config.data.update(synthetic_entities=ENTITIES, batch_size=16, eval_batch_size=16)
    config.optim.warmup_steps = 10
    jobs.train(config, str(root / "elmo"), devices=ONE_DEVICE)
    config = _shrunk(word2vec_config.get_config("size=tiny"), 150)
    config.data.update(synthetic_entities=ENTITIES)
    config.sample.num_neighbours = 0
    jobs.train(config, str(root / "w2v"), devices=ONE_DEVICE)
    return root / "elmo", root / "w2v"


def _feature_config(kind, pretrained, steps=100):
    elmo_dir, w2v_dir = pretrained
    config = _shrunk(feature_config.get_config(f"kind={kind},task=relation"), steps)
    config.data.update(synthetic_entities=ENTITIES, seq_len=24, batch_size=16,
                       eval_batch_size=32, cache_dir=str(elmo_dir.parent / "cache"))
    if kind == "elmo":
        config.pretrained.model.hidden_size = 16
    config.train.init_from = str(elmo_dir if kind == "elmo" else w2v_dir)
    config.optim.warmup_steps = 10
    return config


@pytest.mark.slow
def test_bilm_loss_falls_and_beats_the_unigram_model(pretrained):
    elmo_dir, _ = pretrained
    train = [r for r in _records(elmo_dir) if r["split"] == "train"]
    assert train[-1]["loss"] < train[0]["loss"] - 2.0  # the sum of two directions' NLLs
    summary = _summary(elmo_dir)
    assert summary["unigram_perplexity"] > 50
    for key in ("forward_perplexity", "backward_perplexity", "perplexity"):
        assert summary[key] < summary["unigram_perplexity"] / 2, key


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["elmo", "word2vec"])
def test_frozen_features_classify_and_only_the_head_and_mix_train(pretrained, tmp_path, kind):
    config = _feature_config(kind, pretrained)
    workdir = tmp_path / kind
    summary = jobs.train(config, str(workdir), devices=ONE_DEVICE)
    # Far above always answering the most frequent of the 19 relations.
    baseline = _summary(workdir)["majority_accuracy"]
    assert baseline < 35
    assert summary["accuracy"] > baseline + 40, summary
    assert {"f1", "mcc"} <= set(summary)

    final = _final_params(config, workdir)
    start = jobs.build(config, str(tmp_path / "start"), devices=ONE_DEVICE).state
    subtree = "bilm" if kind == "elmo" else "embedding"
    initial = init_from.init_params(config.train.init_from, start, subtree).params
    # The extractor is the pretrained one, bit for bit, after training.
    for a, b in zip(jax.tree.leaves(final[subtree]), jax.tree.leaves(initial[subtree])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(final["classifier"]["kernel"]),
                              np.asarray(initial["classifier"]["kernel"]))
    if kind == "elmo":  # ScalarMix's s and gamma trained (they start at 0 and 1)
        assert np.abs(np.asarray(final["mix"]["scalar_weights"])).max() > 1e-3
        assert abs(float(final["mix"]["gamma"]) - 1.0) > 1e-3


@pytest.mark.slow
def test_feature_task_needs_init_from(pretrained, tmp_path):
    config = _feature_config("elmo", pretrained)
    config.train.init_from = ""
    with pytest.raises(ValueError, match="config.train.init_from"):
        jobs.train(config, str(tmp_path), devices=ONE_DEVICE)
