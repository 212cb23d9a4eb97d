"""Pod readiness from the real TPU compiler, run on this CPU (libtpu: the tpu extra).

    python -m benchmarks.compile --readiness   # recipes x slices: fits, memory, FLOPs, comms
    python -m benchmarks.compile --readiness --recipes "BERT-large phase 2" --slices 2xv5e-256
    python -m benchmarks.compile --dry-run     # the dry run's memory estimate vs the compiler
    python -m benchmarks.compile --refresh     # both tables' shape-only figures again, no compiles

--readiness compiles each recipe's train step (the job config's model, optimizer, global batch
and default mesh: data parallel over every chip) for each slice and records: whether it fits
in HBM (the compiler's own verdict), per-device memory, the matmul FLOPs per step (executed,
zoo.train.compilation.flops), the bytes each device sends per step (ring algorithms over the
compiled program's collectives, zoo.train.compilation.collectives), and the time those bytes need at
the chip's ICI bandwidth beside the compute time at 50% MFU (zoo.train.compilation.chips, with
sources). A slice named `2xv5e-256` is two v5e-256 slices (Multislice: the mesh's data axis across
them, each slice running the recipe's global batch, so twice the batch in all); its row adds what
crosses slices: the bytes each device sends over the data-center network per step and their time at
the chip's share of the DCN bandwidth. What it cannot say: how much of the communication XLA
overlaps with compute (the two times are the bounds of the question, not the answer), host input
speed, or anything about a real run's MFU.

--dry-run puts zoo.train.compilation.dry_run's per-device estimate beside the compiler's figure for
BERT-base (seq 128, 512), BERT-large (512) and GPT-2 124M / 355M (1024) on data / FSDP / tensor /
mixed layouts of v4-32 (16 chips, 32 GiB each).

The jobs' tasks are benchmarks.step's (the real losses and models, random batches of the right
shapes: no corpus to prepare). Writes compile_readiness.{jsonl,md} / compile_dry_run.{jsonl,md}
under benchmarks/results/<machine>/ (the machine that ran the compiler; the figures are the
TPU's), one JSON line per compile as it finishes.
"""

import argparse
import json
import os
import re
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile for TPUs, run nothing on one

from benchmarks import machine  # noqa: E402
from benchmarks import step as bench_step  # noqa: E402
from zoo.train import partitioning, program
from zoo.train.compilation import aot, dry_run, flops, topologies  # noqa: E402
from zoo.train.compilation.chips import GIB  # noqa: E402

# recipe -> (model, size, seq_len, global batch[, overrides: config.model's keys, or dotted
# keys of other sections]): configs/bert_pretrain.py's AdamW recipes, GPT-2's 512 x 1024 tokens
# (also with every layer recomputed: what the table says to try where it does not fit). The rbg
# rows draw dropout's masks with rbg, `auto`'s choice for these steps until the TPU compiler
# showed that every device then draws the whole batch's bits (zoo.train.dropout_rng).
RECIPES = {
    "BERT-base phase 1": ("bert", "base", 128, 256),
    "BERT-base phase 2": ("bert", "base", 512, 256),
    "BERT-large phase 2": ("bert", "large", 512, 256),
    "GPT-2 124M": ("gpt", "124M", 1024, 512),
    "GPT-2 124M, remat=full": ("gpt", "124M", 1024, 512, {"remat": "full"}),
    "GPT-2 355M": ("gpt", "355M", 1024, 512),
    "GPT-2 355M, remat=full": ("gpt", "355M", 1024, 512, {"remat": "full"}),
    "BERT-large phase 2, rbg": ("bert", "large", 512, 256, {"train.dropout_rng": "rbg"}),
    "GPT-2 355M, rbg": ("gpt", "355M", 1024, 512, {"train.dropout_rng": "rbg"}),
    "GPT-2 355M, remat=full, rbg": ("gpt", "355M", 1024, 512,
                                    {"remat": "full", "train.dropout_rng": "rbg"}),
}
SLICES = ("v4-8", "v4-32", "v5e-16", "v5e-256", "v5p-128")
# Rows beyond the grid: Multislice, the recipes a v5e pod is too small for at the batch.
MULTISLICE_ROWS = tuple((recipe, "2xv5e-256") for recipe in (
    "BERT-large phase 2", "BERT-large phase 2, rbg", "GPT-2 355M", "GPT-2 355M, rbg",
    "GPT-2 355M, remat=full", "GPT-2 355M, remat=full, rbg"))
