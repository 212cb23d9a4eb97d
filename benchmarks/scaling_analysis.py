"""The scaling benchmark's arithmetic: analytic FLOPs, log-log slopes, crossovers, the memory
projection for naive attention, and the summary and markdown table built from the measurements.
Pure functions on plain Python data (records are the dicts written to scaling.jsonl); no jax.

Analytic FLOPs count matmul work only, 2 FLOPs per multiply-add, per sequence of length n with
model width d (multiply by the batch). Element-wise work (softmax, gates, norms, biases) is left
out, as in the usual MFU estimates, so XLA's count sits a few percent above the analytic one.

    attention (q, k, v, out projections d -> d: 4 x 2 n d^2;  scores q k^T over all heads:
               2 n^2 d;  weights x values: 2 n^2 d)                       8 n d^2 + 4 n^2 d
    Elman RNN / LSTM / GRU with G = 1 / 4 / 3 gates, input width d, hidden d: each step runs
               x_t W (2 d G d, done for all steps in one matmul before the scan) and
               h_{t-1} U (2 d G d); n steps                                2 G (d + d) d n
               -> RNN 4 n d^2, LSTM 16 n d^2, GRU 12 n d^2
    conv1d     kernel k, d -> d channels, 'SAME': every output position reads k positions
                                                                           2 k d^2 n
    encoder layer  attention + feed-forward d -> 4d -> d (2 x 2 n d 4d = 16 n d^2)
                                                                           24 n d^2 + 4 n^2 d
    forward+backward: the backward pass runs two matmuls per forward matmul (the gradient
    w.r.t. the input and the one w.r.t. the weights, or w.r.t. both operands of q k^T and of
    weights x values), so it costs 2x the forward: forward+backward = 3x forward.

Every forward count is c1 n + c2 n^2 (`flop_coefficients`), so the per-layer FLOP crossover of a
quadratic model against a recurrent one solves  c2 n^2 + c1 n = c1_ref n,  i.e.
n* = (c1_ref - c1) / c2:  attention vs LSTM 4 n^2 d + 8 n d^2 = 16 n d^2 -> n* = 2d;  vs GRU
n* = d;  vs Elman RNN none (the four projections alone, 8 n d^2, exceed the RNN's 4 n d^2), and
the whole encoder layer (24 n d^2) never drops below an LSTM layer. The order-level statement
(O(n^2 d) vs O(n d^2): crossover near n ~ d) is the seed's complexity table.
"""

import math
from collections.abc import Iterable, Sequence

import numpy as np

PASSES = ("forward", "forward_backward")
# Exact attention, every implementation (O(n^2 d) time; memory O(n^2) for einsum, O(n) for
# blockwise), and local attention (blockwise over a window of w keys either side: O(n w d)).
EXACT_ATTENTION_MODELS = ("attention_einsum", "attention_dot_product", "attention_cudnn",
                          "attention_blockwise")
ATTENTION_MODELS = EXACT_ATTENTION_MODELS + ("attention_local",)
RECURRENT_MODELS = ("rnn", "lstm", "gru")  # zoo's own (zoo.nn.recurrent), the lax.scan backend
# zoo's LSTM with backend='cpu_fused' (zoo.nn.cpu_lstm: the recurrence as a C++ kernel; CPU)
FUSED_MODELS = ("lstm_fused",)
TORCH_MODELS = ("torch_lstm", "torch_gru")  # torch.nn.LSTM / GRU, the fastest a user could pick
QUADRATIC_MODELS = EXACT_ATTENTION_MODELS + ("encoder_layer",)
MODELS = (ATTENTION_MODELS + RECURRENT_MODELS + FUSED_MODELS + TORCH_MODELS
          + ("conv", "encoder_layer"))
# The crossover references: each RNN measured, and per cell the fastest of ours (every backend)
# and torch's at every n (`fastest_lstm`, `fastest_gru`), so n* is never measured against a
# slow RNN.
FASTEST = {"fastest_lstm": ("lstm", "lstm_fused", "torch_lstm"),
           "fastest_gru": ("gru", "torch_gru")}
CROSSOVER_REFERENCES = RECURRENT_MODELS + FUSED_MODELS + TORCH_MODELS + tuple(FASTEST)

