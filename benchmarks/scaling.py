"""`python -m benchmarks.scaling`: how self-attention, recurrences and convolution scale with
sequence length n and width d (issue 8).

Every model is zoo's own layer, the one users train: `MultiHeadAttention` with backend 'einsum'
(naive: writes out the [b, h, n, n] weights, which a training step keeps for the backward pass;
XLA may fuse them away in a forward-only program), 'dot_product' (`jax.nn.dot_product_attention`,
XLA), 'cudnn' (the fused flash kernel; GPU and bf16/fp16 only, otherwise skipped with the
reason recorded), 'blockwise' (exact attention in O(n) memory, zoo.nn.blockwise_attention) and
'local' (blockwise over a window of --window keys either side: O(n w d)); `RNN` with cell 'rnn'
(Elman), 'lstm', 'gru' (a `lax.scan` over n steps), 'lstm_fused' (the LSTM with
backend='cpu_fused': the recurrence as zoo's C++ kernel, CPU and float32 only) and, as the
fastest RNNs a user could pick, torch.nn.LSTM / GRU (the 'parity' extra; crossovers are also
measured against the fastest of ours and torch's); `flax.linen.Conv` (kernel k, 'SAME'); and a whole `EncoderLayer` (mlp_dim
4d) to set against an LSTM layer. Forward = `apply`; forward+backward = `jax.grad` of half the outputs' sum of squares
w.r.t. params and inputs (a plain sum would let XLA drop a linear layer's forward pass). Each point is jitted on fixed shapes with inputs from a fixed key, sized by XLA
(`benchmarks.machine.compile_stats`: FLOPs, program buffers) before its first run, then timed
(`time_call`: warm-up, block_until_ready, median of repeats).

Presets: `--quick` (the default; about 2 minutes on a quiet 2-core CPU) and `--full` (a GPU:
n up to 16k, d up to 1024, bf16, more repeats; it stops starting new points after --budget-s
and resumes from the results already in the output directory on the next run, so repeat the
same command until it prints 'complete'). Any preset value can be overridden (--n, --d, ...).

Out of memory: on a device with a memory limit, n doubles past the sweep for every attention
path and pass until XLA raises RESOURCE_EXHAUSTED; on the CPU the n at which the program's
buffers would fill the RAM is projected from the sweep (`oom_search`).

How long an input each attention path takes (`longest_n_search`, --length): at batch 1, width
--length-d and --heads heads, n doubles from 1024 and every length is really run, until the
next one would not fit (XLA's compiled buffers for it against the memory available now) or
would take longer than --length-max-s (its time extrapolated from the last run's).

Outputs in benchmarks/results/<machine>/ (or --out): scaling.jsonl (every measurement),
summary.json (per model and pass: slope_n, slope_d, per d crossover_n; see
benchmarks.scaling_analysis), scaling.md, time_vs_n.png, memory_vs_n.png, crossover.png.
"""

import argparse
import datetime
import json
import os
import sys
import time
from collections.abc import Callable, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from benchmarks import machine, peers, scaling_plots
from benchmarks import scaling_analysis as analysis
from benchmarks.scaling_length import longest_n_search
from benchmarks.scaling_models import (DTYPES, build_model, init_params, make_fn,
                                       unavailable_models)
from zoo import errors

PRESETS = {
    # Compilation dominates on a 2-core CPU (~1 s a point), so the quick grid measures every
    # (n, d) only for the models the crossover needs (naive attention, Elman RNN, LSTM) and the
    # rest on a cross: every n at the largest d, every d at the largest n.
    "quick": {"n": [128, 256, 512, 1024], "d": [64, 256], "batch": 4, "heads": 4,
              "kernel": 3, "repeats": 3, "warmup": 1, "dtype": "float32", "max_call_s": 1.0,
              "budget_s": None, "resume": False, "oom_max_n": 1 << 17,
              "cross_models": ["attention_dot_product", "attention_local", "gru", "torch_gru",
                               "conv", "encoder_layer"],
              "length_d": 256, "length_max_s": 60.0, "length_max_n": 1 << 20},
    "full": {"n": [256, 512, 1024, 2048, 4096, 8192, 16384], "d": [256, 512, 1024],
             "batch": 8, "heads": 8, "kernel": 3, "repeats": 5, "warmup": 1,
             "dtype": "bfloat16", "max_call_s": 5.0, "budget_s": 540.0, "resume": True,
             "oom_max_n": 1 << 20, "cross_models": [],
             "length_d": 256, "length_max_s": 20.0, "length_max_n": 1 << 22},
}
# The paths whose memory grows with n^2: the OOM search (the length search covers the rest).
OOM_PATHS = ("attention_einsum", "attention_dot_product", "attention_cudnn")
# The OOM search stops doubling n once the next call would take longer than this (time, not
# memory, became the limit).
OOM_MAX_CALL_S = 30.0
RECORDS_FILE, SUMMARY_FILE, TABLE_FILE = "scaling.jsonl", "summary.json", "scaling.md"


