"""The scaling benchmark's arithmetic on synthetic data, its FLOP counts against hand counts and
XLA's, and the CLI end to end on a micro grid."""

import json
import math
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import machine, scaling
from benchmarks import scaling_analysis as analysis
from zoo.nn.attention import MultiHeadAttention
from zoo.nn.recurrent import RNN

NS = [64, 128, 256, 512, 1024]


@pytest.mark.parametrize("power", [1.0, 2.0, 3.0])
def test_fit_slope_recovers_known_exponent(power):
    times = [3e-9 * n**power for n in NS]
    fit = analysis.fit_slope(NS, times, floor_s=1e-12)
    np.testing.assert_allclose(fit["slope"], power, rtol=1e-9)
    assert fit["points"] == NS


def test_fit_slope_drops_points_near_the_dispatch_floor():
    # Flat at the floor (1e-5 s) until c n^2 takes over: fitting every point would flatten the
    # slope; the rule keeps only points >= 10x the floor.
    floor = 1e-5
    times = [max(floor, 1e-9 * n**2) for n in NS]  # 1e-5, 1.6e-5, 6.6e-5, 2.6e-4, 1.05e-3
    fit = analysis.fit_slope(NS, times, floor_s=floor)
    assert fit["points"] == [512, 1024]
    np.testing.assert_allclose(fit["slope"], 2.0, rtol=1e-9)
    assert analysis.fit_loglog(NS, times)[0] < 1.8  # what the floor does to an unfiltered fit
    too_fast = analysis.fit_slope(NS, [floor] * len(NS), floor_s=floor)
    assert too_fast["slope"] is None and "fewer than 2" in too_fast["reason"]


def test_crossover_interpolates_power_laws_exactly():
    # attention-like a n^2 against RNN-like b n: equal at n* = b / a = 300, between grid points
    # 256 and 512; log-log interpolation is exact for power laws.
    a, b = 1e-8, 3e-6
    value, status = analysis.crossover_n(NS, [a * n * n for n in NS], [b * n for n in NS])
    assert status == "crossed"
    np.testing.assert_allclose(value, 300.0, rtol=1e-9)
    # Shuffled input order gives the same answer.
    order = [3, 0, 4, 1, 2]
    value2, _ = analysis.crossover_n([NS[i] for i in order], [a * NS[i] ** 2 for i in order],
                                     [b * NS[i] for i in order])
    np.testing.assert_allclose(value2, 300.0, rtol=1e-9)


def test_crossover_outside_the_sweep_is_null_with_a_status():
    faster = analysis.crossover_n(NS, [1e-9 * n for n in NS], [1e-6 * n for n in NS])
    slower = analysis.crossover_n(NS, [1e-6 * n for n in NS], [1e-9 * n for n in NS])
    assert faster == (None, "not within the sweep")
    assert slower == (None, "slower throughout the sweep")


@pytest.mark.parametrize("d", [64, 256])
def test_flop_crossover_solves_the_per_layer_equation(d):
    # attention 4 n^2 d + 8 n d^2 = LSTM 16 n d^2  ->  n = 2d;  = GRU 12 n d^2  ->  n = d;
    # Elman RNN 4 n d^2 < 8 n d^2 (projections alone): no positive solution.
    np.testing.assert_allclose(analysis.flop_crossover_n("attention_einsum", "lstm", d), 2 * d)
    np.testing.assert_allclose(analysis.flop_crossover_n("attention_einsum", "gru", d), d)
    assert analysis.flop_crossover_n("attention_einsum", "rnn", d) is None
    assert analysis.flop_crossover_n("encoder_layer", "lstm", d) is None


def _xla_flops(module, x, extract=lambda y: y):
    params = module.init(jax.random.key(0), x)
    fn = jax.jit(lambda p, x: extract(module.apply(p, x)))
    return machine.compile_stats(fn, params, x)["xla_flops"]