MLP_RATIO = 4  # the encoder layer's feed-forward width, mlp_dim = 4 d
LOCAL_WINDOW = 128  # attention_local: each query sees the w keys either side of it
_GATES = {"rnn": 1, "lstm": 4, "gru": 3, "lstm_fused": 4, "torch_lstm": 4, "torch_gru": 3}

# Slopes are fitted only on points at least this many times slower than the dispatch floor (an
# empty jitted call): below it the fixed per-call cost, not the model, sets the time.
FLOOR_FACTOR = 10.0

FLOPS_FORMULAS = {
    **{m: "8 n d^2 + 4 n^2 d" for m in EXACT_ATTENTION_MODELS},
    "attention_local": "8 n d^2 + 4 n (2w + 1) d",
    "rnn": "4 n d^2",
    "lstm": "16 n d^2",
    "gru": "12 n d^2",
    "lstm_fused": "16 n d^2",
    "torch_lstm": "16 n d^2",
    "torch_gru": "12 n d^2",
    "conv": "2 k n d^2",
    "encoder_layer": "24 n d^2 + 4 n^2 d",
}
_SCANS = RECURRENT_MODELS + FUSED_MODELS + TORCH_MODELS
SEQUENTIAL_OPS = {**{m: "1" for m in QUADRATIC_MODELS}, **{m: "n" for m in _SCANS},
                  "attention_local": "1", "conv": "1"}
MAX_PATH_LENGTH = {**{m: "1" for m in QUADRATIC_MODELS}, **{m: "n" for m in _SCANS},
                   "attention_local": "ceil(n / w)", "conv": "ceil(log_k n)"}
XLA_LOOP_NOTE = (
    "XLA's cost analysis counts a while loop's body once, not once per iteration: for a scan "
    "over n steps it reports the input projection (outside the loop) plus a single step, so its "
    "FLOPs for rnn/lstm/gru under-count by about the trip count (measured on jax 0.10.2 CPU)."
)


def _check_model(model: str) -> None:
    if model not in MODELS:
        raise ValueError(f"model={model!r} is not one of {MODELS}")


def _check_pass(pass_: str) -> None:
    if pass_ not in PASSES:
        raise ValueError(f"pass_={pass_!r} is not one of {PASSES}")


def flop_coefficients(model: str, d: int, kernel: int = 3,
                      window: int = LOCAL_WINDOW) -> tuple[float, float]:
    """(c1, c2) with forward FLOPs per sequence = c1 n + c2 n^2 (see the module docstring)."""
    _check_model(model)
    if model in EXACT_ATTENTION_MODELS:
        return 8.0 * d * d, 4.0 * d
    if model == "attention_local":  # each query scores 2w + 1 keys (fewer at the ends)
        return 8.0 * d * d + 4.0 * (2 * window + 1) * d, 0.0
    if model in _SCANS:
        return 2.0 * _GATES[model] * (d + d) * d, 0.0
    if model == "conv":
        return 2.0 * kernel * d * d, 0.0
    return 8.0 * d * d + 2 * 2.0 * MLP_RATIO * d * d, 4.0 * d  # encoder_layer


def analytic_flops(model: str, pass_: str, n: int, d: int, batch: int = 1,
                   kernel: int = 3) -> float:
    """Matmul FLOPs of one call: forward, or forward+backward (3x forward)."""
    _check_pass(pass_)
    c1, c2 = flop_coefficients(model, d, kernel)
    forward = batch * (c1 * n + c2 * n * n)
    return forward if pass_ == "forward" else 3.0 * forward


def flop_crossover_n(model: str, reference: str, d: int, kernel: int = 3) -> float | None:
    """The n at which `model`'s per-layer FLOPs reach `reference`'s (None: never for n > 0)."""
    c1, c2 = flop_coefficients(model, d, kernel)
    r1, r2 = flop_coefficients(reference, d, kernel)
    if c2 == r2:  # both linear (or equally quadratic): equal at every n or at none
        return None
    n = (r1 - c1) / (c2 - r2)
    return n if n > 0 else None


def sequential_ops(model: str, n: int) -> int:
    """Operations that must run one after another within a layer: the scan's n steps for the
    recurrent models, 1 for attention and convolution (every position at once)."""
    _check_model(model)
    return n if model in _SCANS else 1


