"""Blockwise attention under data (and tensor) parallelism on 8 fake CPU devices: the time of a
forward + backward, and the collectives XLA leaves inside the attention's block loops, for this
checkout's zoo/nn/blockwise_attention.py ("after") beside another version of that file
("before", e.g. the commit before issue 28's fix), measured in one process, calls interleaved.

    git show 5192591:zoo/nn/blockwise_attention.py > /tmp/blockwise_before.py
    python -m benchmarks.blockwise_sharded --before /tmp/blockwise_before.py --before-commit 5192591

Issue 28: left to XLA's partitioner, the blockwise backend's "does any row of this (query block,
key block) share a segment" test is an `any` over the sharded batch, so every step of both block
loops (forward and backward) ran an all-reduce of one bool across the data-parallel devices,
and one padded row anywhere kept a block alive for every row. Run per device (shard_map over
batch rows and heads), each device votes on its own rows: no collective in the loops, and a
device whose rows are short skips the blocks only other devices need.

What is timed: jit(value_and_grad(sum(attention(q, k, v) * d_out))) with respect to q, k, v,
BERT-small-like heads (8 x 64), batch 8 (one row per device on data=8), block 128, packed
documents with trailing padding that differs per row (seeded), under `jax.set_mesh` and the
default logical rules (act_batch -> data, fsdp; act_heads -> tensor) with q / k / v split that
way. After one warm-up call each, the two versions' calls alternate, in turns who goes first
(`--repeats` each, every call ended by block_until_ready), so load from other work on shared
cores falls on both alike; the median and minimum wall time and the median CPU time (this
process, all threads) of a call are reported. The collectives are read from each compiled program
(zoo.train.compilation.collectives): those inside a while loop (every loop of this program is the
attention's), their count and their executions per step (count x trip counts).

Writes blockwise_sharded.jsonl (every record) and blockwise_sharded.md (before / after side by
side) under benchmarks/results/<machine>/ (or --out).
"""

import os

# 8 fake devices, before jax is imported (a no-op where the caller set them).
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from benchmarks import machine  # noqa: E402
from zoo.nn import blockwise_attention as bw  # noqa: E402
from zoo.nn.masks import MaskSpec  # noqa: E402
from zoo.train import partitioning  # noqa: E402
from zoo.train.compilation.collectives import collectives  # noqa: E402

BATCH, HEADS, HEAD_DIM, BLOCK = 8, 8, 64, 128
NAME = "blockwise_sharded"


