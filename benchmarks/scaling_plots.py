"""The scaling benchmark's PNGs: time vs n (log-log, one line per model), program memory vs n,
the attention/RNN crossover, and how long an input each attention path ran (memory and time
up to its longest n)."""

import os

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt

from benchmarks.scaling_analysis import (
    CROSSOVER_REFERENCES,
    FASTEST,
    MODELS,
    PASSES,
    QUADRATIC_MODELS,
    flop_crossover_n,
)

_STYLE = {"forward": "-", "forward_backward": "--"}


def _ok(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("status") == "ok"]


def _by_n(records: list[dict], model: str, pass_: str, d: int, key: str) -> tuple[list, list]:
    points = sorted((r["n"], r[key]) for r in records
                    if r["model"] == model and r["pass"] == pass_ and r["d"] == d
                    and r.get(key) is not None)
    return [n for n, _ in points], [v for _, v in points]


def _finish_axes(ax) -> None:
    """A grid on both scales and a legend when anything is labelled."""
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _save(fig, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _largest_d(records: list[dict], model: str) -> int | None:
    ds = [r["d"] for r in records if r["model"] == model]
    return max(ds) if ds else None


def plot_time_vs_n(records: list[dict], path: str) -> None:
    """Median time vs n on log-log axes, one line per model (at its largest d), a panel per
    pass, with n and n^2 guides."""
    records = _ok(records)
    fig, axes = plt.subplots(1, len(PASSES), figsize=(12, 4.5), squeeze=False)
    for ax, pass_ in zip(axes[0], PASSES):
        for model in MODELS:
            d = _largest_d(records, model)
            ns, ts = _by_n(records, model, pass_, d, "median_s")
            if ns:
                ax.plot(ns, ts, "o-", label=f"{model} (d={d})", markersize=3)
        lines = ax.get_lines()
        if lines:
            n0, t0 = lines[0].get_xdata()[0], lines[0].get_ydata()[0]
            n_max = max(max(line.get_xdata()) for line in lines)
            for power, label in ((1, "∝ n"), (2, "∝ n²")):
                ax.plot([n0, n_max], [t0, t0 * (n_max / n0) ** power], ":", color="gray",
                        linewidth=1)
                ax.annotate(label, (n_max, t0 * (n_max / n0) ** power), fontsize=8,
                            color="gray")
        ax.set(xscale="log", yscale="log", xlabel="sequence length n", ylabel="median time (s)",
               title=pass_.replace("_", " + "))
        _finish_axes(ax)
    _save(fig, path)


def plot_memory_vs_n(records: list[dict], summary: dict, path: str) -> None:
    """XLA's program buffers (arguments + outputs + temporaries) vs n at each model's largest d,
    with the memory limit and the out-of-memory lengths of the OOM search / projection."""
    records = _ok(records)
    oom = summary.get("oom") or {}
    fig, axes = plt.subplots(1, len(PASSES), figsize=(12, 4.5), squeeze=False)
    for ax, pass_ in zip(axes[0], PASSES):
        for model in MODELS:
            d = _largest_d(records, model)
            ns, nbytes = _by_n(records, model, pass_, d, "program_bytes")
            if ns:
                ax.plot(ns, [b / 2**20 for b in nbytes], "o-", label=f"{model} (d={d})",
                        markersize=3)
        if oom.get("memory_limit_bytes"):
            ax.axhline(oom["memory_limit_bytes"] / 2**20, color="red", linestyle=":",
                       label=f"limit ({oom['memory_limit_source']})")
            for name, passes in oom.get("paths", {}).items():
                res = passes.get(pass_, {})
                if res.get("n_oom"):
                    ax.axvline(res["n_oom"], color="gray", linestyle="--", linewidth=1)
                    ax.annotate(f"{name}: {res['status']} n≈{res['n_oom']:.3g}",
                                (res["n_oom"], oom["memory_limit_bytes"] / 2**20), fontsize=7,
                                rotation=90, va="top")
        ax.set(xscale="log", yscale="log", xlabel="sequence length n",
               ylabel="program buffers (MiB)", title=pass_.replace("_", " + "))
        _finish_axes(ax)
    _save(fig, path)


def plot_crossover(records: list[dict], summary: dict, path: str) -> None:
    """Left: time(attention) / time(LSTM) vs n per d (1 = the crossover). Right: the measured
    crossover n* vs d beside the FLOP-theory n*."""
    records = _ok(records)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    ds = sorted({r["d"] for r in records})
    model = next((m for m in QUADRATIC_MODELS if any(r["model"] == m for r in records)), None)
    ref = next((m for m in ("lstm",) + CROSSOVER_REFERENCES
                if any(r["model"] == m for r in records)), None)
    if model and ref:
        for color, d in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4, ds):
            for pass_ in PASSES:
                ns, ts = _by_n(records, model, pass_, d, "median_s")
                ref_ns, ref_ts = _by_n(records, ref, pass_, d, "median_s")
                ref_t = dict(zip(ref_ns, ref_ts))
                pairs = [(n, t / ref_t[n]) for n, t in zip(ns, ts) if n in ref_t]
                if pairs:
                    left.plot([p[0] for p in pairs], [p[1] for p in pairs], _STYLE[pass_],
                              marker="o", markersize=3, color=color, label=f"d={d} {pass_}")
        left.axhline(1.0, color="black", linewidth=1)
        left.set(title=f"time({model}) / time({ref})  (solid forward, dashed fwd+bwd)")
    left.set(xscale="log", yscale="log", xlabel="sequence length n", ylabel="time ratio")
    _finish_axes(left)

    found = False
    # Against the fastest RNN of each cell (ours or torch's) where measured, else ours.
    measured = {ref for entry in summary.get("models", {}).values() for pass_ in PASSES
                for refs in (entry.get(pass_) or {}).get("crossover_n", {}).values()
                for ref in refs}
    references = [r for r in FASTEST if r in measured] or [r for r in ("lstm", "gru")
                                                           if r in measured]
    for name, entry in summary.get("models", {}).items():
        for pass_ in PASSES:
            crossings = (entry.get(pass_) or {}).get("crossover_n", {})
            for reference in references:
                points = [(int(d), refs[reference]) for d, refs in crossings.items()
                          if refs.get(reference) is not None]
                if points:
                    found = True
                    right.plot([p[0] for p in points], [p[1] for p in points], _STYLE[pass_],
                               marker="o", label=f"{name} vs {reference} ({pass_})")
    for reference, style in (("lstm", "k:"), ("gru", "k-.")):
        theory = [(d, flop_crossover_n("attention_einsum", reference, d)) for d in ds]
        if ds:
            right.plot([p[0] for p in theory], [p[1] for p in theory], style,
                       label=f"FLOP theory: attention vs {reference}")
    if not found:
        right.text(0.5, 0.5, "no measured crossover within the sweep", ha="center",
                   transform=right.transAxes)
    right.set(xscale="log", yscale="log", xlabel="width d", ylabel="crossover n*",
              title="n* at which attention becomes slower")
    _finish_axes(right)
    _save(fig, path)


