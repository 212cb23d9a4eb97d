"""benchmarks.step: its FLOPs count, its outputs, and that its PyTorch peers are our models."""

import json
import math
import os
import sys
import threading
import time

import flax.linen as nn
import jax
import numpy as np
import pytest
from flax import traverse_util

from benchmarks import peers, step, step_report
from zoo.nn.recurrent import RNN


def _abstract_params(task):
    return nn.unbox(jax.eval_shape(task.init_params, jax.random.key(0)))


def _kernel_weights(params, under: str) -> int:
    """Weights of every matmul kernel below the `under` subtree (a hand count from shapes)."""
    flat = traverse_util.flatten_dict(params, sep="/")
    return sum(int(np.prod(v.shape)) for k, v in flat.items()
               if k.startswith(under + "/") and k.endswith("/kernel"))


def test_bert_flops_per_token_is_a_hand_count_of_its_matmuls():
    config = step.job_config("bert", "tiny", 16, 2, "float32")
    task = step.make_task("bert", config, 2048)
    params = _abstract_params(task)
    cfg = task.model_config
    h, layers, t, v = cfg.hidden_size, cfg.num_layers, 16, cfg.vocab_size
    p = config.data.max_predictions_per_seq
    assert p == 2  # round(16 * 5 / 32)
    # q, k, v, out and the two FFN kernels of every layer, read off the model's own params
    encoder = _kernel_weights(params, "bert/encoder")
    assert encoder == layers * (4 * h * h + 2 * h * cfg.intermediate_size)
    # scores (T keys per query) + weighted values: 2 * 2 T H per token per layer, x3 with backward
    attention = 3 * 4 * t * h * layers
    # transform (H x H) + tied decoder (H x V) at P of T positions, forward and backward
    head = 6 * (h * h + h * v) * p / t
    assert task.flops_per_token() == pytest.approx(6 * encoder + attention + head, rel=1e-12)


def test_gpt_flops_per_token_counts_the_tied_output_and_halves_causal_attention():
    config = step.job_config("gpt", "tiny", 16, 2, "float32")
    task = step.make_task("gpt", config, 1024)
    params = _abstract_params(task)
    cfg = task.model_config
    d, layers, t = cfg.embed_dim, cfg.num_layers, 16
    stack = _kernel_weights(params, "h")
    assert stack == layers * (4 * d * d + 2 * d * cfg.mlp_dim)
    n = stack + params["wte"]["embedding"].size  # the output projection is the tied wte
    bidirectional_attention = 3 * 4 * t * d * layers
    assert task.flops_per_token() == pytest.approx(6 * n + bidirectional_attention / 2,
                                                   rel=1e-12)
    # and the halving is really there: doubling T adds half of what a bidirectional model adds
    longer = step.make_task("gpt", step.job_config("gpt", "tiny", 32, 2, "float32"), 1024)
    assert longer.flops_per_token() - task.flops_per_token() == pytest.approx(
        6 * layers * 16 * d)