# The dry-run table: (model, size, seq_len, global batch) on v4-32's 16 devices.
DRY_RUN_MODELS = (("bert", "base", 128, 256), ("bert", "base", 512, 64),
                  ("bert", "large", 512, 64), ("gpt", "124M", 1024, 64),
                  ("gpt", "355M", 1024, 32))
# Neither vocabulary (BERT's 30,522, GPT-2's 50,257) splits 4 ways: tensor layouts shard the
# rest and keep the embedding's vocabulary axis whole.
_DRY_RUN_KEY = ("model", "seq_len", "layout")
LAYOUTS = {"data": (16, 1, 1), "fsdp": (1, 16, 1), "tensor": (4, 1, 4), "mixed": (2, 2, 4)}


def _job(model: str, size: str, seq_len: int, batch: int, overrides=None, layout=(-1, 1, 1)):
    config = bench_step.job_config(model, size, seq_len, batch, "bfloat16")
    for key, value in (overrides or {}).items():
        section, _, name = key.rpartition(".")
        config[section or "model"][name] = value
    config.mesh.update(data=layout[0], fsdp=layout[1], tensor=layout[2])
    if layout[2] > 1:
        config.mesh.rules = [r for r in config.mesh.rules if r[0] not in ("vocab", "act_vocab")]
        config.mesh.rules += [["vocab", None], ["act_vocab", None]]
    return config, bench_step.make_task(model, config, bench_step.SIZES[model][size].vocab_size)


def _slice(name: str) -> topologies.Slice:
    """'v5e-256', or '2xv5e-256' for two of them."""
    count, _, single = name.rpartition("x")
    return topologies.parse(single, int(count)) if count.isdigit() else topologies.parse(name)


def _recipe_job(recipe: str, tpu_slice: topologies.Slice):
    """The recipe's job on `tpu_slice`: each slice runs the recipe's global batch."""
    model, size, seq_len, batch, *overrides = RECIPES[recipe]
    return _job(model, size, seq_len, batch * tpu_slice.num_slices, *overrides)


def _cross_slice(step) -> dict:
    """What crosses slices: the bytes each device sends over the DCN per step, their time, and
    the crossing collectives by kind and dtype (count, MiB sent per device)."""
    kinds = {}
    for c in step.cross_slice:
        entry = kinds.setdefault(f"{c.kind} {c.dtype}", {"count": 0, "dcn_mib": 0.0})
        entry["count"] += 1
        entry["dcn_mib"] += c.dcn_bytes * (c.executions or 1) / 2**20
    return {"dcn_mib": step.dcn_bytes / 2**20, "dcn_ms": step.dcn_seconds() * 1e3,
            "cross_slice": kinds,
            # in a loop: with scanned layers each layer's gradient is reduced in the backward
            # scan as it is produced (the multislice program's loop keeps no op name)
            "cross_slice_in_loops": sum(bool(c.loops) for c in step.cross_slice)}


def _compile(config, task, tpu_slice) -> dict:
    try:
        step = aot.compile_train_step(task, config, tpu_slice)
    except aot.DoesNotFitError as e:
        return {"fits": False, "error": str(e).split("the TPU compiler says: ")[-1]}
    slices = _cross_slice(step) if tpu_slice.num_slices > 1 else {}
    return {
        "fits": step.fits, "compile_s": round(step.compile_seconds, 1),
        "arguments_gib": step.argument_bytes / GIB, "outputs_gib": step.output_bytes / GIB,
        "aliased_gib": step.alias_bytes / GIB, "temporaries_gib": step.temp_bytes / GIB,
        "total_gib": step.total_bytes / GIB, "hbm_gib": step.hbm_bytes / GIB,
        "executed_flops": step.executed_flops, "model_flops": step.model_flops,
        "sent_mib": step.collective_bytes / 2**20,
        "comm_ms": step.communication_seconds() * 1e3,
        "compute_ms_at_50pct_mfu": step.compute_seconds(0.5) * 1e3,
        "collectives": len(step.collectives),
        "in_attention_loops": sum(c.inside("attention") for c in step.collectives), **slices,
    }


