"""The old import paths of the renamed evaluation modules still work: the same functions, and
one line on stderr saying where they live now."""

import importlib
import sys

import pytest

from zoo import deprecation
from zoo.eval import classification_metrics, squad_metrics, squad_postprocess

MOVED = {
    "zoo.eval.squad": [(squad_metrics, ["evaluate", "best_threshold", "exact_score", "f1_score",
                                        "normalize_answer", "load_dataset"]),
                       (squad_postprocess, ["postprocess", "write_predictions", "SquadExample",
                                            "SquadFeature"])],
    "zoo.eval.classification": [(classification_metrics, [
        "classification_metrics", "confusion_matrix", "f1_per_class", "matthews_corrcoef",
        "majority_accuracy"])],
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_gives_the_same_names_with_one_notice(old, monkeypatch, capsys):
    monkeypatch.setattr(deprecation, "_noticed", set())
    monkeypatch.delitem(sys.modules, old, raising=False)
    shim = importlib.import_module(old)
    for new, names in MOVED[old]:
        for name in names:
            assert getattr(shim, name) is getattr(new, name), (old, name)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"zoo: deprecated: {old} is now zoo.eval.")
