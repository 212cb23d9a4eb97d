"""benchmarks.quality_translate's outputs: quality_translate.{jsonl,md}, the validation-loss
curves of both sides and one cross-attention map per model of a real verse."""

import json
import os

import numpy as np


def median_ms(seconds: list[float]) -> float:
    """Median step time, the first 10% (the compiles of each length bucket) left out."""
    return 1000.0 * float(np.median(seconds[max(1, len(seconds) // 10):]))


def summarize(record: dict) -> dict:
    z, p = record["sides"]["zoo"], record["sides"]["peer"]
    return {"model": record["model"], "seed": record["seed"],
            "val_loss": {"zoo": z["final_val_loss"], "peer": p["final_val_loss"]},
            "bleu": {"zoo": z["bleu"], "peer": p["bleu"]},
            "ms_per_step": {"zoo": median_ms(z["step_s"]), "peer": median_ms(p["step_s"])},
            "params": {"zoo": z["params"], "peer": p["params"]}}


def write_report(directory: str, header: dict, records: list[dict]) -> list[str]:
    """quality_translate.{jsonl,md}, quality_translate_curves.png and one
    quality_translate_attention_<model>.png per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = os.path.join(directory, "quality_translate")
    with open(base + ".jsonl", "w") as f:
        f.write(json.dumps(header) + "\n")
        for record in records:
            f.write(json.dumps(dict(record, summary=summarize(record))) + "\n")
    models = list(dict.fromkeys(r["model"] for r in records))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        for record in (r for r in records if r["model"] == model):
            for side, style in (("zoo", "-"), ("peer", "--")):
                steps, losses = zip(*record["sides"][side]["curve"])
                ax.plot(steps, losses, style, label=f"{side} seed {record['seed']}")
        ax.set(title=model, xlabel="step", ylabel="validation loss (nats/token)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths = [base + ".jsonl", base + ".md", base + "_curves.png"]
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    for model in models:
        record = next(r for r in records if r["model"] == model)
        verse = record["attention_verse"]
        fig, axes = plt.subplots(1, 2, figsize=(13, 6.5))
        for ax, side in zip(axes, ("zoo", "peer")):
            ax.imshow(np.asarray(record["sides"][side]["attention"]), cmap="viridis",
                      aspect="auto", vmin=0.0)
            ax.set_xticks(range(len(verse["source"])), verse["source"], rotation=90, fontsize=6)
            ax.set_yticks(range(len(verse["target"])), verse["target"], fontsize=6)
            ax.set_title(f"{side}: {model} seed {record['seed']} cross-attention"
                         + (" (last layer, mean of heads)" if model == "transformer" else ""),
                         fontsize=8)
        fig.tight_layout()
        paths.append(f"{base}_attention_{model}.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    with open(base + ".md", "w") as f:
        f.write(markdown(header, records))
    return paths


def markdown(header: dict, records: list[dict]) -> str:
    lines = ["# Translation pairs: zoo beside PyTorch, Spanish -> English Bible (issue 37)", "",
             f"Machine {header['machine']}, zoo {header['zoo_commit']}, jax {header['jax']}, "
             f"torch {header['torch']} ({header['threads']} threads), {header['mode']} run "
             f"started {header['started']}, {header['wall_s'] / 60:.1f} min.", "",
             f"Recipe: {json.dumps(header['recipe'])}.", "",
             "Validation loss: mean token NLL, first eval_verses verses of validation.tsv. "
             "BLEU: sacrebleu corpus BLEU of the first decode_verses verses of test.tsv, beam 4, "
             "alpha 0.6. ms/step: median (first 10% of steps left out), measured in turns.", "",
             "| model | seed | val loss zoo | val loss peer | BLEU zoo | BLEU peer | "
             "ms/step zoo | ms/step peer | params zoo / peer |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in map(summarize, records):
        lines.append(
            f"| {s['model']} | {s['seed']} | {s['val_loss']['zoo']:.3f} | "
            f"{s['val_loss']['peer']:.3f} | {s['bleu']['zoo']:.2f} | {s['bleu']['peer']:.2f} | "
            f"{s['ms_per_step']['zoo']:.0f} | {s['ms_per_step']['peer']:.0f} | "
            f"{s['params']['zoo']:,} / {s['params']['peer']:,} |")
    lines += ["", "## Goals (mean over seeds)", ""]
    for model in dict.fromkeys(r["model"] for r in records):
        ss = [summarize(r) for r in records if r["model"] == model]
        mean = lambda key, side: float(np.mean([s[key][side] for s in ss]))  # noqa: E731
        bleu_gap = mean("bleu", "zoo") - mean("bleu", "peer")
        loss_gap = mean("val_loss", "zoo") - mean("val_loss", "peer")
        spread = max(max(s["val_loss"][k] for s in ss) - min(s["val_loss"][k] for s in ss)
                     for k in ("zoo", "peer"))
        ratio = mean("ms_per_step", "zoo") / mean("ms_per_step", "peer")
        lines.append(
            f"- {model}: BLEU zoo - peer {bleu_gap:+.2f} "
            f"({'met' if bleu_gap > -1.0 else 'NOT met'}: within 1 of the peer or above); "
            f"val loss zoo - peer {loss_gap:+.3f} (seed spread {spread:.3f}); "
            f"time per step zoo / peer {ratio:.2f} ({'met' if ratio <= 1.0 else 'NOT met'}).")
    lines += ["", "## Samples (seed of the first record per model)", ""]
    for model in dict.fromkeys(r["model"] for r in records):
        record = next(r for r in records if r["model"] == model)
        lines.append(f"### {model}")
        for k, (src, ref) in enumerate(zip(record["sources"], record["references"])):
            lines += ["", f"- source: {src}", f"  - reference: {ref}",
                      f"  - zoo: {record['sides']['zoo']['samples'][k]}",
                      f"  - peer: {record['sides']['peer']['samples'][k]}"]
        lines.append("")
    lines += ["Plots: quality_translate_curves.png (validation loss), "
              "quality_translate_attention_<model>.png (one test verse's cross-attention, zoo "
              "left, peer right).", ""]
    lines += [f"- {note}" for note in header["notes"]]
    return "\n".join(lines) + "\n"
