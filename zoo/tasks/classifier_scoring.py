"""The scoring every classification task shares (BERT's, GPT's and the frozen-feature one): the
eval metrics from the summed loss / accuracy, F1 and Matthews correlation over the whole eval
split with its predictions.tsv, and the majority-class baseline."""

import numpy as np

from zoo.eval import classification_metrics
from zoo.tasks.base import Baselines, Predicting, Scored


def score_classification(examples: list[dict], labels: list[str], targets: np.ndarray,
                         logits: np.ndarray) -> Scored:
    """F1 and Matthews correlation (percent) of a classifier's eval split, from the gathered
    `logits` [>= N, classes] of the N `examples` (eval padding rows after them are dropped), and
    the predictions.tsv file (id, label, prediction) the evaluation writes."""
    predicted = np.argmax(logits[:len(examples)], axis=-1)
    metrics = classification_metrics.classification_metrics(targets, predicted, len(labels))
    rows = "".join(f"{ex['id']}\t{ex['label']}\t{labels[p]}\n"
                   for ex, p in zip(examples, predicted))
    return Scored({k: metrics[k] for k in ("f1", "mcc")},
                  {"predictions.tsv": "id\tlabel\tprediction\n" + rows})


class ClassifierScoring(Predicting, Baselines):
    """Inherited before Task by a classification task (`class T(ClassifierScoring, Task, ...)`,
    so its summarize is the one used), which sets `labels` (the label names), `eval_examples`
    (dicts with 'id' and 'label') and `train_rows` / `eval_rows` holding each example's 'label'
    index; its `predict` returns the eval batch's 'logits' and its loss_fn the sums 'loss_sum',
    'correct_sum' and 'weight_sum'."""

    labels: list[str] | tuple[str, ...]
    eval_examples: list[dict]
    train_rows: dict[str, np.ndarray]
    eval_rows: dict[str, np.ndarray]

    def summarize(self, sums: dict[str, float]) -> dict[str, float]:
        n = max(sums["weight_sum"], 1.0)
        return {"loss": sums["loss_sum"] / n, "accuracy": 100.0 * sums["correct_sum"] / n}

    def score_predictions(self, outputs: dict[str, np.ndarray]) -> Scored:
        return score_classification(self.eval_examples, self.labels, self.eval_rows["label"],
                                    outputs["logits"])

    def baselines(self) -> dict[str, float]:
        """Accuracy of always predicting the training set's most frequent label."""
        return {"majority_accuracy": classification_metrics.majority_accuracy(
            self.train_rows["label"], self.eval_rows["label"], len(self.labels))}
