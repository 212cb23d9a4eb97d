"""benchmarks.quality's outputs: quality.jsonl (one record per pair and seed, every curve point
and step time in it), quality.md (the tables) and quality_<pair>.png (both sides' curves)."""

import math
import os
import statistics
from typing import Any

from benchmarks import machine

# Goals of issue 37: GPT val loss within 0.05 of the peer; perplexity within 3%.
LOSS_GAP = 0.05
PERPLEXITY_GAP = 0.03
SKIP_STEPS = 10  # compilation and warm-up: left out of the step-time medians


def summarize(record: dict[str, Any]) -> dict[str, Any]:
    """Per side: final losses (and perplexities), the median step time after the warm-up steps;
    the zoo / peer step-time ratio and the gap on the pair's metric."""
    out: dict[str, Any] = {"pair": record["pair"], "seed": record["seed"],
                           "metric": record["metric"], "partial": record.get("partial", False),
                           "steps_done": record.get("steps_done"),
                           "steps": record["recipe"]["steps"]}
    for name, side in record["sides"].items():
        times = side["step_s"][SKIP_STEPS:] or side["step_s"]
        out[name] = {"final": side["final"],
                     "perplexity": {k: math.exp(min(v, 50.0)) for k, v in side["final"].items()},
                     "step_s": statistics.median(times), "step_min_s": min(times),
                     "last_train_loss": statistics.fmean(side["train_loss"][-50:])}
    metric = record["metric"]
    zoo, peer = out["zoo"], out["peer"]
    out["loss_gap"] = zoo["final"][metric] - peer["final"][metric]
    out["perplexity_ratio"] = zoo["perplexity"][metric] / peer["perplexity"][metric]
    out["step_ratio"] = zoo["step_s"] / peer["step_s"]
    return out


def _mean(values: list[float]) -> float:
    return statistics.fmean(values)


def _spread(values: list[float]) -> float:
    return max(values) - min(values) if len(values) > 1 else float("nan")


def markdown(header: dict[str, Any], summaries: list[dict[str, Any]]) -> str:
    lines = [f"# Training quality beside the reference implementation on {header['machine']}",
             "",
             (f"zoo {header['zoo_commit']}, jax {header['jax']}, torch {header['torch']}, "
              f"transformers {header['transformers']}; mode `{header['mode']}`, corpus "
              f"`{header['corpus']}`; {header['started']} ({header['wall_s'] / 60:.1f} min)."),
             "",
             ("Both sides train on the same numpy batches in the same order, with the same "
              "recipe and step budget, one step each in turns (benchmarks.quality). Step time: "
              f"median after the first {SKIP_STEPS} steps, the batch's transfer included, "
              "read back as a float on both sides. Goals (issue 37): GPT val loss within "
              f"{LOSS_GAP} of the peer, perplexity within {PERPLEXITY_GAP:.0%}, zoo's step "
              "time at most the peer's."),
             ""]
    by_pair: dict[str, list[dict[str, Any]]] = {}
    for s in summaries:
        by_pair.setdefault(s["pair"], []).append(s)
    for pair, rows in by_pair.items():
        sets = list(dict.fromkeys(k for s in rows for k in s["zoo"]["final"]))
        lines += [f"## {pair}", ""]
        for s in rows:
            if s["partial"]:
                lines += [f"**Seed {s['seed']} stopped at step {s['steps_done']} of "
                          f"{s['steps']}**: its losses are the last curve point's.", ""]
        head = "| seed | side | " + " | ".join(
            f"{k} loss | {k} ppl" for k in sets) + " | train loss (last 50) | step ms |"
        lines += [head, "|---:|---|" + "---:|" * (2 * len(sets) + 2)]
        for s in rows:
            for side in ("zoo", "peer"):
                v = s[side]
                cells = " | ".join(f"{v['final'][k]:.4f} | {v['perplexity'][k]:.2f}"
                                   if k in v["final"] else "– | –" for k in sets)
                lines.append(f"| {s['seed']} | {side} | {cells} | {v['last_train_loss']:.4f} "
                             f"| {v['step_s'] * 1e3:.1f} |")
        gaps = [s["loss_gap"] for s in rows]
        ratios = [s["perplexity_ratio"] for s in rows]
        steps = [s["step_ratio"] for s in rows]
        metric = rows[0]["metric"]
        zoo_spread = _spread([s["zoo"]["final"][s["metric"]] for s in rows])
        peer_spread = _spread([s["peer"]["final"][s["metric"]] for s in rows])
        lines += ["",
                  (f"zoo - peer {metric} loss: " + ", ".join(f"{g:+.4f}" for g in gaps)
                   + f" (mean {_mean(gaps):+.4f}); perplexity zoo/peer: "
                   + ", ".join(f"{r:.3f}" for r in ratios)
                   + f"; spread between seeds: zoo {zoo_spread:.4f}, peer {peer_spread:.4f}; "
                   "step time zoo/peer: " + ", ".join(f"{r:.2f}" for r in steps) + "."),
                  ""]
        # zoo - peer on the pair's goal scale: loss for GPT, perplexity ratio - 1 otherwise.
        gap, margin = ((_mean(gaps), LOSS_GAP) if pair.startswith("gpt")
                       else (_mean(ratios) - 1, PERPLEXITY_GAP))
        quality = ("met" if abs(gap) <= margin else "NOT met: zoo worse" if gap > 0
                   else "exceeded: zoo better than the peer by more than the margin")
        lines += [f"Quality goal {quality}; speed goal "
                  f"{'met' if _mean(steps) <= 1.0 else 'NOT met'} "
                  f"(mean step ratio {_mean(steps):.2f}).", ""]
        lines += [f"![{pair}](quality_{pair}.png)", ""]
    if header.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in header["notes"]] + [""]
    if header.get("other_reports"):
        lines += ["## The other pairs", "",
                  "Pairs whose metrics are not a language model's loss write reports of their "
                  "own (the same same-batches rule; each states its goals):", ""]
        lines += [f"- [{name}]({name})" for name in header["other_reports"]] + [""]
    return "\n".join(lines)


