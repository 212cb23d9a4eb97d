"""The BERT pair's outputs: quality_bert.jsonl (a header, then one record per seed with both
curves), quality_bert.md (the table, the gaps against the spread between seeds) and
quality_bert.png (MLM loss, MLM accuracy and NSP accuracy of both sides over the steps)."""

import os
import statistics
from typing import Any

from benchmarks import machine

METRICS = ("mlm_loss", "mlm_accuracy", "nsp_accuracy")
# The goals: accuracies within 1 point of the peer's on average over the seeds; the MLM loss
# within the larger of the two sides' spreads between seeds (the noise the seeds show).
ACCURACY_GAP = 0.01


def _spread(values: list[float]) -> float:
    return max(values) - min(values) if len(values) > 1 else float("nan")


def _no_worse(metric: str, mean_gap: float, bound: float) -> bool:
    # A loss is worse when higher, an accuracy when lower; a spread of nan (one seed) fails.
    return (mean_gap <= bound) if metric.endswith("loss") else (mean_gap >= -bound)


def markdown(header: dict[str, Any], records: list[dict[str, Any]]) -> str:
    lines = [f"# BERT pretraining beside Hugging Face on {header['machine']}", "",
             (f"zoo {header['zoo_commit']}, jax {header['jax']}, torch {header['torch']}, "
              f"transformers {header['transformers']}; mode `{header['mode']}`, corpus "
              f"`{header['corpus']}`; {header['started']} ({header['wall_s'] / 60:.1f} min)."),
             "",
             ("zoo's `configs/bert_pretrain.py:size=tiny,corpus=brown` job and "
              "transformers.BertForPreTraining of the same architecture, trained one step each "
              "in turns on zoo's own prepared batches (the same masked examples in the same "
              f"order), {header['steps']} steps, the job's recipe on both sides; evaluated on "
              "every batch of zoo's validation split. WordPiece vocabulary of "
              f"{header['vocab_size']} trained by Hugging Face's tokenizers on "
              f"{', '.join(header['vocab_texts'])}. Step time: median after the first 5 steps."),
             "", "| seed | side | MLM loss | MLM accuracy | NSP accuracy | step ms |",
             "|---:|---|---:|---:|---:|---:|"]
    for r in records:
        for side in ("zoo", "peer"):
            f = r["sides"][side]["final"]
            lines.append(f"| {r['seed']} | {side} | {f['mlm_loss']:.4f} | "
                         f"{f['mlm_accuracy']:.2%} | {f['nsp_accuracy']:.2%} | "
                         f"{r['sides'][side]['step_s'] * 1e3:.1f} |")
    lines.append("")
    for metric in METRICS:
        gaps = [r["sides"]["zoo"]["final"][metric] - r["sides"]["peer"]["final"][metric]
                for r in records]
        spreads = {side: _spread([r["sides"][side]["final"][metric] for r in records])
                   for side in ("zoo", "peer")}
        mean = statistics.fmean(gaps)
        bound = ACCURACY_GAP if metric.endswith("accuracy") else max(spreads.values())
        lines.append(f"- {metric}: zoo - peer " + ", ".join(f"{g:+.4f}" for g in gaps)
                     + f" (mean {mean:+.4f}); spread between seeds: zoo "
                     f"{spreads['zoo']:.4f}, peer {spreads['peer']:.4f}; goal (zoo no worse "
                     f"than the peer by more than {bound:.4f}): "
                     + ("met" if _no_worse(metric, mean, bound) else "NOT met"))
    ratios = [r["sides"]["zoo"]["step_s"] / r["sides"]["peer"]["step_s"] for r in records]
    lines += ["- step time zoo / peer: " + ", ".join(f"{x:.2f}" for x in ratios), "",
              "![curves](quality_bert.png)", ""]
    return "\n".join(lines)


def plot(directory: str, records: list[dict[str, Any]]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for i, record in enumerate(records):
        for name, style in (("zoo", "-"), ("peer", "--")):
            curve = record["sides"][name]["curve"][1:]  # the untrained point flattens the rest
            steps = [p[0] for p in curve]
            for ax, metric in zip(axes, METRICS):
                ax.plot(steps, [p[1][metric] for p in curve], style, color=f"C{i}", marker="o",
                        markersize=3, label=f"{name} seed {record['seed']}")
                # The whole validation split at the end: a marker of its own, not on the
                # curve, whose points read only its first batches.
                ax.plot([record["steps"]], [record["sides"][name]["final"][metric]],
                        "*" if name == "zoo" else "x", color=f"C{i}", markersize=9)
    for ax, metric in zip(axes, METRICS):
        ax.set(title=metric.replace("_", " "), xlabel="step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("tiny BERT: zoo (solid) and HF BertForPreTraining (dashed) on the same batches; "
                 "curves on the first validation batches, the whole split at the end (* zoo, "
                 "x peer)")
    fig.tight_layout()
    path = os.path.join(directory, "quality_bert.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(directory: str, header: dict[str, Any], records: list[dict[str, Any]]) -> list[str]:
    jsonl = os.path.join(directory, "quality_bert.jsonl")
    machine.write_jsonl(jsonl, [dict(header, record="header")] + records)
    md = os.path.join(directory, "quality_bert.md")
    with open(md, "w") as f:
        f.write(markdown(header, records))
    return [jsonl, md, plot(directory, records)]
