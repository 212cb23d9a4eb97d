"""Classification metrics as GLUE reports them: accuracy, F1 (binary: of the positive class, as
MRPC/QQP; otherwise macro), and Matthews correlation (CoLA), from a confusion matrix."""

import numpy as np


def confusion_matrix(labels: np.ndarray, predictions: np.ndarray, num_classes: int) -> np.ndarray:
    """counts[i, j] = examples of true class i predicted as j; [num_classes, num_classes]."""
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    if labels.shape != predictions.shape:
        raise ValueError(f"labels {labels.shape} and predictions {predictions.shape} differ")
    for name, x in (("labels", labels), ("predictions", predictions)):
        if x.size and (x.min() < 0 or x.max() >= num_classes):
            raise ValueError(f"{name} must lie in [0, {num_classes}); got {x.min()}..{x.max()}")
    counts = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(counts, (labels, predictions), 1)
    return counts


def f1_per_class(counts: np.ndarray) -> np.ndarray:
    """F1 of each class from a confusion matrix; 0 where a class is never true nor predicted."""
    tp = np.diag(counts).astype(np.float64)
    predicted, actual = counts.sum(axis=0), counts.sum(axis=1)
    denominator = predicted + actual  # 2 TP + FP + FN
    return np.divide(2 * tp, denominator, out=np.zeros_like(tp), where=denominator > 0)


def matthews_corrcoef(counts: np.ndarray) -> float:
    """The multi-class Matthews correlation (Gorodkin's R_K; the binary MCC for 2 classes)."""
    counts = counts.astype(np.float64)
    n = counts.sum()
    correct = np.trace(counts)
    predicted, actual = counts.sum(axis=0), counts.sum(axis=1)
    numerator = correct * n - predicted @ actual
    denominator = np.sqrt(n**2 - predicted @ predicted) * np.sqrt(n**2 - actual @ actual)
    return float(numerator / denominator) if denominator > 0 else 0.0


def classification_metrics(labels: np.ndarray, predictions: np.ndarray,
                           num_classes: int) -> dict[str, float]:
    """accuracy, f1 (positive class 1 when binary, else macro) and mcc, in percent."""
    counts = confusion_matrix(labels, predictions, num_classes)
    total = max(int(counts.sum()), 1)
    f1 = f1_per_class(counts)
    return {
        "accuracy": 100.0 * np.trace(counts) / total,
        "f1": 100.0 * float(f1[1] if num_classes == 2 else f1.mean()),
        "mcc": 100.0 * matthews_corrcoef(counts),
    }


def majority_accuracy(train_labels: np.ndarray, eval_labels: np.ndarray, num_classes: int
                      ) -> float:
    """Accuracy (percent) on `eval_labels` of always predicting the most frequent of
    `train_labels` (the lowest class index on a tie): the floor every classifier must beat."""
    majority = np.bincount(train_labels, minlength=num_classes).argmax()
    return 100.0 * float(np.mean(eval_labels == majority))
