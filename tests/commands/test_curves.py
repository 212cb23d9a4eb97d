import json

import pytest

from zoo.commands import curves


def _write(path, records, tail=""):
    with open(path / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
        f.write(tail)


def test_a_resumed_runs_repeated_steps_keep_the_last_record(tmp_path):
    _write(tmp_path, [{"step": 10, "split": "train", "loss": 3.0},
                      {"step": 20, "split": "train", "loss": 9.0},  # lost to a crash ...
                      {"step": 20, "split": "train", "loss": 2.0},  # ... and redone on resume
                      {"step": 20, "split": "eval", "loss": 2.5, "f1": 40.0}])
    records = curves.read_metrics(str(tmp_path))
    assert [(r["split"], r["step"], r["loss"]) for r in records] == [
        ("eval", 20, 2.5), ("train", 10, 3.0), ("train", 20, 2.0)]


def test_plot_draws_loss_and_recorded_metrics_per_run(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    _write(a, [{"step": s, "split": "train", "loss": 5.0 / s, "mlm_accuracy": 0.1 * s}
               for s in (1, 2, 3)])
    _write(b, [{"step": 1, "split": "eval", "loss": 1.0, "f1": 50.0, "exact": 40.0}])
    out = tmp_path / "out" / "curves.png"
    titles = curves.plot_training_curves([("pretrain", str(a)), ("squad", str(b))], str(out))
    assert titles == ["pretrain: loss", "pretrain: mlm_accuracy", "squad: loss", "squad: exact",
                      "squad: f1"]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_partial_line_from_a_killed_run_is_named_and_skipped(tmp_path):
    _write(tmp_path, [{"step": 1, "split": "train", "loss": 1.0}],
           tail='{"step": 2, "spl{"step": 2, "split": "train", "loss": 0.5}\n')
    with pytest.warns(UserWarning, match=r"metrics.jsonl:2: not a JSON record; skipped"):
        records = curves.read_metrics(str(tmp_path))
    assert [r["step"] for r in records] == [1]
    with pytest.raises(FileNotFoundError, match="train the run first"):
        curves.read_metrics(str(tmp_path / "missing"))
