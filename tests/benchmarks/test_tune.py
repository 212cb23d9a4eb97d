"""benchmarks.tune, the tuning sweep for a lent accelerator, on this CPU at tiny sizes: the batch
doubles, each knob is tried once away from the best, a step that does not fit or fails is a row
and the sweep goes on, the budget skips what cannot finish, a flag set times the best trial in a
process of its own, and smoke --tune runs the stages; on a CPU without --allow-cpu it skips."""

import json

import jax
import pytest

from benchmarks import smoke, tune


def _rows(path):
    return [json.loads(line) for line in open(path)]


@pytest.mark.slow
def test_the_sweep_doubles_the_batch_then_tries_each_knob_once(tmp_path):
    argv = ["--models", "bert", "--tiny", "--allow-cpu", "--steps", "1", "--max-doublings", "1",
            "--out", str(tmp_path)]
    assert tune.main(argv) == 0
    rows = _rows(tmp_path / "tune.jsonl")
    trials = [r for r in rows if not r.get("peer")]
    assert [r["batch"] for r in trials[:2]] == [2, 4]
    # the baseline, one doubling, then every other value of every knob: 1 + 1 + 1 + 1
    assert len(trials) == 2 + sum(len(v) - 1 for v in tune.TINY_KNOBS.values())
    for knob, values in tune.TINY_KNOBS.items():
        assert {r[knob] for r in trials} == set(values)
    assert all(r["status"] == "ok" and r["tokens_per_s"] > 0 for r in trials), trials
    # The knobs are tried at the batch the doubling kept; the peer runs at the best trial's.
    kept = max(trials[:2], key=lambda r: r["tokens_per_s"])["batch"]
    assert {r["batch"] for r in trials[2:]} == {kept}
    best = max(trials, key=lambda r: r["tokens_per_s"])
    (peer,) = [r for r in rows if r.get("peer")]
    assert peer["status"] == "ok" and peer["batch"] == best["batch"], peer
    report = (tmp_path / "tune.md").read_text()
    assert "## bert" in report and "Best: batch" in report and "HF PyTorch at batch" in report


@pytest.mark.slow
def test_a_failing_or_oversized_trial_is_a_row_and_the_budget_skips(tmp_path, monkeypatch):
    real_build = tune.build

    def build(config, task):  # the allocator's refusal, as a GPU gives it, past batch 2
        if config.data.batch_size > 2:
            raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 9 GiB")
        return real_build(config, task)

    monkeypatch.setattr(tune, "build", build)
    argv = ["--models", "gpt", "--tiny", "--allow-cpu", "--steps", "1", "--no-peer",
            "--out", str(tmp_path)]
    assert tune.main(argv) == 0
    rows = _rows(tmp_path / "tune.jsonl")
    assert [r["status"] for r in rows[:2]] == ["ok", "oom"]
    assert "RESOURCE_EXHAUSTED" in rows[1]["error"]
    assert all(r["batch"] == 2 and r["status"] == "ok" for r in rows[2:])
    # No time left: every trial is skipped, named, and nothing runs.
    assert tune.main(argv + ["--budget-s", "0", "--append"]) == 0
    later = _rows(tmp_path / "tune.jsonl")[len(rows):]
    assert later and all(r["status"] == "skipped" and "--budget-s" in r["error"] for r in later)


def test_a_backend_this_device_lacks_is_an_error_row():
    row = tune.trial("bert", "tiny", 32, 2, {"backend": "splash", "remat": "none",
                                              "dropout_rng": "auto"}, dtype="float32", steps=1)
    # Splash is a TPU kernel: on this CPU its block check refuses it.
    assert row["status"] == "error" and row["error"].startswith("ValueError: "), row


def test_on_a_cpu_it_skips_and_bad_models_are_one_line(tmp_path, capsys):
    assert tune.main(["--out", str(tmp_path)]) == 0
    assert "skipped: jax sees no GPU or TPU here" in capsys.readouterr().out
    assert tune.main(["--models", "lstm", "--out", str(tmp_path)]) == 2
    assert "--models: unknown ['lstm']" in capsys.readouterr().err


@pytest.mark.acceptance
def test_smoke_tune_runs_the_sweep_and_a_flag_set_times_the_best(tmp_path):
    assert smoke.main(["--tune", "--allow-cpu", "--tiny", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "smoke.json").read_text())
    assert [s["status"] for s in report["stages"]] == ["ok", "ok", "ok"]
    rows = _rows(tmp_path / "tune.jsonl")
    flagged = [r for r in rows if r.get("xla_flags") == "maxtext"]
    assert {r["model"] for r in flagged} == {"bert", "gpt"}
    assert all(r["status"] == "ok" for r in flagged)
    assert report["tune"] is True and len(report["headlines"]["tune"]) >= 4