def segments(seq: int, layout: str = "padded", seed: int = 0) -> np.ndarray:
    """[BATCH, seq] packed documents (ids 1, 2, ...) of seq/8 to seq/2 tokens. 'padded': then
    padding (0), row r holding about (r + 1) / BATCH of seq real tokens (one vote for the
    whole batch keeps what the longest rows need; a device votes on its own rows). 'full':
    every row the same documents and no padding (every device needs what the whole batch
    needs: the times differ by the collectives alone)."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(BATCH):
        real = max(BLOCK // 2, seq * (r + 1) // BATCH - int(rng.integers(0, BLOCK // 2)))
        if layout == "full":
            real, rng = seq, np.random.default_rng(seed)
        ids, doc = [], 1
        while len(ids) < real:
            ids += [doc] * int(rng.integers(seq // 8, seq // 2 + 1))
            doc += 1
        rows.append(np.pad(np.array(ids[:real]), (0, seq - real)))
    return np.stack(rows).astype(np.int32)


def measure(seq: int, layout: str, data: int, tensor: int, repeats: int,
            versions: dict) -> list[dict]:
    """One record per version (label -> (module, commit)) for this length, segment layout
    and mesh."""
    mesh = partitioning.make_mesh(data=data, fsdp=1, tensor=tensor)
    rng = np.random.default_rng(seq)
    shape = (BATCH, seq, HEADS, HEAD_DIM)
    qkv = NamedSharding(mesh, P(("data", "fsdp"), None, "tensor", None))
    rows = NamedSharding(mesh, P(("data", "fsdp"), None))
    q, k, v, d_out = (jax.device_put(rng.normal(size=shape).astype(np.float32), qkv)
                      for _ in range(4))
    seg = segments(seq, layout)
    spec = jax.tree.map(lambda x: jax.device_put(x, rows),
                        MaskSpec.self_attention(seg, packed=True))
    args = (q, k, v, d_out, spec)

    compiled, info, times = {}, {}, {}
    with jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.DEFAULT_RULES):
        for label, (module, _) in versions.items():
            def loss(q, k, v, d_out, spec, module=module):
                out = module.blockwise_attention(q, k, v, spec=spec, block_q=BLOCK,
                                                 block_k=BLOCK)
                return jnp.sum(out * d_out)

            step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
            compiled[label], stats = machine.compile_with_stats(step, *args)
            found = collectives(compiled[label].as_text())
            looped = [c for c in found if c.loops]
            info[label] = {
                "compile_s": stats["compile_s"], "collectives": len(found),
                "collectives_in_loops": len(looped),
                "loop_collective_executions": int(sum(c.executions or 1 for c in looped)),
                "loop_collective_kinds": sorted({f"{c.kind} {c.dtype}" for c in looped}),
            }
            jax.block_until_ready(compiled[label](*args))  # warm-up
            times[label] = []
        for r in range(repeats):
            # Alternate who goes first too: a call right after the other's may pay for it.
            for label in (list(versions) if r % 2 == 0 else list(versions)[::-1]):
                times[label].append(_timed(compiled[label], *args))
    n_blocks = -(-seq // BLOCK)
    per_device = [len(bw.block_pairs(MaskSpec.self_attention(seg[i:i + BATCH // data],
                                                             packed=True), seq, seq, BLOCK,
                                     BLOCK))
                  for i in range(0, BATCH, BATCH // data)]
    common = {
        "seq": seq, "layout": layout, "mesh": f"data={data} tensor={tensor}", "batch": BATCH,
        "heads": HEADS,
        "head_dim": HEAD_DIM, "block": BLOCK, "repeats": repeats,
        # What the segments leave of the n x n block grid: over the whole batch (one vote for
        # all rows) and, per device, its own rows' (the most and the mean a device needs).
        "block_grid": n_blocks * n_blocks,
        "pairs_whole_batch": len(bw.block_pairs(MaskSpec.self_attention(seg, packed=True), seq,
                                                seq, BLOCK, BLOCK)),
        "pairs_per_device_max": max(per_device),
        "pairs_per_device_mean": sum(per_device) / len(per_device),
        "load_1min": os.getloadavg()[0],  # other work on the shared cores skews the times
    }
    return [{"label": label, "commit": commit, **common, **info[label],
             "median_s": statistics.median(t[0] for t in times[label]),
             "min_s": min(t[0] for t in times[label]),
             "cpu_median_s": statistics.median(t[1] for t in times[label])}
            for label, (_, commit) in versions.items()]


def _timed(fn, *args) -> tuple[float, float]:
    """Wall seconds and this process's CPU seconds (user + system, every thread) of one call.
    CPU time is the steadier of the two when other work shares the cores: it counts the work
    the 8 fake devices did, not how long they waited for a core (or for each other)."""
    before_cpu, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    jax.block_until_ready(fn(*args))
    wall, after_cpu = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    return wall, (after_cpu.ru_utime - before_cpu.ru_utime
                  + after_cpu.ru_stime - before_cpu.ru_stime)


def _table(records: list[dict]) -> str:
    by = {(r["label"], r["layout"], r["mesh"], r["seq"]): r for r in records}
    labels = {r["label"]: r["commit"] for r in records}
    lines = [
        f"# Blockwise attention, sharded forward + backward, on {records[0]['machine']}",
        "",
        f"jax {records[0]['jax']}; 8 fake CPU devices (XLA_FLAGS="
        "--xla_force_host_platform_device_count=8) sharing this machine's cores; "
        f"batch {BATCH}, {HEADS} heads x {HEAD_DIM}, block {BLOCK}, float32, packed documents "
        "with per-row trailing padding (benchmarks/blockwise_sharded.py `segments`); "
        "q / k / v split over data (batch) and tensor (heads). One process; after a warm-up "
        f"each, the versions' calls alternate, {records[0]['repeats']} each; ms = median wall "
        "time (minimum in the jsonl); CPU ms = median CPU time of the process during a call "
        "(user + system, all threads: the work done, steadier than wall time when other "
        "work shares the cores).",
        "",
        "Commits: " + "; ".join(f"**{label}** = {commit}" for label, commit in
                                sorted(labels.items())),
        "",
        "'loop coll.' = collectives inside the attention's while loops in the compiled program "
        "(zoo.train.compilation.collectives); 'execs/step' = how often they run per step "
        "(count x trip counts). 'pairs' = (query block, key block) pairs the segments leave: "
        "whole batch (one vote for all rows, the old decision: every device computes these) / the most "
        "and the mean any one device's rows need (the per-device decision) / the full grid. "
        "'load' = the 1-minute load average when measured (before / after).",
        "",
        "| segments | mesh | seq | before ms | after ms | after / before | before CPU ms | "
        "after CPU ms | CPU after / before | loop coll. before | "
        "loop coll. after | execs/step before | execs/step after | pairs batch / device max "
        "/ device mean / grid | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    keys = sorted({(r["layout"], r["mesh"], r["seq"]) for r in records},
                  key=lambda x: (x[0] != "padded", x[1], x[2]))
    ms = lambda r: "–" if r is None else f"{1e3 * r['median_s']:.1f}"
    field = lambda r, name: "–" if r is None else str(r[name])
    load = lambda r: "–" if r is None else f"{r['load_1min']:.1f}"
    cpu = lambda r: "–" if r is None else f"{1e3 * r['cpu_median_s']:.0f}"
    for layout, mesh, seq in keys:
        before = by.get(("before", layout, mesh, seq))
        after = by.get(("after", layout, mesh, seq))
        ref = after or before
        ratio = (f"{after['median_s'] / before['median_s']:.2f}" if before and after else "–")
        cpu_ratio = (f"{after['cpu_median_s'] / before['cpu_median_s']:.2f}" if before and after
                     else "–")
        lines.append(
            f"| {layout} | {mesh} | {seq} | {ms(before)} | {ms(after)} | {ratio} | "
            f"{cpu(before)} | {cpu(after)} | {cpu_ratio} | "
            f"{field(before, 'collectives_in_loops')} | {field(after, 'collectives_in_loops')} | "
            f"{field(before, 'loop_collective_executions')} | "
            f"{field(after, 'loop_collective_executions')} | "
            f"{ref['pairs_whole_batch']} / {ref['pairs_per_device_max']} / "
            f"{ref['pairs_per_device_mean']:.1f} / {ref['block_grid']} | "
            f"{load(before)} / {load(after)} |")
    kinds = sorted({k for r in records for k in r["loop_collective_kinds"]})
    if kinds:
        lines += ["", "Collectives found inside the loops: " + ", ".join(kinds) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=None,
                        help="a blockwise_attention.py of another commit to measure beside "
                             "this checkout's (git show <sha>:zoo/nn/blockwise_attention.py)")
    parser.add_argument("--before-commit", default="unknown", help="the commit --before is of")
    parser.add_argument("--seq-lens", default="512,1024,2048")
    parser.add_argument("--meshes", default="8x1,4x2", help="data x tensor layouts")
    parser.add_argument("--layouts", default="padded,full", help="segments(): padded, full")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--out", default=None, help="results dir (default benchmarks/results/"
                                                     "<machine>)")
    args = parser.parse_args()
    if len(jax.devices()) != 8:
        raise SystemExit(f"needs 8 devices, got {len(jax.devices())}: set XLA_FLAGS="
                         "--xla_force_host_platform_device_count=8 before running")
    versions = {}
    if args.before:
        versions["before"] = (machine.load_module_file(args.before, "blockwise_before"),
                              args.before_commit)
    versions["after"] = (bw, machine.zoo_commit())
    records = []
    for mesh in args.meshes.split(","):
        data, tensor = (int(x) for x in mesh.split("x"))
        for seq, layout in itertools.product((int(s) for s in args.seq_lens.split(",")),
                                             args.layouts.split(",")):
            for record in measure(seq, layout, data, tensor, args.repeats, versions):
                record = {"machine": machine.machine_name(), "jax": jax.__version__, **record}
                print(json.dumps(record), flush=True)
                records.append(record)
    out = machine.results_dir(args.out)
    path = os.path.join(out, NAME + ".jsonl")
    machine.write_jsonl(path, records)
    with open(os.path.join(out, NAME + ".md"), "w") as f:
        f.write(_table(records))
    print(f"wrote {path} and {NAME}.md")


if __name__ == "__main__":
    main()