def _micro_run_writes_every_output(tmp_path, model: str, lstm: bool):
    """The CLI end to end at a micro config (seq 16, batch 2, 2 steps, peers on): every output
    file, the documented keys, finite positive numbers that agree with each other."""
    out, profile = tmp_path / "out", tmp_path / "profile"
    summary = step.main(["--quick", "--models", model, "--sizes", "tiny", "--seq-lens", "16",
                         "--batch", "2", "--steps", "2", "--lstm", "8x16" if lstm else "none",
                         "--out", str(out), "--profile", str(profile)])
    have_torch = peers.unavailable_reason() is None
    for name in ("step.jsonl", "step_summary.json", "step.md", "step.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "step_summary.json").read_text()) == json.loads(json.dumps(summary))
    traces = [f for _, _, files in os.walk(profile / f"{model}-tiny-16") for f in files]
    assert any(f.endswith(".xplane.pb") for f in traces), traces

    records = [json.loads(line) for line in (out / "step.jsonl").read_text().splitlines()]
    expected = {"machine", "train_step", "forward"}
    if lstm:
        expected |= {"lstm_forward", "lstm_train"}
    if have_torch:
        expected |= {"peer_forward", "peer_train_step"}
        expected |= {"peer_lstm_forward", "peer_lstm_train"} if lstm else set()
    assert {r["kind"] for r in records} == expected
    for r in records:
        if r["kind"] != "machine":
            assert r["median_s"] > 0 and r["min_s"] <= r["median_s"], r

    assert summary["matmul_flops"] > 0 and summary["peak_flops_spec"] is None  # a CPU
    assert set(summary["flops_formulas"]) == {model}
    (r,) = summary["configs"]
    assert (r["model"], r["size"], r["seq_len"], r["batch"]) == (model, "tiny", 16, 2)
    for key in ("tokens_per_s", "step_s", "compile_s", "forward_s", "flops_per_token",
                "model_flops_per_s", "mfu_vs_matmul"):
        assert math.isfinite(r[key]) and r[key] > 0, (key, r)
    assert r["mfu_spec"] is None
    # No --hf-flax-python: the HF Flax column is absent with its reason.
    assert r["hf_flax"] == {"skipped": step.hf_flax_absent(model, None)}
    assert r["tokens_per_step"] == 2 * 16
    assert r["tokens_per_s"] == pytest.approx(32 / r["step_s"])
    assert r["mfu_vs_matmul"] == pytest.approx(
        r["flops_per_token"] * 32 / r["step_s"] / summary["matmul_flops"])
    assert r["flops_formula"] == step.FLOPS_FORMULAS[model]
    # The dry run's estimate beside XLA's count for the compiled step (no allocator peak on a
    # CPU): the same order, the estimate's model being params, grads, update, Adam's moments
    # and the activations.
    assert r["process_peak_memory_bytes"] is None and r["dry_run_vs_peak"] is None
    assert r["dry_run_vs_program"] == pytest.approx(r["dry_run_bytes"] / r["program_bytes"])
    assert 0.5 < r["dry_run_vs_program"] < 2.0, r
    if have_torch:
        peer = r["peer"]
        assert peer["params"] == r["params"]
        assert peer["step_ratio"] == pytest.approx(r["step_s"] / peer["step_s"])
        assert peer["forward_ratio"] == pytest.approx(r["forward_s"] / peer["forward_s"])
        assert all(math.isfinite(peer[k]) and peer[k] > 0
                   for k in ("step_s", "forward_s", "tokens_per_s", "step_ratio_min"))
    else:
        assert "not installed" in r["peer"]["skipped"]
    if lstm:
        # One row per backend of this platform (a CPU: the scan and the fused kernel), each
        # against the same torch measurements, timed in the same alternation.
        rows = summary["lstm"]
        assert [row["backend"] for row in rows] == ["scan", "cpu_fused"]
        for row in rows:
            assert (row["n"], row["d"], row["batch"]) == (8, 16, 2)
            assert row["forward_s"] > 0 and row["train_s"] > 0
            if have_torch:
                assert row["peer"] == dict(rows[0]["peer"], **{
                    k: row["peer"][k] for k in ("forward_ratio", "train_ratio",
                                                "train_ratio_min", "forward_ratio_interval",
                                                "train_ratio_interval")})
                assert row["peer"]["train_ratio"] == pytest.approx(
                    row["train_s"] / row["peer"]["train_s"])
        assert {r["backend"] for r in records if r["kind"].startswith("lstm_")} == {
            "scan", "cpu_fused"}
        assert "| 8 | 16 | cpu_fused |" in (out / "step.md").read_text()
        assert all(row["calls_start_idle"] for row in rows)
        assert "each call started with the process idle" in (out / "step.md").read_text()
        if have_torch:  # each ratio in turns with the interval of its per-turn ratios
            for row in rows:
                interval = row["peer"]["train_ratio_interval"]
                assert interval["turns"] == summary["lstm_repeats"]
                assert interval["low"] <= interval["ratio"] <= interval["high"]
            assert "interval of the median of its per-turn ratios" in (out / "step.md").read_text()
    else:
        assert summary["lstm"] == []
    table = (out / "step.md").read_text()
    assert f"| {model} | tiny | 16 | 2 |" in table
    assert step.FLOPS_FORMULAS[model] in table
    assert "| dry run GiB | XLA GiB | peak GiB |" in table
    assert "HF Flax peer (GPT) absent: --hf-flax-python not given" in table


# Classes, so pytest-xdist's loadscope may give the two compile-heavy runs different workers.
class TestBertRun:
    @pytest.mark.slow
    def test_micro_run_writes_every_output(self, tmp_path):
        _micro_run_writes_every_output(tmp_path, "bert", lstm=True)


class TestGptRun:
    @pytest.mark.slow
    def test_micro_run_writes_every_output(self, tmp_path):
        _micro_run_writes_every_output(tmp_path, "gpt", lstm=False)


def test_append_merges_a_run_into_earlier_results(tmp_path):
    def run(rows, wall):
        return dict(machine="m", preset="full", dtype="bfloat16", wall_s=wall, lstm=[],
                    flops_formulas={r[0]: "f" for r in rows},
                    configs=[dict(model=m, size=z, seq_len=t, step_s=v) for m, z, t, v in rows])

    earlier = run([("bert", "base", 128, 1.0), ("bert", "base", 512, 2.0)], 10.0)
    (tmp_path / "step_summary.json").write_text(json.dumps(earlier))
    (tmp_path / "step.jsonl").write_text('{"kind": "machine"}\n{"kind": "train_step"}\n')
    later = run([("bert", "base", 512, 3.0), ("gpt", "124M", 128, 4.0)], 5.0)
    summary, records = step_report.merge(str(tmp_path), later,
                                         [{"kind": "machine"}, {"kind": "forward"}])
    assert [(r["model"], r["seq_len"], r["step_s"]) for r in summary["configs"]] == [
        ("bert", 128, 1.0), ("bert", 512, 3.0), ("gpt", 128, 4.0)]
    assert set(summary["flops_formulas"]) == {"bert", "gpt"} and summary["wall_s"] == 15.0
    assert [r["kind"] for r in records] == ["machine", "train_step", "forward"]
    with pytest.raises(ValueError, match="--append: .*dtype"):
        step_report.merge(str(tmp_path), dict(later, dtype="float32"), [])
    # An LSTM-only run (--models none) keeps the header the kept configs were measured with.
    lstm_only = dict(run([], 1.0), matmul_flops=2.0, lstm=[dict(batch=1, n=2, d=3)])
    summary, _ = step_report.merge(str(tmp_path), lstm_only, [])
    assert "matmul_flops" not in summary and summary["lstm"] == lstm_only["lstm"]
    assert len(summary["configs"]) == 2


def test_peers_are_skipped_with_a_reason_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    assert "not installed" in peers.unavailable_reason("cpu")


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="--sizes"):
        step.parse_args(["--models", "gpt", "--sizes", "base"])
    with pytest.raises(ValueError, match="--lstm"):
        step.parse_args(["--lstm", "64by128"])
    with pytest.raises(ValueError, match="--lstm-repeats"):
        step.parse_args(["--lstm-repeats", "-1"])
    with pytest.raises(ValueError, match="--lstm-backends='scan,fast'.*cpu_fused"):
        step.parse_args(["--lstm-backends", "scan,fast"])


