"""The scoring the three classification tasks share (zoo.tasks.classifier_scoring), on a
hand-made split: the metrics, the predictions file and the majority baseline each task reports."""

import numpy as np
import pytest

from zoo.tasks.classification import ClassificationTask
from zoo.tasks.classifier_scoring import ClassifierScoring
from zoo.tasks.feature_classification import FeatureClassificationTask
from zoo.tasks.gpt_classification import GPTClassificationTask


class _Split(ClassifierScoring):
    def predict(self, params, batch):  # the part's other member; not used here
        raise NotImplementedError


def _split():
    split = _Split()
    split.labels = ("no", "yes")
    split.train_rows = {"label": np.array([1, 1, 0], np.int32)}  # majority: yes
    split.eval_examples = [{"id": "a", "label": "yes"}, {"id": "b", "label": "no"},
                           {"id": "c", "label": "yes"}]
    split.eval_rows = {"label": np.array([1, 0, 1], np.int32)}
    return split


def test_every_classification_task_scores_through_it():
    for task in (ClassificationTask, FeatureClassificationTask, GPTClassificationTask):
        assert issubclass(task, ClassifierScoring)
        assert task.score_predictions is ClassifierScoring.score_predictions, task
        assert task.baselines is ClassifierScoring.baselines, task


def test_metrics_predictions_file_and_baseline():
    split = _split()
    # Three real rows (the third predicted wrong) and one eval padding row, which is dropped.
    logits = np.array([[0.0, 2.0], [1.0, 0.0], [3.0, 1.0], [0.0, 9.0]], np.float32)
    scored = split.score_predictions({"logits": logits})
    assert scored.files["predictions.tsv"] == ("id\tlabel\tprediction\n"
                                               "a\tyes\tyes\nb\tno\tno\nc\tyes\tno\n")
    # F1 of the positive class 'yes': precision 1, recall 1/2; MCC of [[1, 0], [1, 1]].
    assert scored.metrics["f1"] == pytest.approx(100 * 2 / 3)
    assert scored.metrics["mcc"] == pytest.approx(100 * 0.5)
    assert split.baselines() == {"majority_accuracy": pytest.approx(100 * 2 / 3)}
    assert split.summarize({"loss_sum": 3.0, "correct_sum": 2.0, "weight_sum": 4.0}) == {
        "loss": 0.75, "accuracy": 50.0}