def _smooth(values: list[float], width: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= width:
            total -= values[i - width]
        out.append(total / min(i + 1, width))
    return out


def plot(directory: str, pair: str, records: list[dict[str, Any]]) -> str:
    """quality_<pair>.png: left, training loss (moving average of 50 steps); right, the eval
    curve; zoo solid, peer dashed, one colour per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for i, record in enumerate(records):
        colour = f"C{i}"
        for name, style in (("zoo", "-"), ("peer", "--")):
            side = record["sides"][name]
            loss = side["train_loss"]
            left.plot(range(1, len(loss) + 1), _smooth(loss, 50), style, color=colour,
                      label=f"{name} seed {record['seed']}", linewidth=1)
            for key in side["curve"][0][1]:
                steps = [p[0] for p in side["curve"]]
                right.plot(steps, [p[1][key] for p in side["curve"]], style, color=colour,
                           marker="o", markersize=3, label=f"{name} seed {record['seed']} {key}")
    left.set(title=f"{pair}: training loss (mean of 50 steps)", xlabel="step", ylabel="loss")
    right.set(title="held-out loss", xlabel="step", ylabel="loss")
    tail = [v for r in records for s in r["sides"].values() for p in s["curve"][1:]
            for v in p[1].values()]
    if tail:  # the first point (the untrained model) would flatten the rest
        right.set_ylim(min(tail) - 0.05, max(tail) + 0.1)
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(directory, f"quality_{pair}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(directory: str, header: dict[str, Any], records: list[dict[str, Any]]) -> list[str]:
    """quality.jsonl (a header line, then each record with its summary), quality.md and the
    PNGs; returns the paths written."""
    summaries = [summarize(r) for r in records]
    jsonl = os.path.join(directory, "quality.jsonl")
    machine.write_jsonl(jsonl, [dict(header, record="header")]
                        + [dict(r, summary=s) for r, s in zip(records, summaries)])
    md = os.path.join(directory, "quality.md")
    with open(md, "w") as f:
        f.write(markdown(header, summaries))
    paths = [jsonl, md]
    pairs: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        pairs.setdefault(r["pair"], []).append(r)
    for pair, rows in pairs.items():
        paths.append(plot(directory, pair, rows))
    return paths