def max_path_length(model: str, n: int, kernel: int = 3, window: int = LOCAL_WINDOW) -> int:
    """Longest chain of layers/steps a signal crosses between two of n positions: 1 for
    attention, n for a recurrence, ceil(log_k n) for a stack of dilated convolutions of kernel k
    (dilation k^l, the seed's O(log_k n); contiguous kernels would need ceil((n-1)/(k-1))),
    ceil(n / w) layers of local attention over a window of w either side."""
    _check_model(model)
    if model in _SCANS:
        return n
    if model == "attention_local":
        return max(1, math.ceil((n - 1) / window))
    if model == "conv":
        if kernel < 2:
            raise ValueError(f"kernel={kernel}: a path between positions needs kernel >= 2")
        layers, reach = 0, 1
        while reach < n:  # integer ceil(log_k n), free of float rounding at exact powers
            reach *= kernel
            layers += 1
        return max(layers, 1)
    return 1


def fit_loglog(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of log y on log x; needs >= 2 distinct x."""
    if len(xs) != len(ys) or len(set(xs)) < 2:
        raise ValueError(f"fit_loglog needs >= 2 distinct x with one y each, got x={list(xs)}")
    slope, intercept = np.polyfit(np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float)), 1)
    return float(slope), float(intercept)


def fit_slope(xs: Sequence[float], times: Sequence[float], floor_s: float,
              floor_factor: float = FLOOR_FACTOR) -> dict:
    """Log-log slope of time over the points with time >= floor_factor * floor_s.

    Returns {'slope': float | None, 'points': [x used], 'reason': why None (absent otherwise)}.
    """
    keep = [(x, t) for x, t in zip(xs, times) if t >= floor_factor * floor_s]
    used = sorted(x for x, _ in keep)
    if len({x for x, _ in keep}) < 2:
        return {"slope": None, "points": used,
                "reason": f"fewer than 2 points >= {floor_factor:g}x the dispatch floor "
                          f"({floor_s:.2e} s)"}
    slope, _ = fit_loglog([x for x, _ in keep], [t for _, t in keep])
    return {"slope": slope, "points": used}


def crossover_n(ns: Sequence[float], times: Sequence[float],
                ref_times: Sequence[float]) -> tuple[float | None, str]:
    """The smallest n at which `times` exceeds `ref_times`, log-interpolated between grid points.

    The ratio r = time / ref_time is interpolated linearly in (log n, log r) between the last
    grid point with r < 1 and the next one with r >= 1. Returns (n*, status) with status
    'crossed', 'not within the sweep' (r < 1 throughout; n* None) or 'slower throughout the
    sweep' (r >= 1 from the smallest n; n* None: the crossover lies below the sweep).
    """
    if not (len(ns) == len(times) == len(ref_times)) or not ns:
        raise ValueError("crossover_n needs equally long, non-empty ns, times and ref_times")
    order = np.argsort(ns)
    n = np.asarray(ns, float)[order]
    log_r = np.log(np.asarray(times, float)[order] / np.asarray(ref_times, float)[order])
    if log_r[0] >= 0:
        return None, "slower throughout the sweep"
    for i in range(1, len(n)):
        if log_r[i] >= 0:
            a, b = np.log(n[i - 1]), np.log(n[i])
            log_n = a + (0.0 - log_r[i - 1]) * (b - a) / (log_r[i] - log_r[i - 1])
            return float(np.exp(log_n)), "crossed"
    return None, "not within the sweep"


def project_oom_n(ns: Sequence[float], nbytes: Sequence[float], limit_bytes: float) -> float | None:
    """The n at which buffers growing like a + b n + c n^2 (least squares on the points) reach
    `limit_bytes`; with fewer than 3 points, or a non-positive c, c n^2 through the largest
    point. None when the buffers do not grow."""
    n = np.asarray(ns, float)
    y = np.asarray(nbytes, float)
    if len(n) == 0:
        return None
    a = b = 0.0
    c = -1.0
    if len(set(n.tolist())) >= 3:
        c, b, a = np.polyfit(n, y, 2)
    if c <= 0:
        i = int(np.argmax(n))
        a, b, c = 0.0, 0.0, y[i] / n[i] ** 2
    if c <= 0:
        return None
    # Positive root of c n^2 + b n + (a - limit) = 0.
    disc = b * b - 4 * c * (a - limit_bytes)
    return float((-b + math.sqrt(max(disc, 0.0))) / (2 * c))


def _ok(records: Iterable[dict]) -> list[dict]:
    return [r for r in records if r.get("status") == "ok"]


def _series(records: list[dict], model: str, pass_: str, key: str, value) -> dict:
    """{other grid coordinate: median_s} of one model/pass at n == value or d == value."""
    other = "d" if key == "n" else "n"
    return {r[other]: r["median_s"] for r in records
            if r["model"] == model and r["pass"] == pass_ and r[key] == value}


def _reference_series(records: list[dict], ref: str, pass_: str, d: int) -> dict:
    """{n: median_s} of a crossover reference: one RNN, or (FASTEST) at each n the faster of
    ours and torch's among those measured there."""
    if ref not in FASTEST:
        return _series(records, ref, pass_, "d", d)
    series = [_series(records, m, pass_, "d", d) for m in FASTEST[ref]]
    ns = set().union(*series)
    return {n: min(s[n] for s in series if n in s) for n in ns}


def memory_slope(records: list[dict], model: str, pass_: str) -> dict:
    """Log-log slope in n of the compiled program's temporaries (XLA's memory analysis) at the
    largest d with >= 2 n: 2 for buffers of n x n, 1 for buffers of n."""
    own = [r for r in _ok(records) if r["model"] == model and r["pass"] == pass_
           and r.get("temp_bytes")]
    for d in sorted({r["d"] for r in own}, reverse=True):
        points = {r["n"]: r["temp_bytes"] for r in own if r["d"] == d}
        if len(points) >= 2:
            slope, _ = fit_loglog(list(points), list(points.values()))
            return {"memory_slope_n": slope, "memory_slope_n_at_d": d,
                    "memory_slope_n_points": sorted(points)}
    return {"memory_slope_n": None, "memory_slope_n_at_d": None, "memory_slope_n_points": []}


def summarize_pass(records: list[dict], model: str, pass_: str, floor_s: float,
                   kernel: int = 3) -> dict:
    """slope_n (at the largest d with >= 2 n), slope_d (at the largest n with >= 2 d), the
    memory slope in n and, per d, the measured and FLOP crossover n against every recurrent
    reference measured at >= 2 common n (crossover_n[d][reference]; empty for the linear-in-n
    models, which have none to cross)."""
    own = [r for r in _ok(records) if r["model"] == model and r["pass"] == pass_]
    out: dict = {"slope_n": None, "slope_n_at_d": None, "slope_n_points": [],
                 "slope_d": None, "slope_d_at_n": None, "slope_d_points": [],
                 **memory_slope(records, model, pass_),
                 "crossover_n": {}, "crossover_status": {}, "flop_crossover_n": {}}
    ds = sorted({r["d"] for r in own})
    ns = sorted({r["n"] for r in own})
    for d in reversed(ds):
        series = _series(own, model, pass_, "d", d)
        if len(series) >= 2:
            fit = fit_slope(list(series), list(series.values()), floor_s)
            out.update(slope_n=fit["slope"], slope_n_at_d=d, slope_n_points=fit["points"])
            if fit["slope"] is None:
                out["slope_n_reason"] = fit["reason"]
            break
    for n in reversed(ns):
        series = _series(own, model, pass_, "n", n)
        if len(series) >= 2:
            fit = fit_slope(list(series), list(series.values()), floor_s)
            out.update(slope_d=fit["slope"], slope_d_at_n=n, slope_d_points=fit["points"])
            if fit["slope"] is None:
                out["slope_d_reason"] = fit["reason"]
            break
    if model not in QUADRATIC_MODELS:
        return out
    ok = _ok(records)
    for d in ds:
        mine = _series(ok, model, pass_, "d", d)
        key = str(d)
        for ref in CROSSOVER_REFERENCES:
            theirs = _reference_series(ok, ref, pass_, d)
            common = sorted(set(mine) & set(theirs))
            if len(common) < 2:  # one shared n cannot place a crossing
                continue
            value, status = crossover_n(common, [mine[n] for n in common],
                                        [theirs[n] for n in common])
            out["crossover_n"].setdefault(key, {})[ref] = value
            out["crossover_status"].setdefault(key, {})[ref] = status
            out["flop_crossover_n"].setdefault(key, {})[ref] = flop_crossover_n(
                model, FASTEST.get(ref, (ref,))[0], d, kernel)
    return out


def build_summary(records: list[dict], meta: dict, floor_s: float, kernel: int = 3) -> dict:
    """summary.json: `meta` (machine, versions, command, date, grid, ...) plus, per model
    measured, its FLOP formula, sequential operations, maximum path length and, per pass, the
    slopes and crossovers of `summarize_pass`."""
    models: dict = {}
    measured = {(r["model"], r["pass"]) for r in _ok(records)}
    for model in MODELS:
        passes = [p for p in PASSES if (model, p) in measured]
        if not passes:
            continue
        n_max = max(r["n"] for r in _ok(records) if r["model"] == model)
        entry = {"flops_formula": FLOPS_FORMULAS[model],
                 "sequential_ops": SEQUENTIAL_OPS[model],
                 "max_path_length": MAX_PATH_LENGTH[model],
                 "sequential_ops_at_n_max": sequential_ops(model, n_max),
                 "max_path_length_at_n_max": max_path_length(model, n_max, kernel),
                 "n_max": n_max}
        for pass_ in passes:
            entry[pass_] = summarize_pass(records, model, pass_, floor_s, kernel)
        models[model] = entry
    return {**meta, "dispatch_floor_s": floor_s,
            "fit_rule": (f"least squares of log(median_s) on log(n) at the largest d (log(d) at "
                         f"the largest n), over points with median_s >= {FLOOR_FACTOR:g} x "
                         "dispatch_floor_s; slope null when fewer than 2 remain"),
            "crossover_rule": ("smallest n at which the model's median time exceeds the "
                               "reference's, interpolated linearly in (log n, log time ratio) "
                               "between grid points; null with crossover_status otherwise"),
            "flop_crossover_rule": "c2 n^2 + c1 n = c1_ref n, n* = (c1_ref - c1) / c2",
            "xla_flops_note": XLA_LOOP_NOTE,
            "models": models}


def _fmt(x, spec: str = ".3g") -> str:
    return "–" if x is None else format(x, spec)


def markdown_table(records: list[dict], summary: dict) -> str:
    """scaling.md: the header, the per-model summary, crossovers, OOM lengths and every
    measurement (time, analytic vs XLA FLOPs, buffers)."""
    lines = [f"# Scaling: attention vs RNN vs CNN on {summary.get('machine')}", "",
             (f"- device: {summary.get('device')}; jax {summary.get('jax_version')}; "
              f"date {summary.get('date')}"),
             f"- command: `{summary.get('command')}`",
             (f"- dispatch floor: {_fmt(summary['dispatch_floor_s'] * 1e6)} µs; "
              f"fit rule: {summary['fit_rule']}"),
             (f"- FLOPs: analytic = matmul FLOPs (2 per multiply-add), forward+backward = 3x "
              f"forward. † {summary['xla_flops_note']}"), "",
             "## Slopes, sequential operations, path length", "",
             ("| model | pass | FLOPs (fwd) | slope_n (at d) | slope_d (at n) | memory slope_n | "
              "seq. ops | max path | seq. ops / path at n_max |"),
             "|---|---|---|---|---|---|---|---|---|"]
    models = summary["models"]
    for model, entry in models.items():
        for pass_ in PASSES:
            if pass_ not in entry:
                continue
            s = entry[pass_]
            lines.append(
                f"| {model} | {pass_} | {entry['flops_formula']} | {_fmt(s['slope_n'], '.2f')} "
                f"({s['slope_n_at_d']}) | {_fmt(s['slope_d'], '.2f')} ({s['slope_d_at_n']}) | "
                f"{_fmt(s.get('memory_slope_n'), '.2f')} | "
                f"{entry['sequential_ops']} | {entry['max_path_length']} | "
                f"{entry['sequential_ops_at_n_max']} / {entry['max_path_length_at_n_max']} "
                f"(n={entry['n_max']}) |")
    lines += ["", "## Crossover n*: smallest n at which the model is slower than the reference",
              "", "Measured (wall time) / FLOP theory (c2 n^2 + c1 n = c1_ref n; – = never).",
              "", "| model | pass | d | reference | measured n* | status | FLOP n* |",
              "|---|---|---|---|---|---|---|"]
    for model, entry in models.items():
        for pass_ in PASSES:
            s = entry.get(pass_)
            if not s:
                continue
            for d, refs in s["crossover_n"].items():
                for ref, value in refs.items():
                    lines.append(
                        f"| {model} | {pass_} | {d} | {ref} | {_fmt(value, '.0f')} | "
                        f"{s['crossover_status'][d][ref]} | "
                        f"{_fmt(s['flop_crossover_n'][d][ref], '.0f')} |")
    length = summary.get("length")
    if length:
        lines += ["", "## How long an input each attention path actually ran", "",
                  length["note"], "",
                  ("| path | pass | longest n run | its time s | its program MiB | memory slope_n "
                   "| stopped because |"),
                  "|---|---|---|---|---|---|---|"]
        for path, passes in length["paths"].items():
            for pass_, res in passes.items():
                mib = None if res.get("program_bytes") is None else res["program_bytes"] / 2**20
                lines.append(f"| {path} | {pass_} | {_fmt(res.get('longest_n'), '.0f')} | "
                             f"{_fmt(res.get('seconds'), '.3g')} | {_fmt(mib, '.0f')} | "
                             f"{_fmt(res.get('memory_slope_n'), '.2f')} | "
                             f"{res.get('stopped', '')} |")
        for name, ratios in length.get("time_ratios", {}).items():
            for pass_, by_n in ratios.items():
                text = ", ".join(f"n={n}: {_fmt(r, '.2f')}" for n, r in by_n.items())
                lines.append(f"- time ratio {name} ({pass_}): {text}")
    oom = summary.get("oom")
    if oom:
        lines += ["", f"## Sequence length at which attention runs out of memory ({oom['method']})",
                  "", oom.get("note", ""), "",
                  "| path | pass | status | last n that fit | n at limit |", "|---|---|---|---|---|"]
        for path, passes in oom["paths"].items():
            for pass_, res in passes.items():
                lines.append(f"| {path} | {pass_} | {res['status']} | "
                             f"{_fmt(res.get('last_n_fit'), '.0f')} | "
                             f"{_fmt(res.get('n_oom'), '.0f')} |")
    skipped = [r for r in records if r.get("status") != "ok"]
    if skipped or summary.get("unavailable"):
        lines += ["", "## Not measured", ""]
        for model, reason in summary.get("unavailable", {}).items():
            lines.append(f"- {model}: {reason}")
        for r in skipped:
            lines.append(f"- {r['model']} {r['pass']} n={r['n']} d={r['d']}: {r['status']} "
                         f"({r.get('reason', '')})")
    lines += ["", "## Measurements", "",
              ("| model | pass | n | d | median ms | min ms | analytic GFLOP | XLA GFLOP | "
               "XLA / analytic | program MiB | peak MiB | compile s |"),
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(_ok(records), key=lambda r: (MODELS.index(r["model"]), r["pass"], r["d"],
                                                 r["n"])):
        xla = r.get("xla_flops")
        ratio = None if not xla else xla / r["analytic_flops"]
        # XLA counts a loop body once and cannot see inside the fused kernel's custom call.
        mark = " †" if r["model"] in RECURRENT_MODELS + FUSED_MODELS else ""
        mib = (lambda b: None if b is None else b / 2**20)
        lines.append(
            f"| {r['model']} | {r['pass']} | {r['n']} | {r['d']} | {_fmt(r['median_s'] * 1e3)} | "
            f"{_fmt(r['min_s'] * 1e3)} | {_fmt(r['analytic_flops'] / 1e9)} | "
            f"{_fmt(None if xla is None else xla / 1e9)}{mark} | {_fmt(ratio, '.2f')}{mark} | "
            f"{_fmt(mib(r.get('program_bytes')))} | {_fmt(mib(r.get('peak_bytes')))} | "
            f"{_fmt(r.get('compile_s'), '.2f')} |")
    return "\n".join(lines) + "\n"
