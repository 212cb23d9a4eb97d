"""The collectives the real TPU compiler leaves inside blockwise attention's block loops, for
BERT-base's train step (seq 512, batch 64, bf16) on 16 v5e chips, data parallel: this
checkout's zoo/nn/blockwise_attention.py ("after") and another version of it ("before").

    git show 5192591:zoo/nn/blockwise_attention.py > /tmp/blockwise_before.py
    ALLOW_MULTIPLE_LIBTPU_LOAD=1 TPU_SKIP_MDS_QUERY=1 python -m benchmarks.blockwise_tpu_collectives \
        --before /tmp/blockwise_before.py --before-commit 5192591

Compile only, on this CPU: libtpu (installed with jax[tpu]) gives compile-only v5e devices
(zoo.train.compilation.topologies), the job's train step is built as train.py builds it
(zoo.train.program.abstract_train_step on ShapeDtypeStructs) and compiled by the TPU compiler; the
collectives are read from the compiled HLO (zoo.train.compilation.collectives). Each compile takes a
few minutes here. "before" swaps the other version's blockwise_attention into zoo.nn.attention (the
one name MultiHeadAttention calls).

The TPU compiler prints no trip counts for these loops, so the table also gives the executions
per step the loop bounds imply: layers x query blocks x key blocks for each of the forward and
backward loop nests (a vote per (query block, key block) pair).

Writes blockwise_tpu_collectives.jsonl and .md under benchmarks/results/<machine>/ (the machine
that compiled; the target is named in them).
"""

import os

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import machine  # noqa: E402
from benchmarks import step as bench_step  # noqa: E402
from zoo.models import bert  # noqa: E402
from zoo.nn import attention  # noqa: E402
from zoo.nn import blockwise_attention as bw  # noqa: E402
from zoo.train import program  # noqa: E402
from zoo.train.compilation import topologies
from zoo.train.compilation.collectives import collectives  # noqa: E402

NAME = "blockwise_tpu_collectives"
SLICE, SEQ, BATCH = "v5e-16", 512, 64


def measure(label: str, commit: str, block: int) -> dict:
    devices = topologies.compile_only_devices(topologies.parse(SLICE))
    mesh = jax.sharding.Mesh(np.array(devices).reshape(len(devices), 1, 1),
                             ("data", "fsdp", "tensor"),
                             axis_types=(jax.sharding.AxisType.Auto,) * 3)
    config = bench_step.job_config("bert", "base", SEQ, BATCH, "bfloat16")
    config.model.backend = "blockwise"
    config.model.attention_block = block
    task = bench_step.make_task("bert", config, bench_step.SIZES["bert"]["base"].vocab_size)
    start = time.perf_counter()
    step, args = program.abstract_train_step(task, config, mesh)
    with program.lowering_context(config, mesh):
        compiled = step.lower(*args).compile()
    found = collectives(compiled.as_text())
    inside = [c for c in found if c.inside("attention")]
    blocks = -(-SEQ // block)
    layers = bert.config_for_size(config.model.size, vocab_size=1).num_layers
    return {
        "label": label, "commit": commit, "target": f"{SLICE} (data={len(devices)})",
        "model": "bert-base", "seq": SEQ, "batch": BATCH, "block": block,
        "layers": layers, "compile_s": time.perf_counter() - start,
        "collectives": len(found),
        "in_attention_loops": len(inside),
        "in_attention_loops_kinds": sorted({f"{c.kind} {c.dtype}{list(c.shapes)} x "
                                            f"{c.group_size} devices" for c in inside}),
        "in_attention_loops_op_names": sorted({c.op_name for c in inside}),
        # One vote per (query block, key block) pair per layer, in the forward and the
        # backward loop nests, where a collective sits in each.
        "implied_executions_per_step": len(inside) * layers * blocks * blocks,
        # Where a loop runs once the compiler drops it, and a vote outside any attention loop
        # is left: every collective that came from an attention op, in a loop or not.
        "from_attention_ops": sum("attention" in c.op_name for c in found),
        "all_collectives": sorted(f"{c.kind} {c.dtype}{list(c.shapes)} {c.op_name}"
                                  for c in found),
    }


def _table(records: list[dict]) -> str:
    commits = {r["label"]: r["commit"] for r in records}
    lines = [
        f"# Blockwise attention's collectives, compiled by the TPU compiler for {SLICE}",
        "",
        f"BERT-base train step (zoo.train.program.abstract_train_step), seq {SEQ}, batch "
        f"{BATCH}, bf16, layer scan, data parallel over {SLICE}'s chips; compiled on "
        f"{records[0]['machine']} through libtpu (compile only), jax {records[0]['jax']}. "
        "Collectives read from the compiled HLO (zoo.train.compilation.collectives); "
        "'in attention loops' = "
        "inside a while loop whose op name contains 'attention' (the block loops); 'from "
        "attention ops' = whose own op name contains 'attention', in a loop or not (at block "
        "512 = seq there is one block: the compiler drops the one-trip block loops, and the "
        "old per-block vote is left in the layer loop). "
        "'implied executions' = count x layers x query blocks x key blocks (the TPU compiler "
        "prints no trip counts).",
        "",
        "Commits: " + "; ".join(f"**{k}** = {v}" for k, v in sorted(commits.items())),
        "",
        "| version | block | collectives in step | from attention ops | in attention loops | "
        "implied executions / step | kinds in loops | compile s |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in sorted(records, key=lambda r: (-r["block"], r["label"] != "before")):
        lines.append(
            f"| {r['label']} | {r['block']} | {r['collectives']} | {r['from_attention_ops']} | "
            f"{r['in_attention_loops']} | "
            f"{r['implied_executions_per_step']} | "
            f"{', '.join(r['in_attention_loops_kinds']) or '–'} | {r['compile_s']:.0f} |")
    return "\n".join(lines) + "\n"


def _rewrite_table(out: str) -> None:
    """blockwise_tpu_collectives.md again from the .jsonl (no compile)."""
    with open(os.path.join(out, NAME + ".jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(out, NAME + ".md"), "w") as f:
        f.write(_table(records))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=None,
                        help="a blockwise_attention.py of another commit (git show)")
    parser.add_argument("--before-commit", default="unknown")
    parser.add_argument("--blocks", default="128,512", help="attention_block values")
    parser.add_argument("--out", default=None)
    parser.add_argument("--table-only", action="store_true",
                        help="rewrite the .md from the .jsonl already there (no compile)")
    args = parser.parse_args()
    if args.table_only:
        _rewrite_table(machine.results_dir(args.out))
        return
    versions = {}
    if args.before:
        before = machine.load_module_file(args.before, "blockwise_before")
        versions["before"] = (before.blockwise_attention, args.before_commit)
    versions["after"] = (bw.blockwise_attention, machine.zoo_commit())
    records = []
    for block in (int(b) for b in args.blocks.split(",")):
        for label, (function, commit) in versions.items():
            attention.blockwise_attention = function  # what MultiHeadAttention calls
            try:
                record = measure(label, commit, block)
            finally:
                attention.blockwise_attention = bw.blockwise_attention
            record = {"machine": machine.machine_name(), "jax": jax.__version__, **record}
            print(json.dumps({k: v for k, v in record.items() if k != "all_collectives"}),
                  flush=True)
            records.append(record)
    out = machine.results_dir(args.out)
    machine.write_jsonl(os.path.join(out, NAME + ".jsonl"), records)
    with open(os.path.join(out, NAME + ".md"), "w") as f:
        f.write(_table(records))
    print(f"wrote {out}/{NAME}.jsonl and .md")


if __name__ == "__main__":
    main()