def plot_length(summary: dict, path: str) -> None:
    """The length search: XLA's program buffers (left) and the time of one call (right) vs n,
    per attention path and pass, up to the longest n each ran; the memory available dashed."""
    length = summary["length"]
    fig, (memory, timing) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    # Paths with equal buffers (blockwise and local) would hide each other: a marker each, the
    # later ones smaller and drawn on top.
    for index, (name, passes) in enumerate(length["paths"].items()):
        color, marker, size = colors[index % len(colors)], "osD^v"[index % 5], 7 - index
        for pass_, res in passes.items():
            runs = res["runs"]
            if not runs:
                continue
            ns = [r["n"] for r in runs]
            label = f"{name.removeprefix('attention_')} {pass_} (to n={ns[-1]:,})"
            style = dict(marker=marker, markersize=size, color=color, label=label,
                         markerfacecolor="none")
            memory.plot(ns, [r["program_bytes"] / 2**20 for r in runs], _STYLE[pass_], **style)
            timing.plot(ns, [r["seconds"] for r in runs], _STYLE[pass_], **style)
    memory.axhline(length["memory_available_bytes"] / 2**20, color="red", linestyle=":",
                   label="memory available")
    memory.set(title=f"program buffers, batch 1, d {length['d']}", ylabel="MiB")
    timing.set(title="time of one call", ylabel="seconds")
    for ax in (memory, timing):
        ax.set(xscale="log", yscale="log", xlabel="sequence length n")
        _finish_axes(ax)
    _save(fig, path)


def write_plots(records: list[dict], summary: dict, directory: str) -> list[str]:
    """time_vs_n.png, memory_vs_n.png, crossover.png and (with a length search) length_vs_n.png
    in `directory`; returns their paths."""
    paths = [os.path.join(directory, name)
             for name in ("time_vs_n.png", "memory_vs_n.png", "crossover.png")]
    plot_time_vs_n(records, paths[0])
    plot_memory_vs_n(records, summary, paths[1])
    plot_crossover(records, summary, paths[2])
    if summary.get("length"):
        paths.append(os.path.join(directory, "length_vs_n.png"))
        plot_length(summary, paths[-1])
    return paths
