"""The length search of `python -m benchmarks.scaling --length`: how long an input each
attention path takes here (`longest_n_search`). At batch 1, width --length-d and --heads
heads, n doubles from LENGTH_START_N and every length is really run, until the next one would
not fit (XLA's compiled buffers for it against the memory available now) or would take longer
than --length-max-s (its time extrapolated from the last run's).
"""

import argparse
from collections.abc import Sequence

import jax

from benchmarks import machine
from benchmarks import scaling_analysis as analysis
from benchmarks.scaling_models import DTYPES, build_model, init_params, make_fn

# The paths whose longest input is searched, and the length the search starts at.
LENGTH_PATHS = ("attention_einsum", "attention_dot_product", "attention_cudnn",
                "attention_blockwise", "attention_local")
LENGTH_START_N = 1024
# A length is only run when XLA's buffers for it fit in this share of the memory available: on
# the CPU the process's peak exceeds XLA's count (measured: einsum forward+backward at n=16,384,
# batch 1, d 256: XLA counted 16.2 GiB, the process reached 23 GiB and was killed).
LENGTH_MEMORY_SHARE = 0.6


def longest_n_search(args: argparse.Namespace, models: Sequence[str]) -> dict:
    """The longest input each attention path actually runs here, per pass (see the module
    docstring), and the time ratios of blockwise and local attention to einsum's at the
    lengths both ran. Result: {note, d, heads, memory_available_bytes, paths: {path: {pass:
    {longest_n, seconds, program_bytes, temp_bytes, memory_slope_n (of the temporaries over
    the lengths run), stopped, runs: [{n, seconds, program_bytes, temp_bytes}]}}},
    time_ratios: {'blockwise / einsum': {pass: {n: ratio}}, ...}}."""
    d, heads, dtype = args.length_d, args.heads, DTYPES[args.dtype]

    def available_now() -> int:
        # Re-read before every length: memory a previous length took may not have gone back
        # to the system (the CPU allocator keeps it), and a GPU's limit is fixed.
        return machine.device_memory_bytes() or machine.available_memory_bytes()

    available = available_now()
    result = {"d": d, "heads": heads, "batch": 1, "memory_available_bytes": available,
              "paths": {}, "time_ratios": {},
              "note": (f"batch 1, d {d}, {heads} heads, {args.dtype}, window {args.window} for "
                       f"local; n doubles from {LENGTH_START_N}, each length run once after "
                       f"compiling; a length is not run when XLA's buffers for it exceed "
                       f"{LENGTH_MEMORY_SHARE:.0%} of the memory available at that moment "
                       f"({available / 2**30:.1f} GiB at the start), or when its time, "
                       f"extrapolated from the last run (x4 for exact attention, x2 for local), "
                       f"exceeds --length-max-s {args.length_max_s:g}")}
    for path in [m for m in LENGTH_PATHS if m in models]:
        module, extract = build_model(path, d, heads, args.kernel, dtype, block=args.block,
                                      window=args.window)
        params = init_params(module, d, dtype)
        growth = 2.0 if path == "attention_local" else 4.0
        for pass_ in args.passes:
            fn = make_fn(module, extract, pass_)
            runs, stopped, n = [], f"reached --length-max-n {args.length_max_n}", LENGTH_START_N
            while n <= args.length_max_n:
                # Memory first (compiling allocates nothing): when both would stop a length,
                # memory is the limit that does not move with more patience.
                x_spec = jax.ShapeDtypeStruct((1, n, d), dtype)
                compiled, stats = machine.compile_with_stats(fn, params, x_spec)
                free = available_now()
                if stats["program_bytes"] and stats["program_bytes"] > LENGTH_MEMORY_SHARE * free:
                    stopped = (f"memory: n={n} needs {stats['program_bytes'] / 2**30:.1f} GiB of "
                               f"buffers > {LENGTH_MEMORY_SHARE:.0%} of the "
                               f"{free / 2**30:.1f} GiB available")
                    break
                if runs and growth * runs[-1]["seconds"] > args.length_max_s:
                    stopped = (f"time: n={n} would take ~{growth * runs[-1]['seconds']:.0f} s > "
                               f"--length-max-s {args.length_max_s:g}")
                    break
                x = jax.random.normal(jax.random.key(1), (1, n, d), dtype)
                # Short calls: the median of a few after a warm-up; long ones: one call.
                quick = not runs or growth * runs[-1]["seconds"] < 1.0
                seconds = machine.time_call(compiled, params, x, warmup=1 if quick else 0,
                                            repeats=3 if quick else 1)["median_s"]
                del x, compiled
                runs.append({"n": n, "seconds": seconds, "program_bytes": stats["program_bytes"],
                             "temp_bytes": stats["temp_bytes"]})
                print(f"length {path:22s} {pass_:16s} n={n:<8d} {seconds:8.2f} s "
                      f"{stats['program_bytes'] / 2**20:10.0f} MiB", flush=True)
                n *= 2
            last = runs[-1] if runs else {}
            # The memory slope over lengths past one block, where O(n) shows (below a block the
            # blockwise paths hold one n x n block).
            sized = [r for r in runs if r["temp_bytes"]]
            slope = (analysis.fit_loglog([r["n"] for r in sized],
                                         [r["temp_bytes"] for r in sized])[0]
                     if len({r["n"] for r in sized}) >= 2 else None)
            result["paths"].setdefault(path, {})[pass_] = {
                "longest_n": last.get("n"), "seconds": last.get("seconds"),
                "program_bytes": last.get("program_bytes"), "temp_bytes": last.get("temp_bytes"),
                "memory_slope_n": slope, "stopped": stopped, "runs": runs}
    einsum = result["paths"].get("attention_einsum", {})
    for path in ("attention_blockwise", "attention_local"):
        for pass_, res in result["paths"].get(path, {}).items():
            base = {r["n"]: r["seconds"] for r in einsum.get(pass_, {}).get("runs", [])}
            mine = {r["n"]: r["seconds"] for r in res["runs"]}
            ratios = {n: mine[n] / base[n] for n in sorted(set(mine) & set(base))}
            if ratios:
                name = f"{path.removeprefix('attention_')} / einsum"
                result["time_ratios"].setdefault(name, {})[pass_] = ratios
    return result
