"""SQuAD fine-tuning through the one loop: init from a pretraining run, official output files."""

import json
import os

import jax
import numpy as np
import pytest

from configs import squad as squad_config
from zoo.checkpoints.checkpoint import Checkpointer
from zoo.commands import jobs
from zoo.train import init_from

# One device: nothing here is about sharding (tests/train/test_loop.py covers the layouts),
# and 8 fake devices only add compile and collective time.
ONE_DEVICE = jax.devices()[:1]


def _squad(root, version, **train):
    config = squad_config.get_config(f"size=tiny,version={version}")
    config.data.update(synthetic_entities=100, vocab_size=512, cache_dir=str(root / "cache"),
                       batch_size=16, eval_batch_size=16)
    config.train.update(dict(dict(steps=6, eval_every=6, log_every=3, tensorboard=False,
                                  init_from=str(root / "pretrain")), **train))
    return config


def test_init_from_fills_only_the_encoder(tiny_pretrained_bert):
    config = _squad(tiny_pretrained_bert, "1.1")
    setup = jobs.build(config, str(tiny_pretrained_bert / "probe"), devices=ONE_DEVICE)
    started = init_from.init_params(str(tiny_pretrained_bert / "pretrain"), setup.state,
                                     setup.task.pretrained_subtree())
    source = Checkpointer(str(tiny_pretrained_bert / "pretrain"))
    restored = source.restore_params({"bert": started.params["bert"]})["bert"]
    for a, b in zip(jax.tree.leaves(started.params["bert"]), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # The span head keeps its fresh initialisation.
    for a, b in zip(jax.tree.leaves(started.params["qa_outputs"]),
                    jax.tree.leaves(setup.state.params["qa_outputs"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
@pytest.mark.parametrize("version", ["1.1", "2.0"])
def test_train_and_eval_write_the_official_files_and_metrics(tiny_pretrained_bert, version):
    workdir = tiny_pretrained_bert / f"squad{version}"
    summary = jobs.train(_squad(tiny_pretrained_bert, version), str(workdir), devices=ONE_DEVICE)
    keys = {"exact", "f1", "total"} | ({"HasAns_f1", "NoAns_f1", "best_f1", "best_f1_thresh"}
                                       if version == "2.0" else {"exact_match"})
    assert keys <= set(summary)
    out = workdir / "predictions"
    predictions = json.load(open(out / "predictions.json"))
    nbest = json.load(open(out / "nbest_predictions.json"))
    assert set(predictions) == set(nbest) and len(predictions) == summary["total"]
    assert os.path.exists(out / "null_odds.json") == (version == "2.0")
    # eval.py restores the same checkpoint and reproduces the same official metrics.
    again = jobs.evaluate(_squad(tiny_pretrained_bert, version), str(workdir), devices=ONE_DEVICE)
    assert again["f1"] == pytest.approx(summary["f1"], abs=1e-9)