def test_attention_flops_hand_count_and_xla():
    b, n, d, h = 1, 32, 64, 4
    hand = (4 * 2 * b * n * d * d  # q, k, v, out: (b n, d) @ (d, d)
            + 2 * b * h * n * n * (d // h)  # q k^T per head
            + 2 * b * h * n * n * (d // h))  # weights @ v per head
    assert analysis.analytic_flops("attention_einsum", "forward", n, d, b) == hand
    assert analysis.analytic_flops("attention_einsum", "forward_backward", n, d, b) == 3 * hand
    x = jnp.ones((b, n, d))
    xla = _xla_flops(MultiHeadAttention(num_heads=h), x)
    # XLA adds the element-wise work (softmax, biases, scaling): a few percent at this size.
    assert hand <= xla <= 1.05 * hand


def test_conv_flops_hand_count_and_xla():
    b, n, d, k = 1, 32, 64, 3
    hand = 2 * k * d * d * n * b
    assert analysis.analytic_flops("conv", "forward", n, d, b, kernel=k) == hand
    conv, x = nn.Conv(d, (k,), padding="SAME"), jnp.ones((b, n, d))
    # XLA skips the k - 1 zero-padded taps at the ends and adds the bias: within 3%.
    np.testing.assert_allclose(_xla_flops(conv, x), hand, rtol=0.03)
    # The benchmark's forward+backward program keeps the forward: 3x (a loss of sum(y) would
    # let XLA drop it as dead code for this linear layer, leaving 2x).
    params = conv.init(jax.random.key(0), x)
    both = machine.compile_stats(scaling.make_fn(conv, lambda y: y, "forward_backward"),
                                 params, x)["xla_flops"]
    assert analysis.analytic_flops("conv", "forward_backward", n, d, b, kernel=k) == 3 * hand
    np.testing.assert_allclose(both, 3 * hand, rtol=0.03)


def test_xla_counts_a_scan_body_once_not_per_step():
    # The documented under-count (XLA_LOOP_NOTE): XLA reports the LSTM's input projection for all
    # T steps (outside the loop) plus ONE recurrent step, not T of them.
    b, t, d = 1, 32, 64
    lstm = 2 * 4 * (d + d) * d * t * b  # 4 gates, input and recurrent matmuls, T steps
    assert analysis.analytic_flops("lstm", "forward", t, d, b) == lstm
    xla = _xla_flops(RNN(d, cell="lstm"), jnp.ones((b, t, d)), extract=lambda y: y[0])
    projection_plus_one_step = 2 * b * t * d * 4 * d + 2 * b * d * 4 * d
    np.testing.assert_allclose(xla, projection_plus_one_step, rtol=0.03)
    assert xla < 0.6 * lstm


def test_sequential_ops_and_path_length():
    assert analysis.sequential_ops("lstm", 100) == 100
    assert analysis.sequential_ops("attention_einsum", 100) == 1
    assert analysis.sequential_ops("conv", 100) == 1
    assert analysis.max_path_length("gru", 100) == 100
    assert analysis.max_path_length("encoder_layer", 100) == 1
    # ceil(log_k n): 9 positions need 2 layers of kernel 3 (3^2 = 9), 10 need 3.
    assert analysis.max_path_length("conv", 9, kernel=3) == 2
    assert analysis.max_path_length("conv", 10, kernel=3) == 3
    assert analysis.max_path_length("conv", 1024, kernel=2) == 10


def test_project_oom_n_solves_the_fitted_quadratic():
    ns = [64, 128, 256, 512]
    nbytes = [1e4 + 50 * n + 16 * n * n for n in ns]
    limit = 2**34
    expected = (-50 + math.sqrt(50**2 - 4 * 16 * (1e4 - limit))) / (2 * 16)
    np.testing.assert_allclose(analysis.project_oom_n(ns, nbytes, limit), expected, rtol=1e-6)
    # Two points: c n^2 through the largest, so n = n_max sqrt(limit / bytes(n_max)).
    two = analysis.project_oom_n([256, 512], [4.0 * 256**2, 4.0 * 512**2], 4.0 * 4096**2)
    np.testing.assert_allclose(two, 4096.0, rtol=1e-9)


def test_sweep_reuses_resumed_points_skips_slow_ones_and_keeps_budget(monkeypatch):
    measured = []

    def fake_measure(model, pass_, n, module, extract, params, base, warmup, repeats):
        measured.append((model, n))
        return {**base, "model": model, "pass": pass_, "n": n, "status": "ok",
                "median_s": 1e-3 * n}

    monkeypatch.setattr(scaling, "measure", fake_measure)
    monkeypatch.setattr(scaling, "build_model", lambda *args, **kwargs: (None, None))
    monkeypatch.setattr(scaling, "init_params", lambda module, d, dtype: None)
    args = scaling.parse_args(["--n", "8", "16", "32", "--d", "8", "--heads", "2", "--passes",
                               "forward", "--max-call-s", "0.012"])
    previous = [{"model": "rnn", "pass": "forward", "n": 8, "d": 8, "batch": 4, "heads": 2,
                 "kernel": 3, "dtype": "float32", "status": "ok", "median_s": 0.008}]
    written = []
    records, pending = scaling.sweep(args, ["rnn"], previous, time.perf_counter(),
                                     written.append)
    # n=8 comes from the previous run; n=16 is measured (16 ms > 12 ms), so n=32 is skipped.
    assert measured == [("rnn", 16)]
    assert [(r["n"], r["status"]) for r in records] == [(8, "ok"), (16, "ok"), (32, "skipped")]
    assert [r["n"] for r in written] == [16]  # only new measurements are streamed to disk
    assert pending == 0

    args.budget_s = 1.0  # spent before the sweep starts: every point is left for --resume
    records, pending = scaling.sweep(args, ["lstm"], [], time.perf_counter() - 10.0)
    assert (records, pending) == ([], 3)


def test_oom_search_doubles_n_until_resource_exhausted(monkeypatch):
    # No GPU here: fake a device memory limit and a forward that fails above n = 256 the way XLA
    # does (RESOURCE_EXHAUSTED), to check the doubling and what is recorded.
    monkeypatch.setattr(machine, "device_memory_bytes", lambda device=None: 1 << 30)
    monkeypatch.setattr(scaling, "init_params", lambda module, d, dtype: None)
    calls = []

    def fake_make_fn(module, extract, pass_):
        def fn(params, x):
            calls.append(x.shape[1])
            if x.shape[1] > 256:
                raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")
            return x

        return fn

    monkeypatch.setattr(scaling, "make_fn", fake_make_fn)
    args = scaling.parse_args(["--n", "128", "256", "--d", "8", "--heads", "2", "--passes",
                               "forward"])
    swept = [{"model": "attention_einsum", "pass": "forward", "d": 8, "n": 256, "status": "ok"}]
    result = scaling.oom_search(args, ["attention_einsum", "attention_dot_product"], swept,
                                time.perf_counter())
    assert result["method"] == "measured"
    # einsum starts above its largest swept n (32); dot_product, never swept, at the smallest.
    assert result["paths"]["attention_einsum"]["forward"] == {"status": "oom", "last_n_fit": 256,
                                                              "n_oom": 512}
    assert result["paths"]["attention_dot_product"]["forward"] == {
        "status": "oom", "last_n_fit": 256, "n_oom": 512}
    assert calls == [512, 128, 256, 512]

    def broken_make_fn(module, extract, pass_):
        def fn(params, x):
            raise ValueError("a bug, not memory")

        return fn

    monkeypatch.setattr(scaling, "make_fn", broken_make_fn)
    with pytest.raises(ValueError, match="a bug"):  # only memory errors end the search quietly
        scaling.oom_search(args, ["attention_einsum"], swept, time.perf_counter())


def test_cli_rejects_heads_that_do_not_divide_d(capsys):
    with pytest.raises(SystemExit):
        scaling.parse_args(["--d", "10", "--heads", "4"])
    assert "--heads 4 does not divide d=[10]" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_end_to_end_writes_every_output(tmp_path):
    summary = scaling.main(["--n", "8", "16", "--d", "8", "--heads", "2", "--repeats", "1",
                            "--models", "attention_einsum", "rnn", "--length-d", "8",
                            "--length-max-n", "2048", "--out", str(tmp_path)])
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {"scaling.jsonl", "summary.json", "scaling.md", "time_vs_n.png",
                     "memory_vs_n.png", "crossover.png", "length_vs_n.png"}
    assert summary["models"]["attention_einsum"]["forward"]["longest_n"] == 2048
    records = [json.loads(line) for line in (tmp_path / "scaling.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 2 * 2  # models x passes x n
    for r in records:
        assert r["status"] == "ok"
        for key in ("model", "pass", "n", "d", "batch", "heads", "kernel", "median_s", "min_s",
                    "xla_flops", "analytic_flops", "program_bytes", "peak_bytes", "compile_s",
                    "sequential_ops", "max_path_length"):
            assert key in r, key
        assert r["analytic_flops"] == analysis.analytic_flops(r["model"], r["pass"], r["n"],
                                                              r["d"], r["batch"], r["kernel"])
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["models"].keys() == summary["models"].keys() == {"attention_einsum", "rnn"}
    for key in ("machine", "jax_version", "command", "date", "dispatch_floor_s", "oom"):
        assert key in on_disk, key
    for entry in on_disk["models"].values():
        for pass_ in analysis.PASSES:
            assert {"slope_n", "slope_d", "crossover_n"} <= entry[pass_].keys()
    # Naive attention against the Elman RNN at d = 8: a crossing or a stated reason; in FLOPs
    # attention never drops below the RNN (8 n d^2 of projections alone > 4 n d^2).
    attention = on_disk["models"]["attention_einsum"]["forward"]
    assert set(attention["crossover_n"]["8"]) == {"rnn"}
    assert attention["crossover_status"]["8"]["rnn"] in (
        "crossed", "not within the sweep", "slower throughout the sweep")
    assert attention["flop_crossover_n"]["8"]["rnn"] is None
    assert on_disk["models"]["rnn"]["sequential_ops_at_n_max"] == 16
    assert on_disk["models"]["rnn"]["forward"]["crossover_n"] == {}  # only attention crosses
    oom = on_disk["oom"]
    assert oom["method"] == "projected"
    for pass_ in analysis.PASSES:
        assert oom["paths"]["attention_einsum"][pass_]["status"] == "projected"
        assert oom["paths"]["attention_einsum"][pass_]["n_oom"] > 16
        assert oom["paths"]["attention_cudnn"][pass_]["status"] == "not available on cpu"
    table = (tmp_path / "scaling.md").read_text()
    assert "| attention_einsum | forward | 8 n d^2 + 4 n^2 d |" in table
    assert "under-count" in table
    for png in ("time_vs_n.png", "memory_vs_n.png", "crossover.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_local_attention_flops_and_path_length():
    d, w, n = 64, analysis.LOCAL_WINDOW, 4096
    c1, c2 = analysis.flop_coefficients("attention_local", d)
    assert (c1, c2) == (8.0 * d * d + 4.0 * (2 * w + 1) * d, 0.0)
    assert analysis.max_path_length("attention_local", n) == -(-(n - 1) // w)
    assert analysis.sequential_ops("torch_lstm", n) == n
    # Linear in n: no crossover with a recurrence in FLOP theory.
    assert analysis.flop_crossover_n("attention_local", "lstm", d) is None


def test_crossover_against_the_fastest_rnn_takes_the_faster_at_each_n():
    base = {"pass": "forward", "d": 8, "status": "ok"}
    times = {"lstm": {64: 1.0, 128: 2.0, 256: 4.0}, "torch_lstm": {64: 0.5, 128: 2.5, 256: 3.0},
             "lstm_fused": {64: 0.6, 128: 2.1, 256: 2.9},
             "attention_einsum": {64: 0.2, 128: 1.0, 256: 3.5}}
    records = [{**base, "model": m, "n": n, "median_s": t}
               for m, by_n in times.items() for n, t in by_n.items()]
    fastest = analysis._reference_series(records, "fastest_lstm", "forward", 8)
    assert fastest == {64: 0.5, 128: 2.0, 256: 2.9}  # torch's, our scan's, our kernel's
    summary = analysis.summarize_pass(records, "attention_einsum", "forward", floor_s=1e-9)
    # einsum/fastest: 0.4, 0.5, 1.21 -> crosses between 128 and 256; ours alone: never.
    assert summary["crossover_status"]["8"]["fastest_lstm"] == "crossed"
    assert 128 < summary["crossover_n"]["8"]["fastest_lstm"] < 256
    assert summary["crossover_status"]["8"]["lstm"] == "not within the sweep"


@pytest.mark.slow
def test_length_search_runs_each_path_until_memory_or_time_stops_it(monkeypatch):
    """Real runs at tiny width: einsum's buffers outgrow a (faked) 150 MiB machine at n=4096
    while blockwise, O(n), runs on until the time limit or --length-max-n."""
    monkeypatch.setattr(machine, "device_memory_bytes", lambda device=None: None)
    monkeypatch.setattr(machine, "available_memory_bytes", lambda: 150 * 2**20)
    args = scaling.parse_args(["--d", "8", "--heads", "2", "--passes", "forward",
                               "--length-d", "8", "--length-max-n", "8192",
                               "--length-max-s", "60"])
    result = scaling.longest_n_search(args, ["attention_einsum", "attention_blockwise"])
    einsum = result["paths"]["attention_einsum"]["forward"]
    blockwise = result["paths"]["attention_blockwise"]["forward"]
    assert einsum["stopped"].startswith("memory: n=") and einsum["longest_n"] < 8192
    assert [r["n"] for r in einsum["runs"]] == [1024 * 2**i for i in range(len(einsum["runs"]))]
    assert blockwise["longest_n"] == 8192 and blockwise["stopped"].startswith("reached")
    assert blockwise["memory_slope_n"] < 1.2 < einsum["memory_slope_n"]
    ratios = result["time_ratios"]["blockwise / einsum"]["forward"]
    assert set(ratios) == {r["n"] for r in einsum["runs"]}

    # A call that would take too long is not started.
    args.length_max_s = 1e-9
    quick = scaling.longest_n_search(args, ["attention_blockwise"])
    only = quick["paths"]["attention_blockwise"]["forward"]
    assert only["longest_n"] == 1024 and only["stopped"].startswith("time: n=2048")


def test_the_fused_lstm_is_the_kernel_backend_and_runs_on_cpus_in_float32_only():
    module, extract = scaling.build_model("lstm_fused", 8, 2, 3, jnp.float32)
    assert (module.cell, module.backend) == ("lstm", "cpu_fused")
    assert analysis.analytic_flops("lstm_fused", "forward", 16, 8) == analysis.analytic_flops(
        "lstm", "forward", 16, 8)
    assert "lstm_fused" in analysis.FASTEST["fastest_lstm"]
    assert scaling.unavailable_models(["lstm_fused"], jnp.float32) == {}
    (reason,) = scaling.unavailable_models(["lstm_fused"], jnp.bfloat16).values()
    assert "float32 only" in reason