def test_each_platform_times_its_fused_lstm_beside_the_scan():
    assert step.lstm_backends("cpu") == ("scan", "cpu_fused")
    assert step.lstm_backends("gpu") == ("scan", "cudnn")
    assert step.lstm_backends("tpu") == ("scan",)
    assert step.parse_args(["--lstm-backends", "cpu_fused"]).lstm_backends == ("cpu_fused",)


def test_models_none_runs_the_lstm_alone():
    args = step.parse_args(["--models", "none", "--lstm", "128x256"])
    assert args.models == () and args.lstm == ((128, 256),)
    assert args.lstm_repeats == step.PRESETS["quick"]["lstm_repeats"]


def test_lstm_sides_are_timed_in_turns():
    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in ("ours", "theirs")}
    t = step.time_alternating(calls, warmup=1, repeats=3)
    assert order == ["ours", "theirs"] * 4  # warm-up, then turn by turn: a load change hits both
    assert t["ours"]["repeats"] == 3 and t["theirs"]["min_s"] <= t["theirs"]["median_s"]
    assert len(t["ours"]["samples_s"]) == 3  # turn by turn, for the per-turn ratios


def test_only_work_on_the_cpu_waits_for_an_idle_process(monkeypatch):
    """An accelerator's kernels do not share the CPU's cores with threads left spinning, and a
    GPU process may keep a host thread busy: there no call waits (it would wait 1 s each)."""
    waits = []
    monkeypatch.setattr(step.machine, "wait_until_idle", lambda *a, **k: waits.append(1))
    calls = {"ours": lambda: None, "theirs": lambda: None}
    step.time_alternating(calls, warmup=1, repeats=3)
    assert len(waits) == 6  # before each timed call, not the warm-up's
    waits.clear()
    step.time_alternating(calls, warmup=1, repeats=3, settle=False)
    assert waits == []


