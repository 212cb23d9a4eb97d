"""Moved: zoo.eval.classification_metrics (accuracy, F1, Matthews correlation, the majority
baseline). This old path still imports its public names, with a one-line notice."""

from zoo import deprecation
from zoo.eval.classification_metrics import (classification_metrics, confusion_matrix,
                                             f1_per_class, majority_accuracy,
                                             matthews_corrcoef)

__all__ = ["classification_metrics", "confusion_matrix", "f1_per_class", "majority_accuracy",
           "matthews_corrcoef"]

deprecation.notice("zoo.eval.classification is now zoo.eval.classification_metrics")