def _is_oom(error: Exception) -> bool:
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def dispatch_floor_s(repeats: int = 50) -> float:
    """Median time of an almost empty jitted call: the fixed cost under every measurement."""
    add_one = jax.jit(lambda x: x + 1)
    return machine.time_call(add_one, jnp.zeros((8,)), warmup=2, repeats=repeats)["median_s"]


def _key(r: dict) -> tuple:
    return (r["model"], r["pass"], r["n"], r["d"], r["batch"], r["heads"], r["kernel"],
            r["dtype"])


def measure(model: str, pass_: str, n: int, module: nn.Module, extract: Callable, params,
            base: dict, warmup: int, repeats: int) -> dict:
    """One point: XLA's sizes of the compiled program, then its wall time. An out-of-memory
    error gives a record with status 'oom' instead."""
    record = {**base, "model": model, "pass": pass_, "n": n}
    d, batch = base["d"], base["batch"]
    fn = make_fn(module, extract, pass_)
    try:  # the inputs alone can exhaust a device at the largest n
        x = jax.random.normal(jax.random.key(1), (batch, n, d), DTYPES[base["dtype"]])
        stats = machine.compile_stats(fn, params, x)  # before the first run: see its docstring
        timing = machine.time_call(fn, params, x, warmup=warmup, repeats=repeats)
    except Exception as error:
        if not _is_oom(error):
            raise
        return {**record, "status": "oom", "reason": str(error).splitlines()[0][:200]}
    return {**record, **stats, **timing, "status": "ok",
            "analytic_flops": analysis.analytic_flops(model, pass_, n, d, batch, base["kernel"]),
            "peak_bytes": machine.peak_memory_bytes(),
            "sequential_ops": analysis.sequential_ops(model, n),
            "max_path_length": analysis.max_path_length(model, n, base["kernel"])}


def measure_torch(model: str, pass_: str, n: int, base: dict, warmup: int,
                  repeats: int) -> dict:
    """One point of a torch RNN (`model` 'torch_lstm' / 'torch_gru'): its wall time, on the
    device JAX runs on."""
    device = "cuda" if jax.devices()[0].platform == "gpu" else "cpu"
    timing = peers.time_recurrent(model.removeprefix("torch_"), pass_, base["batch"], n,
                                  base["d"], device=device, warmup=warmup, repeats=repeats)
    return {**base, "model": model, "pass": pass_, "n": n, **timing, "status": "ok",
            "analytic_flops": analysis.analytic_flops(model, pass_, n, base["d"], base["batch"]),
            "sequential_ops": analysis.sequential_ops(model, n),
            "max_path_length": analysis.max_path_length(model, n)}


