"""The progress line's model FLOPs utilisation: tokens/s x the task's FLOPs per token over the
devices' peak, printed and logged when a peak is known (the spec table, or
config.train.peak_flops), absent on a CPU with none."""

import json
import types

import jax
import pytest

from zoo.commands import jobs
from zoo.train import metrics

ONE_DEVICE = jax.devices()[:1]


def _train_records(workdir):
    with open(workdir / "metrics.jsonl") as f:
        return [r for r in map(json.loads, f) if r["split"] == "train"]


@pytest.mark.slow
def test_mfu_is_printed_and_logged_against_config_peak_flops(tiny_lm_config, tmp_path, capfd):
    peak = 2e9  # FLOP/s per device, as a user would give for hardware missing from the table
    config = tiny_lm_config(steps=4, log_every=2, peak_flops=peak)
    jobs.train(config, str(tmp_path / "run"), devices=ONE_DEVICE)
    lines = [x for x in capfd.readouterr().out.splitlines() if " tok/s" in x]
    records = _train_records(tmp_path / "run")
    assert len(lines) == len(records) == 2
    flops_per_token = jobs.build(config, str(tmp_path / "probe"),
                                 devices=ONE_DEVICE).task.flops_per_token()
    assert flops_per_token > 0
    for line, record in zip(lines, records):
        expected = record["tokens_per_sec"] * flops_per_token / peak
        assert record["mfu"] == pytest.approx(expected, rel=1e-9)
        assert f"{record['tokens_per_sec']:,.0f} tok/s | MFU {expected:.1%} (HFU " in line
        # HFU counts what the step runs: the einsum computes the whole causal square, which
        # the model's count halves (as MaxText does), so HFU > MFU here; no remat, so not by
        # more than the attention term.
        assert 1.0 < record["hfu"] / record["mfu"] < 1.5
        assert f"(HFU {record['hfu']:.1%}) | ETA" in line


def test_no_mfu_without_a_known_peak(tiny_lm_config, tmp_path, capfd):
    jobs.train(tiny_lm_config(steps=2, log_every=1), str(tmp_path / "run"), devices=ONE_DEVICE)
    assert "MFU" not in capfd.readouterr().out  # a CPU is in no spec table
    assert all("mfu" not in r and "hfu" not in r for r in _train_records(tmp_path / "run"))


def test_peak_flops_from_the_spec_table_or_the_override():
    def devices(kind, n):
        return [types.SimpleNamespace(device_kind=kind)] * n

    assert metrics.peak_flops(devices("TPU v4", 8)) == 8 * 275e12
    # jax calls v5e 'TPU v5 lite' and v5p 'TPU v5': the one must not take the other's peak.
    assert metrics.peak_flops(devices("TPU v5 lite", 4)) == 4 * 197e12
    assert metrics.peak_flops(devices("TPU v5", 4)) == 4 * 459e12
    assert metrics.peak_flops(devices("TPU v6 lite", 4)) == 4 * 918e12
    assert metrics.peak_flops(devices("NVIDIA H200", 1)) == 989e12
    assert metrics.peak_flops(devices("NVIDIA H100 80GB HBM3", 2)) == 2 * 989e12
    assert metrics.peak_flops(devices("cpu", 4)) is None
    assert metrics.peak_flops(devices("cpu", 4), override=1e12) == 4e12


def test_a_long_eval_pass_says_where_it_is_every_interval():
    """A beam search over a validation split ran for minutes without a line (the real-text
    tutorial's translation: 8 min of silence after the last train step)."""
    import io

    now = [0.0]
    out = io.StringIO()
    progress = metrics.EvalProgress(total=6, every_s=30.0, stream=out, clock=lambda: now[0])
    for seconds in (10, 25, 40, 50, 70, 80):  # a batch ends at each
        now[0] = seconds
        progress.update()
    assert out.getvalue().splitlines() == [
        "eval: batch 3/6 | 0:00:40 so far | ETA 0:00:40",
        "eval: batch 5/6 | 0:01:10 so far | ETA 0:00:14",
    ]
    quiet = io.StringIO()
    unsized = metrics.EvalProgress(every_s=30.0, stream=quiet, clock=lambda: now[0])
    now[0] = 200.0
    unsized.update()
    assert quiet.getvalue() == "eval: batch 1 | 0:02:00 so far\n"


def test_a_short_eval_pass_prints_no_progress(tiny_lm_config, tmp_path, capfd):
    jobs.train(tiny_lm_config(steps=2, log_every=2), str(tmp_path / "run"), devices=ONE_DEVICE)
    assert "eval: batch" not in capfd.readouterr().out
