"""Training curves as a PNG, drawn from runs' metrics.jsonl (the record every run writes)."""

import io
import json
import math
import warnings

import matplotlib

from zoo import paths
from zoo.errors import MissingFileError

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402

# Curves worth a panel beside the loss, when a run records them (train or eval).
_METRICS = ("perplexity", "mlm_accuracy", "nsp_accuracy", "exact", "f1", "accuracy",
            "HasAns_f1", "NoAns_exact")


def read_metrics(workdir: str) -> list[dict]:
    """The records of <workdir>/metrics.jsonl; a resumed run's repeated steps keep the last."""
    path = paths.join(workdir, "metrics.jsonl")
    if not paths.as_path(path).exists():
        raise MissingFileError(f"{path} does not exist: train the run first")
    latest: dict[tuple[str, int], dict] = {}
    with paths.as_path(path).open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                # A run killed mid-write leaves a partial line (which its resumed run then
                # continues on): skip it rather than lose the whole plot.
                warnings.warn(f"{path}:{number}: not a JSON record; skipped", stacklevel=2)
                continue
            latest[(record["split"], record["step"])] = record
    return sorted(latest.values(), key=lambda r: (r["split"], r["step"]))


def plot_training_curves(runs: list[tuple[str, str]], path: str) -> list[str]:
    """One row per run (label, workdir): loss (train and eval) and its recorded metrics
    against step. Returns the panel titles drawn, row by row ('label: metric')."""
    rows = []
    for label, workdir in runs:
        records = read_metrics(workdir)
        names = [m for m in _METRICS if any(m in r for r in records)]
        rows.append((label, records, ["loss"] + names))
    columns = max(len(names) for _, _, names in rows)
    figure, axes = plt.subplots(len(rows), columns, squeeze=False,
                                figsize=(3.6 * columns, 2.8 * len(rows)))
    titles = []
    for row, (label, records, names) in enumerate(rows):
        for col in range(columns):
            ax = axes[row][col]
            if col >= len(names):
                ax.axis("off")
                continue
            name = names[col]
            for split, style in (("train", "-"), ("eval", "o-")):
                points = [(r["step"], r[name]) for r in records
                          if r["split"] == split and name in r and math.isfinite(r[name])]
                if points:
                    ax.plot(*zip(*points), style, label=split, markersize=3)
            ax.set_title(f"{label}: {name}", fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.legend(fontsize=7)
            titles.append(f"{label}: {name}")
    figure.tight_layout()
    png = io.BytesIO()  # matplotlib writes local files only; this also serves gs://
    figure.savefig(png, format="png", dpi=100)
    paths.write_atomic(path, png.getvalue())
    plt.close(figure)
    return titles
