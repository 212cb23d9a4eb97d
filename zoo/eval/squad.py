"""Moved: zoo.eval.squad_metrics (the official EM / F1, the no-answer threshold search) and
zoo.eval.squad_postprocess (logits -> answers, n-best and null odds, the output files). This old
path still imports their public names, with a one-line notice."""

from zoo import deprecation
from zoo.eval.squad_metrics import (best_threshold, evaluate, exact_score, f1_score,
                                    load_dataset, normalize_answer)
from zoo.eval.squad_postprocess import (SquadExample, SquadFeature, postprocess,
                                        write_predictions)

__all__ = ["SquadExample", "SquadFeature", "best_threshold", "evaluate", "exact_score",
           "f1_score", "load_dataset", "normalize_answer", "postprocess", "write_predictions"]

deprecation.notice("zoo.eval.squad is now zoo.eval.squad_metrics (EM / F1, thresholds) and "
                   "zoo.eval.squad_postprocess (logits -> answers, output files)")
