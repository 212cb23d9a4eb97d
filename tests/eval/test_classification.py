import numpy as np
import pytest

from zoo.eval import classification_metrics


def _mcc_binary_reference(labels, predictions):
    # The textbook binary formula, independent of the multi-class code path.
    labels, predictions = np.asarray(labels, bool), np.asarray(predictions, bool)
    tp = float(np.sum(labels & predictions))
    tn = float(np.sum(~labels & ~predictions))
    fp = float(np.sum(~labels & predictions))
    fn = float(np.sum(labels & ~predictions))
    return (tp * tn - fp * fn) / np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))


def test_binary_metrics_by_hand():
    labels = [1, 1, 1, 0, 0, 0, 0, 1]
    predictions = [1, 1, 0, 0, 0, 1, 0, 1]  # TP 3, FN 1, FP 1, TN 3
    m = classification_metrics.classification_metrics(np.array(labels), np.array(predictions), 2)
    assert m["accuracy"] == pytest.approx(75.0)
    assert m["f1"] == pytest.approx(100 * 2 * 3 / (2 * 3 + 1 + 1))
    assert m["mcc"] == pytest.approx(100 * _mcc_binary_reference(labels, predictions))
    assert m["mcc"] == pytest.approx(50.0)  # (9 - 1) / 16


def test_macro_f1_and_multiclass_mcc():
    labels = np.array([0, 0, 1, 1, 2, 2])
    predictions = np.array([0, 1, 1, 1, 2, 0])
    counts = classification_metrics.confusion_matrix(labels, predictions, 3)
    np.testing.assert_array_equal(counts, [[1, 1, 0], [0, 2, 0], [1, 0, 1]])
    # Per class: F1_0 = 2/(2+2) ... 2TP / (2TP + FP + FN)
    expected = np.array([2 * 1 / (2 + 1 + 1), 2 * 2 / (4 + 1 + 0), 2 * 1 / (2 + 0 + 1)])
    np.testing.assert_allclose(classification_metrics.f1_per_class(counts), expected)
    m = classification_metrics.classification_metrics(labels, predictions, 3)
    assert m["f1"] == pytest.approx(100 * expected.mean())
    # Gorodkin's R_K from its covariance definition: cov(X, Y) / sqrt(cov(X, X) cov(Y, Y)) over
    # one-hot encodings.
    x = np.eye(3)[labels] - np.eye(3)[labels].mean(0)
    y = np.eye(3)[predictions] - np.eye(3)[predictions].mean(0)
    rk = np.sum(x * y) / np.sqrt(np.sum(x * x) * np.sum(y * y))
    assert m["mcc"] == pytest.approx(100 * rk)


def test_constant_predictions_have_zero_mcc_and_bad_ids_fail():
    m = classification_metrics.classification_metrics(np.array([0, 1, 1]), np.array([1, 1, 1]), 2)
    assert m["mcc"] == 0.0
    with pytest.raises(ValueError, match="predictions must lie in"):
        classification_metrics.classification_metrics(np.array([0]), np.array([2]), 2)


def test_majority_accuracy_predicts_the_most_frequent_training_label():
    train = np.array([2, 2, 0, 1, 2])
    # Class 2 never appears in eval here: the baseline still predicts it, and scores 0.
    assert classification_metrics.majority_accuracy(train, np.array([0, 1, 1, 0]), 3) == 0.0
    assert classification_metrics.majority_accuracy(train, np.array([2, 1, 2, 2]), 3) == 75.0
    # A tie goes to the lower class index, as np.argmax does.
    assert classification_metrics.majority_accuracy(np.array([1, 0]), np.array([0, 1]), 2) == 50.0
    assert classification_metrics.majority_accuracy(np.array([1, 1, 0]), np.zeros(3, int), 2) == 0.0
