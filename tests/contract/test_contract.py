"""The task contract: a small required core, and opt-in parts the loop finds by isinstance."""

import jax
import ml_collections
import numpy as np
import pytest

from zoo import contract, tasks
from zoo.tasks.base import (Baselines, FineTuning, Measured, Predicting, Sampling, Scored,
                            Task)


class _Core(Task):
    """Only the required core: every part's question gets its default answer."""

    def init_batch(self):
        return {"x": np.zeros((2, 3), np.float32)}

    def loss_fn(self, params, batch, rng, train):
        return {"loss_sum": 0.0, "weight_sum": 1.0}


def test_a_core_task_answers_every_part_with_its_default():
    task = _Core(ml_collections.ConfigDict({"data": {}}), "")
    assert not isinstance(task, contract.PARTS)
    assert contract.flops_per_token(task) == 0.0
    assert contract.activation_bytes(task, 4, 1) == 0.0
    assert contract.pretrained_subtree(task) is None
    assert contract.frozen_subtrees(task) == ()
    assert contract.baselines(task) == {} and contract.samples(task, {}) == []
    contract.prepare(task, {})  # nothing to do
    assert not hasattr(task, "predict") and not hasattr(task, "score_predictions")


def test_a_task_written_against_the_old_base_is_told_which_part_to_declare():
    with pytest.raises(TypeError, match=r"predict, score_predictions \(part Predicting\).*"
                                        r"pretrained_subtree \(part FineTuning\).*"
                                        r"class Old\(Task, Predicting, FineTuning\)"):
        class Old(_Core):
            def predict(self, params, batch):
                return {}

            def score_predictions(self, outputs):
                return {}

            def pretrained_subtree(self):
                return "bert"


def test_every_registered_task_declares_the_parts_it_implements():
    # The class statement itself checks (Task.__init_subclass__); this pins what each job is.
    kinds = {name: {p.__name__ for p in contract.PARTS if issubclass(tasks.get(name), p)}
             for name in ("squad", "translate", "rnn_translate", "classify", "lm", "mlm_nsp",
                          "word2vec", "elmo", "feature_classify", "gpt_classify", "nnlm",
                          "rnnlm")}
    assert kinds["squad"] == {"Predicting", "FineTuning", "Measured"}
    assert kinds["translate"] == kinds["rnn_translate"] == {"Predicting", "Sampling", "Measured"}
    assert kinds["classify"] == {"Predicting", "FineTuning", "Baselines", "Measured"}
    assert kinds["lm"] == kinds["nnlm"] == kinds["rnnlm"] == {"Sampling", "Baselines",
                                                               "Measured"}
    assert kinds["mlm_nsp"] == kinds["elmo"] == {"Baselines", "Measured"}
    assert kinds["word2vec"] == {"Predicting", "Sampling", "Baselines", "Measured"}
    assert kinds["feature_classify"] == kinds["gpt_classify"] == {"Predicting", "FineTuning",
                                                                  "Baselines"}


def test_outputs_are_written_in_their_own_step_on_process_zero(tmp_path):
    files = {"predictions.json": '{"q1": "Paris"}\n', "metrics.json": "{}"}
    written = contract.write_outputs(files, contract.predictions_directory(str(tmp_path)))
    assert sorted(written) == sorted(str(tmp_path / "predictions" / n) for n in files)
    assert (tmp_path / "predictions" / "predictions.json").read_text() == files[
        "predictions.json"]
    assert contract.write_outputs({}, str(tmp_path / "none")) == []
    assert not (tmp_path / "none").exists()
    assert jax.process_index() == 0


def test_the_parts_are_what_zoo_tasks_base_exports():
    assert (Predicting, FineTuning, Sampling, Baselines, Measured) == contract.PARTS
    assert Scored({"a": 1.0}).files == {}