def readiness(out: str, rows) -> list[dict]:
    """Compiles each (recipe, slice) of `rows`, one JSON line each as it finishes."""
    done = []
    with open(os.path.join(out, "compile_readiness.jsonl"), "a") as jsonl:
        for recipe, name in rows:
            tpu_slice = _slice(name)
            config, task = _recipe_job(recipe, tpu_slice)
            row = {"recipe": recipe, "slice": name, "slices": tpu_slice.num_slices,
                   "devices": tpu_slice.devices, "seq_len": config.data.seq_len,
                   "batch": config.data.batch_size, **_compile(config, task, tpu_slice)}
            done.append(row)
            jsonl.write(json.dumps(row) + "\n")
            jsonl.flush()
            print(json.dumps(row), flush=True)
    return done


def dry_run_table(out: str) -> list[dict]:
    """Layout by layout (every model's data-parallel row first), skipping rows the JSON lines
    already hold, so an interrupted grid resumes."""
    rows = []
    tpu_slice = topologies.parse("v4-32")
    devices = topologies.compile_only_devices(tpu_slice)
    path = os.path.join(out, "compile_dry_run.jsonl")
    done = ({(r["model"], r["seq_len"], r["layout"]) for r in _latest(path, _DRY_RUN_KEY)}
            if os.path.exists(path) else set())
    with open(path, "a") as jsonl:
        for layout_name, layout in LAYOUTS.items():
            for model, size, seq_len, batch in DRY_RUN_MODELS:
                if (f"{model} {size}", seq_len, layout_name) in done:
                    continue
                config, task = _job(model, size, seq_len, batch, layout=layout)
                estimate = dry_run.report(config, "", lambda c, w, t=task: t, devices)
                row = {"model": f"{model} {size}", "seq_len": seq_len, "batch": batch,
                       "layout": layout_name, "mesh": list(layout),
                       "dry_run_gib": estimate["total_bytes_per_device"] / GIB,
                       **_compile(config, task, tpu_slice)}
                if "total_gib" in row:
                    row["ratio"] = row["dry_run_gib"] / row["total_gib"]
                rows.append(row)
                jsonl.write(json.dumps(row) + "\n")
                jsonl.flush()
                print(json.dumps(row), flush=True)
    return rows


def _executed_flops(config, task, devices) -> float:
    """zoo.train.compilation.flops' count for the step on `devices`, per device (shapes only)."""
    mesh = partitioning.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor,
                                  devices=devices)
    train_step, args = program.abstract_train_step(task, config, mesh)
    with program.lowering_context(config, mesh):
        return flops.executed_flops(train_step, *args) / mesh.size


def refresh(out: str) -> None:
    """The shape-only figures of both tables' rows again, from the code as it is now: the dry
    run's estimate and the executed FLOPs (nothing is compiled: the compiler's figures stay as
    measured)."""
    path = os.path.join(out, "compile_dry_run.jsonl")
    if os.path.exists(path):
        devices = topologies.compile_only_devices(topologies.parse("v4-32"))
        rows = _latest(path, _DRY_RUN_KEY)
        for row in rows:
            model, size = row["model"].split()
            config, task = _job(model, size, row["seq_len"], row["batch"],
                                layout=tuple(row["mesh"]))
            estimate = dry_run.report(config, "", lambda c, w, t=task: t, devices)
            row["dry_run_gib"] = estimate["total_bytes_per_device"] / GIB
            if "total_gib" in row:
                row["ratio"] = row["dry_run_gib"] / row["total_gib"]
                row["executed_flops"] = _executed_flops(config, task, devices)
        machine.write_jsonl(path, rows)
    path = os.path.join(out, "compile_readiness.jsonl")
    if os.path.exists(path):
        rows = _latest(path, ("recipe", "slice"))
        for row in rows:
            if "total_gib" in row:
                tpu_slice = _slice(row["slice"])
                config, task = _recipe_job(row["recipe"], tpu_slice)
                row["executed_flops"] = _executed_flops(
                    config, task, topologies.compile_only_devices(tpu_slice))
                row["hbm_gib"] = tpu_slice.chip.hbm_bytes / GIB
                row["fits"] = row["total_gib"] <= row["hbm_gib"]
        machine.write_jsonl(path, rows)


def _no(row: dict) -> str:
    """A row that did not fit, in a few words: the compiler's need against the HBM it has."""
    need = re.search(r"\(([\d.]+)G\) exceeds available HBM \(([\d.]+)G\)", row["error"])
    return (f"**no**: needs {need.group(1)} GB of {need.group(2)}" if need
            else f"**no**: {row['error'][:80]}")