def sweep(args: argparse.Namespace, models: Sequence[str], previous: list[dict], start: float,
          on_record: Callable[[dict], None] = lambda record: None) -> tuple[list[dict], int]:
    """Measures every (model, d, pass, n) not already in `previous`, handing each new record to
    `on_record` at once; returns all the grid's records and how many points were left for a
    later run by --budget-s."""
    dtype = DTYPES[args.dtype]
    done = {_key(r): r for r in previous if r.get("status") in ("ok", "oom")}
    records, pending = [], 0
    for model in models:
        for d in args.d:
            base = {"d": d, "batch": args.batch, "heads": args.heads, "kernel": args.kernel,
                    "dtype": args.dtype}
            module, extract, params = None, None, None
            for pass_ in args.passes:
                stop_reason = None  # once a point is too slow or too big, larger n are skipped
                for n in sorted(args.n):
                    if model in args.cross_models and d != max(args.d) and n != max(args.n):
                        continue
                    key = _key({**base, "model": model, "pass": pass_, "n": n})
                    if stop_reason:
                        records.append({**base, "model": model, "pass": pass_, "n": n,
                                        "status": "skipped", "reason": stop_reason})
                        continue
                    if key in done:
                        record = done[key]
                    elif args.budget_s is not None and time.perf_counter() - start > args.budget_s:
                        pending += 1
                        continue
                    else:
                        if model in analysis.TORCH_MODELS:
                            record = measure_torch(model, pass_, n, base, args.warmup,
                                                   args.repeats)
                        else:
                            if params is None:
                                module, extract = build_model(model, d, args.heads, args.kernel,
                                                              dtype, block=args.block,
                                                              window=args.window)
                                params = init_params(module, d, dtype)
                            record = measure(model, pass_, n, module, extract, params, base,
                                             args.warmup, args.repeats)
                        _progress(record)
                        on_record(record)
                    records.append(record)
                    if record["status"] == "oom":
                        stop_reason = f"n={n} ran out of memory"
                    elif record["median_s"] > args.max_call_s:
                        stop_reason = (f"n={n} took {record['median_s']:.2f} s > --max-call-s "
                                       f"{args.max_call_s:g}")
    return records, pending


def _progress(record: dict) -> None:
    time_ms = f"{record['median_s'] * 1e3:10.3f} ms" if record["status"] == "ok" else record[
        "status"]
    print(f"{record['model']:22s} {record['pass']:16s} n={record['n']:<6d} d={record['d']:<5d} "
          f"{time_ms}", flush=True)