def test_the_hf_flax_paragraph_reads_its_timing_from_the_rows_timed_beside_it():
    """A run of BERT and GPT: BERT's row has no HF Flax turns, so it neither hides the idle
    starts of GPT's nor counts as one; rows from before the idle starts say nothing of them."""
    bert = {"hf_flax": {"skipped": "the HF Flax peer is GPT's only"}}
    gpt = {"hf_flax": {"step_ratio": 1.0, "steps_start_idle": True,
                       "step_ratio_interval": {"ratio": 1.0, "low": 0.9, "high": 1.1}}}
    older = {"hf_flax": {"step_ratio": 1.0}}
    text = step_report._hf_flax_timing([bert, gpt])
    assert "Each step started with both processes idle" in text and "per-turn ratios" in text
    assert "idle" not in step_report._hf_flax_timing([gpt, older])
    assert step_report._hf_flax_timing([bert]) == ""


def test_a_side_in_turns_does_not_run_into_threads_the_other_left_spinning():
    """torch's OpenMP workers spin ~20 ms after its call returns; the next side's timed call
    must start after they stop, not share the cores with them."""
    def leaves_a_thread_spinning():
        def spin():
            end = time.perf_counter() + 0.15
            while time.perf_counter() < end:
                pass
        threading.Thread(target=spin, daemon=True).start()

    busy = []

    def probe():  # the CPU this process used while the probe slept
        cpu = time.process_time()
        time.sleep(0.02)
        busy.append(time.process_time() - cpu)

    step.time_alternating({"torch-like": leaves_a_thread_spinning, "ours": probe}, warmup=0,
                          repeats=2)
    assert max(busy) < 0.005, busy