def readiness_markdown(rows: list[dict]) -> str:
    lines = ["| recipe | slice | global batch | fits | GiB per device (HBM) | TFLOP per device per "
             "step | MiB sent per device | comm ms at ICI | MiB to other slices per device | "
             "DCN ms | compute ms at 50% MFU | comm / compute |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {r['recipe']} | {r['slice']} | {r['batch']} |"
        if "total_gib" not in r:
            lines.append(f"{head} {_no(r)} | | | | | | | | |")
            continue
        # comm / compute: the ICI and DCN times as if neither overlapped the other
        ratio = (r["comm_ms"] + r.get("dcn_ms", 0.0)) / r["compute_ms_at_50pct_mfu"]
        dcn = (f"{r['dcn_mib']:.0f} | {r['dcn_ms']:.1f}" if "dcn_mib" in r else "- | -")
        lines.append(
            f"{head} {'yes' if r['fits'] else '**no**'} | "
            f"{r['total_gib']:.2f} ({r['hbm_gib']:.0f}) | {r['executed_flops'] / 1e12:.2f} | "
            f"{r['sent_mib']:.0f} | {r['comm_ms']:.1f} | {dcn} | "
            f"{r['compute_ms_at_50pct_mfu']:.1f} | {ratio:.2f} |")
    return "\n".join(lines) + "\n"


def dry_run_markdown(rows: list[dict]) -> str:
    lines = ["| model | seq | batch | layout (data, fsdp, tensor) | dry run GiB | compiler GiB "
             "| dry run / compiler |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        compiler = f"{r['total_gib']:.2f}" if "total_gib" in r else _no(r)
        ratio = f"{r['ratio']:.2f}" if "ratio" in r else ""
        lines.append(f"| {r['model']} | {r['seq_len']} | {r['batch']} | {r['layout']} "
                     f"{tuple(r['mesh'])} | {r['dry_run_gib']:.2f} | {compiler} | {ratio} |")
    return "\n".join(lines) + "\n"


def _latest(path: str, key: tuple[str, ...]) -> list[dict]:
    rows = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            rows[tuple(row[k] for k in key)] = row
    return list(rows.values())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readiness", action="store_true")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--refresh", action="store_true",
                        help="recompute both tables' shape-only figures (dry-run estimates, "
                        "executed FLOPs) from the current code; no compiles")
    parser.add_argument("--recipes", nargs="*", default=None,
                        help="only these recipes (default: all)")
    parser.add_argument("--slices", nargs="*", default=None,
                        help="only these slices, e.g. v5e-256 or 2xv5e-256 (two slices); "
                        "without --recipes/--slices: every recipe on SLICES, and "
                        "MULTISLICE_ROWS")
    parser.add_argument("--out", default=None, help="results directory")
    args = parser.parse_args()
    unknown = [r for r in args.recipes or () if r not in RECIPES]
    if unknown:
        parser.error(f"--recipes: no recipe {unknown[0]!r}; the recipes: "
                     + ", ".join(repr(r) for r in RECIPES))
    out = machine.results_dir(args.out)
    began = time.time()
    # Each table is written from every row its JSON lines hold (a later row of the same
    # recipe and slice replaces an earlier one), so a grid may be run in parts.
    if args.refresh:
        refresh(out)
    if args.readiness:
        grid = [(r, s) for r in args.recipes or RECIPES for s in args.slices or SLICES]
        if args.recipes is None and args.slices is None:
            grid += list(MULTISLICE_ROWS)
        readiness(out, grid)
    if args.readiness or args.refresh:
        rows = _latest(os.path.join(out, "compile_readiness.jsonl"), ("recipe", "slice"))
        with open(os.path.join(out, "compile_readiness.md"), "w") as f:
            f.write(readiness_markdown(rows))
    if args.dry_run or args.refresh:
        if args.dry_run:
            dry_run_table(out)
        rows = _latest(os.path.join(out, "compile_dry_run.jsonl"), _DRY_RUN_KEY)
        with open(os.path.join(out, "compile_dry_run.md"), "w") as f:
            f.write(dry_run_markdown(rows))
    print(f"done in {time.time() - began:.0f} s; results in {out}", flush=True)


if __name__ == "__main__":
    main()
