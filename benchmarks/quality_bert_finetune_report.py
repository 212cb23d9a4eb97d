"""The BERT fine-tuning pairs' outputs: quality_bert_finetune.jsonl (a header, then one record
per task and seed with both curves), quality_bert_finetune.md (the table per task and each goal
judged against the spread between seeds) and quality_bert_finetune.png (validation accuracy and
loss of both sides over the steps, one column per task)."""

import os
import statistics
from typing import Any

from benchmarks import machine

# The goal (issue 37): accuracy and F1 within 1 point of the peer's on average over the seeds.
POINTS_GAP = 1.0


def _spread(values: list[float]) -> float:
    return max(values) - min(values) if len(values) > 1 else float("nan")


def judge(records: list[dict[str, Any]], metric: str) -> dict[str, Any]:
    """zoo - peer per seed for `metric` of one task's records, their mean, each side's spread
    between seeds and whether the goal is met (zoo no more than POINTS_GAP points below)."""
    gaps = [r["sides"]["zoo"]["final"][metric] - r["sides"]["peer"]["final"][metric]
            for r in records]
    mean = statistics.fmean(gaps)
    return {"gaps": gaps, "mean": mean, "met": mean >= -POINTS_GAP,
            "spreads": {side: _spread([r["sides"][side]["final"][metric] for r in records])
                        for side in ("zoo", "peer")}}


def _by_task(records):
    tasks: dict[str, list] = {}
    for r in records:
        tasks.setdefault(r["task"], []).append(r)
    return tasks


def markdown(header: dict[str, Any], records: list[dict[str, Any]]) -> str:
    recipe = header["recipe"]
    lines = [f"# BERT fine-tuning beside Hugging Face on {header['machine']}", "",
             (f"zoo {header['zoo_commit']}, jax {header['jax']}, torch {header['torch']}, "
              f"transformers {header['transformers']}; mode `{header['mode']}`, corpus "
              f"`{header['corpus']}`; {header['started']} ({header['wall_s'] / 60:.1f} min, "
              f"of which pretraining {header['pretrain_s'] / 60:.1f})."), "",
             (f"One tiny BERT pretrained by zoo on Brown ({recipe['pretrain_steps']} steps, "
              f"WordPiece {header['vocab_size']}, sequence length {recipe['seq_len']}) is the "
              "start of both sides, classifier head included: zoo's "
              "`configs/classify.py:corpus=TASK` job with that directory as init_from and the "
              "'tiny' recipe, and transformers.BertForSequenceClassification loaded with zoo's "
              f"initial params; {recipe['steps']} steps one each in turns on zoo's batches; "
              "evaluated on the whole validation split. F1: the spam class (SpamAssassin), "
              "macro over the genres (Brown). Step time: median after the first 5 steps."), ""]
    for task, rows in _by_task(records).items():
        first = rows[0]
        lines += [f"## {task}: {first['classes']} classes, {first['train_examples']:,} train / "
                  f"{first['eval_examples']:,} validation examples (majority class "
                  f"{first['majority_accuracy']:.1f}%)", "",
                  "| seed | side | loss | accuracy % | F1 % | step ms |",
                  "|---:|---|---:|---:|---:|---:|"]
        for r in rows:
            for side in ("zoo", "peer"):
                f = r["sides"][side]["final"]
                lines.append(f"| {r['seed']} | {side} | {f['loss']:.4f} | {f['accuracy']:.2f} | "
                             f"{f['f1']:.2f} | {r['sides'][side]['step_s'] * 1e3:.1f} |")
        lines.append("")
        for metric in ("accuracy", "f1"):
            j = judge(rows, metric)
            lines.append(f"- {metric}: zoo - peer " + ", ".join(f"{g:+.2f}" for g in j["gaps"])
                         + f" points (mean {j['mean']:+.2f}); spread between seeds: zoo "
                         f"{j['spreads']['zoo']:.2f}, peer {j['spreads']['peer']:.2f}; goal "
                         f"(within {POINTS_GAP:g} point on average): "
                         + ("met" if j["met"] else "NOT met"))
        ratios = [r["sides"]["zoo"]["step_s"] / r["sides"]["peer"]["step_s"] for r in rows]
        lines += ["- step time zoo / peer: " + ", ".join(f"{x:.2f}" for x in ratios), ""]
    lines += ["![curves](quality_bert_finetune.png)", ""]
    return "\n".join(lines)


def plot(directory: str, records: list[dict[str, Any]]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = _by_task(records)
    fig, axes = plt.subplots(2, len(tasks), figsize=(6 * len(tasks), 7), squeeze=False)
    for column, (task, rows) in enumerate(tasks.items()):
        for i, record in enumerate(rows):
            for name, style in (("zoo", "-"), ("peer", "--")):
                curve = record["sides"][name]["curve"]
                steps = [p[0] for p in curve]
                for row, metric in enumerate(("accuracy", "loss")):
                    axes[row][column].plot(steps, [p[1][metric] for p in curve], style,
                                           color=f"C{i}", marker="o", markersize=3,
                                           label=f"{name} seed {record['seed']}")
        for row, metric in enumerate(("accuracy", "loss")):
            ax = axes[row][column]
            ax.set(title=f"{task}: validation {metric}", xlabel="step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle("tiny BERT fine-tuning: zoo (solid) and HF BertForSequenceClassification "
                 "(dashed) from the same weights on the same batches")
    fig.tight_layout()
    path = os.path.join(directory, "quality_bert_finetune.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(directory: str, header: dict[str, Any], records: list[dict[str, Any]]) -> list[str]:
    jsonl = os.path.join(directory, "quality_bert_finetune.jsonl")
    machine.write_jsonl(jsonl, [dict(header, record="header")] + records)
    md = os.path.join(directory, "quality_bert_finetune.md")
    with open(md, "w") as f:
        f.write(markdown(header, records))
    return [jsonl, md, plot(directory, records)]