@pytest.mark.slow
@pytest.mark.parametrize("model,vocab", [("bert", 2048), ("gpt", 1024)])
def test_hf_peer_is_our_model(model, vocab):
    """Same parameter count, and with our weights copied in, the same loss on the same batch:
    the peer does our computation, so the ratio compares implementations."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from zoo.convert import bert as bert_convert
    from zoo.convert import gpt2 as gpt2_convert

    task = step.make_task(model, step.job_config(model, "tiny", 16, 2, "float32"), vocab)
    params = jax.jit(task.init_params)(jax.random.key(0))  # jitted: eager Linen is slow
    batch = task.init_batch()
    sums = jax.jit(task.loss_fn, static_argnums=3)(params, batch, jax.random.key(1), False)
    ours = float(sums["loss_sum"] / sums["weight_sum"])
    if model == "bert":
        hf, state = peers.hf_bert(task.model_config), bert_convert.params_to_hf(
            params, task.model_config, heads="pretraining")
        # mlm_nsp's objective is the mean MLM loss + the mean NSP loss (its docstring)
        mlm_w, nsp_w = float(sums["mlm_weight_sum"]), float(sums["nsp_weight_sum"])
        ours = float(sums["mlm_loss_sum"]) / mlm_w + float(sums["nsp_loss_sum"]) / nsp_w
        loss = peers.bert_loss
    else:
        hf, state = peers.hf_gpt2(task.model_config), gpt2_convert.params_to_hf(
            params, task.model_config)
        loss = peers.gpt2_loss
    assert peers.num_params(hf) == step.count_params(params)
    hf.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in state.items()})
    hf.eval()
    with torch.no_grad():
        theirs = float(loss(hf, peers.to_torch(batch)))
    np.testing.assert_allclose(theirs, ours, rtol=1e-5)


def test_torch_lstm_has_our_parameters_plus_its_second_bias():
    pytest.importorskip("torch")
    n, d = 8, 16
    params = jax.eval_shape(RNN(hidden_size=d, cell="lstm").init, jax.random.key(0),
                            jax.ShapeDtypeStruct((2, n, d), np.float32))
    ours = step.count_params(params)
    assert ours == 4 * d * (d + d) + 4 * d  # input + recurrent kernels (i, f, g, o), one bias
    # torch keeps b_ih and b_hh, which only ever add (zoo.nn.recurrent imports them summed)
    assert peers.num_params(peers.torch_lstm(d, d)) == ours + 4 * d


def _hf_flax_python() -> str:
    """The python of a venv with transformers 4.x and flax (benchmarks/hf_flax_peer.py's), from
    ZOO_HF_FLAX_PYTHON or /tmp/hfflax; the test is skipped without one."""
    python = os.environ.get("ZOO_HF_FLAX_PYTHON", "/tmp/hfflax/bin/python")
    if not os.path.exists(python):
        pytest.skip(f"no HF Flax venv at {python} (set ZOO_HF_FLAX_PYTHON; make one with: "
                    f"{peers.HF_FLAX_VENV})")
    return python


@pytest.mark.slow
def test_hf_flax_peer_has_our_parameters_and_is_timed_in_turns():
    python = _hf_flax_python()
    config = step.job_config("gpt", "tiny", 16, 2, "float32")
    task = step.make_task("gpt", config, 1024)
    settings = peers.hf_flax_settings(task.model_config, config.optim, 2, 16, warmup=1)
    calls = []
    out = step.time_beside_hf_flax(lambda: calls.append(1), python, settings, repeats=3)
    row = out["row"]
    assert row["params"] == step.count_params(_abstract_params(task))
    assert row["transformers"].startswith("4.") and len(calls) == 3
    assert row["step_ratio"] == pytest.approx(row["ours_step_s"] / row["step_s"])
    assert row["steps_start_idle"]  # both processes idle before each step
    interval = row["step_ratio_interval"]  # of the per-turn ratios
    assert interval["turns"] == 3 and interval["low"] <= interval["ratio"] <= interval["high"]
    assert out["records"]["hf_flax_train_step"]["repeats"] == 3


def test_without_an_hf_flax_venv_the_column_says_why(tmp_path):
    assert "--hf-flax-python not given" in step.hf_flax_absent("gpt", None)
    assert "GPT's only" in step.hf_flax_absent("bert", "/some/python")
    with pytest.raises(ValueError, match="cannot run it.*pip install"):
        peers.HFFlaxPeer(str(tmp_path / "no-python"), {})