def oom_search(args: argparse.Namespace, models: Sequence[str], records: list[dict],
               start: float) -> dict:
    """The sequence length at which each attention path runs out of memory, per pass.

    With a device memory limit (GPU/TPU): n doubles from the largest n the sweep ran (the
    largest d) until XLA raises RESOURCE_EXHAUSTED; the last n that fit is recorded. On the CPU
    (no limit to hit, no fused kernel): the compiled program's buffers over the sweep at the
    largest d are fitted as a + b n + c n^2 and solved for the machine's RAM ('projected').
    Result: {method, memory_limit_bytes, ..., paths: {path: {pass: {status, last_n_fit,
    n_oom}}}}.
    """
    d = max(args.d)
    paths = [m for m in OOM_PATHS if m in models]
    limit = machine.device_memory_bytes()
    setting = f"batch {args.batch}, d {d}, {args.heads} heads, {args.dtype}"
    swept = {(path, pass_): [r for r in records if r["model"] == path and r["pass"] == pass_
                             and r["d"] == d and r.get("status") == "ok"]
             for path in paths for pass_ in args.passes}
    if limit is None:
        limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        result = {"method": "projected", "memory_limit_bytes": limit,
                  "memory_limit_source": "physical RAM (os.sysconf)", "d": d, "paths": {},
                  "note": (f"{setting}: n at which the compiled program's buffers (arguments + "
                           f"outputs + temporaries, fitted as a + b n + c n^2 over the sweep) "
                           f"reach the RAM, {limit / 2**30:.1f} GiB.")}
        for path in paths:
            for pass_ in args.passes:
                points = [r for r in swept[(path, pass_)] if r.get("program_bytes")]
                if not points:
                    entry = {"status": "not measured at this d"}
                else:
                    entry = {"status": "projected", "last_n_fit": max(r["n"] for r in points),
                             "n_oom": analysis.project_oom_n(
                                 [r["n"] for r in points], [r["program_bytes"] for r in points],
                                 limit)}
                result["paths"].setdefault(path, {})[pass_] = entry
        if jax.devices()[0].platform == "cpu":
            result["paths"]["attention_cudnn"] = {
                pass_: {"status": "not available on cpu"} for pass_ in args.passes}
        return result

    result = {"method": "measured", "memory_limit_bytes": limit,
              "memory_limit_source": "the device allocator's bytes_limit", "d": d, "paths": {},
              "note": (f"{setting}: n doubled until XLA raised RESOURCE_EXHAUSTED (up to "
                       f"--oom-max-n {args.oom_max_n}).")}
    dtype = DTYPES[args.dtype]
    for path in paths:
        module, extract = build_model(path, d, args.heads, args.kernel, dtype)
        params = init_params(module, d, dtype)
        for pass_ in args.passes:
            fn = make_fn(module, extract, pass_)
            # Start above the largest n the sweep already ran (it fits).
            ns = [r["n"] for r in swept[(path, pass_)]]
            last_fit = max(ns) if ns else None
            n = 2 * last_fit if ns else min(args.n)
            status, n_oom = "fits up to --oom-max-n", None
            while n <= args.oom_max_n:
                try:
                    t0 = time.perf_counter()
                    x = jax.random.normal(jax.random.key(1), (args.batch, n, d), dtype)
                    jax.block_until_ready(fn(params, x))
                    seconds = time.perf_counter() - t0  # compile included: an over-estimate
                except Exception as error:
                    if not _is_oom(error):
                        raise
                    status, n_oom = "oom", n
                    break
                del x  # free it before the next, twice larger, allocation
                last_fit = n
                print(f"oom search {path:22s} {pass_:16s} n={n:<8d} fits ({seconds:.2f} s)",
                      flush=True)
                # Attention's time grows ~4x per doubling: stop before a call runs too long or
                # the run's budget would be spent.
                if 4 * seconds > OOM_MAX_CALL_S:
                    status = f"time-limited: n={2 * n} would take ~{4 * seconds:.0f} s"
                    break
                if (args.budget_s is not None
                        and time.perf_counter() - start + 4 * seconds > args.budget_s):
                    status = "time-limited: --budget-s would be exceeded"
                    break
                n *= 2
            result["paths"].setdefault(path, {})[pass_] = {
                "status": status, "last_n_fit": last_fit, "n_oom": n_oom}
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.scaling",
        description="Time, memory and FLOPs of attention, RNN/LSTM/GRU, conv1d and a Transformer "
                    "encoder layer over sequence length n and width d.")
    preset = parser.add_mutually_exclusive_group()
    preset.add_argument("--quick", dest="preset", action="store_const", const="quick",
                        help="small grid, ~2 min on a quiet 2-core CPU (the default)")
    preset.add_argument("--full", dest="preset", action="store_const", const="full",
                        help="GPU grid (n to 16k, d to 1024, bf16); resumes, --budget-s 540")
    parser.add_argument("--n", type=int, nargs="+", help="sequence lengths")
    parser.add_argument("--d", type=int, nargs="+", help="model widths")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--heads", type=int, help="attention heads (must divide every d)")
    parser.add_argument("--kernel", type=int, help="convolution kernel size k")
    parser.add_argument("--repeats", type=int, help="timed calls per point (median reported)")
    parser.add_argument("--warmup", type=int, help="untimed calls before timing")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="compute dtype")
    parser.add_argument("--models", nargs="+", choices=analysis.MODELS, default=None,
                        metavar="MODEL",
                        help="default: all (attention_cudnn skipped where unavailable)")
    parser.add_argument("--cross-models", nargs="*", choices=analysis.MODELS, metavar="MODEL",
                        help="models measured only at the largest d (every n) and the largest n "
                             "(every d) instead of every (n, d); crossovers need the product")
    parser.add_argument("--passes", nargs="+", choices=analysis.PASSES,
                        default=list(analysis.PASSES))
    parser.add_argument("--max-call-s", type=float,
                        help="skip larger n for a model once one call takes longer than this")
    parser.add_argument("--budget-s", type=float,
                        help="start no new point after this many seconds (rerun with --resume)")
    parser.add_argument("--resume", action=argparse.BooleanOptionalAction, default=None,
                        help="keep points already in <out>/scaling.jsonl measured on the same "
                             "grid settings")
    parser.add_argument("--oom", action=argparse.BooleanOptionalAction, default=True,
                        help="find (GPU) or project (CPU) the n at which attention runs out of "
                             "memory")
    parser.add_argument("--oom-max-n", type=int, help="largest n the GPU OOM search tries")
    parser.add_argument("--length", action=argparse.BooleanOptionalAction, default=True,
                        help="run each attention path at batch 1 on ever longer inputs until "
                             "memory or --length-max-s stops it")
    parser.add_argument("--length-d", type=int, help="width of the length search (default 256)")
    parser.add_argument("--length-max-s", type=float,
                        help="stop the length search before a call would take longer")
    parser.add_argument("--length-max-n", type=int, help="longest n the length search tries")
    parser.add_argument("--block", type=int, default=512,
                        help="query/key block size of the blockwise and local paths")
    parser.add_argument("--window", type=int, default=analysis.LOCAL_WINDOW,
                        help="attention_local: keys seen on each side of a query")
    parser.add_argument("--out", help="output directory (default benchmarks/results/<machine>)")
    args = parser.parse_args(argv)
    args.preset = args.preset or "quick"
    for name, value in PRESETS[args.preset].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("batch", "heads", "kernel", "repeats", "oom_max_n", "length_d", "block",
                 "window"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be >= 0, got {args.warmup}")
    if min(args.n) < 1 or min(args.d) < 1:
        parser.error(f"--n and --d must be positive, got n={args.n} d={args.d}")
    bad = [d for d in args.d if d % args.heads]
    if bad:
        parser.error(f"--heads {args.heads} does not divide d={bad}; pick heads dividing every d")
    if args.kernel < 2:
        parser.error(f"--kernel must be >= 2 (a path between positions needs it), got "
                     f"{args.kernel}")
    args.n, args.d = sorted(set(args.n)), sorted(set(args.d))
    return args


def _read_jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv: Sequence[str] | None = None) -> dict:
    """Runs the sweep, writes every output file and returns the summary."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    start = time.perf_counter()
    directory = machine.results_dir(args.out)
    records_path = os.path.join(directory, RECORDS_FILE)
    dtype = DTYPES[args.dtype]
    requested = list(args.models or analysis.MODELS)
    unavailable = unavailable_models(requested, dtype)
    models = [m for m in requested if m not in unavailable]
    for model, reason in unavailable.items():
        print(f"skipping {model}: {reason}", flush=True)

    previous = _read_jsonl(records_path) if args.resume else []
    if not args.resume:
        open(records_path, "w").close()

    def append(record: dict) -> None:
        # Written as measured: a run killed mid-sweep leaves its points for --resume.
        with open(records_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    floor_s = dispatch_floor_s()
    records, pending = sweep(args, models, previous, start, append)
    device = jax.devices()[0]
    meta = {
        "machine": machine.machine_name(), "device": f"{device.platform} {device.device_kind}",
        "jax_version": jax.__version__, "flax_version": flax.__version__,
        "command": "python -m benchmarks.scaling " + " ".join(argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "config": {k: getattr(args, k) for k in ("preset", "n", "d", "batch", "heads", "kernel",
                                                  "repeats", "warmup", "dtype", "passes",
                                                  "cross_models", "block", "window")},
        "models_requested": requested, "unavailable": unavailable,
        "complete": pending == 0, "pending_points": pending,
        "peak_bytes_note": ("peak_bytes is the allocator's peak since the process started (jax "
                            "cannot reset it; None on the CPU backend), so it only grows over the "
                            "sweep; program_bytes is XLA's per-program buffer size"),
    }
    summary = analysis.build_summary(records, meta, floor_s, args.kernel)
    if args.oom and pending == 0:
        summary["oom"] = oom_search(args, models, records, start)
    if args.length and pending == 0:
        summary["length"] = longest_n_search(args, models)
        for path, passes in summary["length"]["paths"].items():
            for pass_, res in passes.items():
                entry = summary["models"].setdefault(path, {}).setdefault(pass_, {})
                entry["longest_n"] = res["longest_n"]
                entry["length_memory_slope_n"] = res["memory_slope_n"]
    summary["elapsed_s"] = time.perf_counter() - start

    machine.write_jsonl(records_path, records)
    with open(os.path.join(directory, SUMMARY_FILE), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(directory, TABLE_FILE), "w", encoding="utf-8") as f:
        f.write(analysis.markdown_table(records, summary))
    plots = scaling_plots.write_plots(records, summary, directory)
    state = "complete" if pending == 0 else f"incomplete: {pending} points left; rerun with --resume"
    print(f"{state}; {summary['elapsed_s']:.0f} s; wrote {RECORDS_FILE}, {SUMMARY_FILE}, "
          f"{TABLE_FILE}, {', '.join(os.path.basename(p) for p in plots)} to {directory}",
          flush=True)
    return summary


if __name__ == "__main__":
    with errors.reported("benchmarks.scaling"):
        main()
