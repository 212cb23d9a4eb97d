"""How precisely is a bf16-compute BERT-base gradient summed across data-parallel devices?

    python -m benchmarks.grad_reduction                      # 2-core CPU: about 20 minutes
    python -m benchmarks.grad_reduction --batch 8 --examples 32 --shards 8,32   # ~4 minutes
    python -m benchmarks.grad_reduction --report-only        # the .md again from the .jsonl

With bf16 compute and float32 params, a parameter's gradient is a sum over the tokens of the
batch. Each data-parallel device computes its rows' part and the partitioner sums the parts
across devices. Before zoo.nn.precision those parts came out of the backward's bf16 dots and
were reduced in bf16 (the TPU compiler's all-reduces carry bf16[30522,768] for BERT's tied
decoder, and every encoder kernel); now each part is accumulated and reduced in float32. This
script measures both against a float64 reference on the job's own step: configs/bert_pretrain.py
at size=base (bf16 compute, float32 params), the task's loss (zoo.tasks.mlm_nsp on random
batches: benchmarks.step.make_task), dropout off so every variant computes the same function.

Part 1, the real program on 8 fake XLA:CPU devices (mesh data=8), --batch x --seq-len:
  bf16-reduce   the casts as they were before zoo.nn.precision (plain `astype` + einsum),
                swapped back in for this run only
  f32-reduce    the current code
  the same two on one device (no cross-device sum: the compute error alone), float32 compute
  on one device, and the reference: float64 compute and params on one device (jax_enable_x64).
  zoo keeps LayerNorm statistics, softmax and the loss in float32 whatever the compute dtype,
  so the reference is float64 except there (float32-rounding error ~1e-7, four orders below the
  bf16 effects measured; the float32 row shows the reference's own floor).
  XLA:CPU has no bf16 collectives: its all-reduce-promotion pass widens a bf16 all-reduce to
  float32, so on this machine bf16-reduce rounds each device's part to bf16 but sums them in
  float32. A TPU also sums in bf16; part 2 emulates that.

Part 2, the reduction emulated on one device for k = 1 .. 256 shards: --examples rows of the
same shape, each row's gradient computed alone with float32 accumulation (what one device of a
k=--examples mesh holds with one row each), summed into k shards of examples/k rows. A shard's
bf16 part is its float32 sum rounded once to bf16 (what a bf16 dot accumulating in float32
returns); the k parts are then summed
  ring   in order, rounding to bf16 after each add (a ring reduce-scatter: k - 1 bf16 adds)
  tree   pairwise (log2 k bf16 adds: the best order a bf16 reduction can have)
  f32    the float32 parts summed in float32, in order (this change; k-independent up to
         float32 rounding, so measured once, for the order with the most adds)
against the exact sum of the same row gradients (float32 with Neumaier compensation). k = 1 is
a single device: the whole sum rounded once to bf16 (and then cast to float32).

What others do (read in their code, 2026-11; not compiled): MaxText's DenseGeneral
(src/maxtext/layers/linears.py) casts the kernel with `jnp.asarray(kernel, self.dtype)` and calls
lax.dot_general without preferred_element_type, and its train step
(src/maxtext/trainers/pre_train/train.py) casts the float32 gradients to config.grad_dtype
(default float32) only after jax.value_and_grad; levanter's Trainer.loss_fn
(src/levanter/trainer.py) casts the whole model with the jmp policy's cast_to_compute inside the
differentiated function. Both therefore sum bf16 partials across devices as zoo did, and neither
has a setting for the reduction dtype.

Errors, per parameter and over all of them: rel_l2 = |g - ref|_2 / |ref|_2, max_scaled =
max |g - ref| / max |ref| (tests/numerics.py's measure), and the norm ratio |g|_2 / |ref|_2.

Writes grad_reduction.jsonl (every leaf of every variant) and grad_reduction.md to
benchmarks.machine.results_dir(--out).
"""

import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # Before jax is imported: the 8 fake devices of part 1.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import argparse
import contextlib
import json
import math
import sys
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import machine
from benchmarks import step as bench_step
from zoo.errors import ConfigError
from zoo.nn import embeddings, linear
from zoo.train import partitioning

VOCAB = 30522  # BERT's WordPiece vocabulary: the embedding gradient the issue names


@contextlib.contextmanager
def bf16_reduce_casts():
    """The parameter casts as they were before zoo.nn.precision, for one variant's trace: the
    kernel cast to the compute dtype before the einsum, the bias before broadcasting."""

    def plain_einsum(spec, x, kernel, dtype):
        return jnp.einsum(spec, x.astype(dtype), kernel.astype(dtype))

    def plain_broadcast(param, shape, dtype):
        return jnp.broadcast_to(param.astype(dtype), shape)

    saved = [(m, n, getattr(m, n)) for m in (linear, embeddings)
             for n in ("param_einsum", "broadcast_param")]
    try:
        for m in (linear, embeddings):
            m.param_einsum, m.broadcast_param = plain_einsum, plain_broadcast
        yield
    finally:
        for m, n, f in saved:
            setattr(m, n, f)


def make_job(batch: int, seq_len: int, dtype: str):
    config = bench_step.job_config("bert", "base", seq_len, batch, dtype)
    # No dropout: the float64 reference draws its masks from float64 uniforms, other bits.
    config.model.update(dropout_rate=0.0, attention_dropout_rate=0.0)
    if dtype == "float64":
        config.model.param_dtype = "float64"
    return config, bench_step.make_task("bert", config, VOCAB)


def grad_fn(task):
    def loss_sum(params, batch):
        return task.loss_fn(params, batch, jax.random.key(0), True)["loss_sum"]

    return jax.grad(loss_sum)


def sharded_grad(task, params, batch, devices: int):
    """The gradient of the task's loss sum on a mesh data=`devices`, params placed by their
    logical axes (replicated over data) and the batch split over data, as the loop runs it."""
    mesh = partitioning.make_mesh(devices, 1, 1, devices=jax.devices()[:devices])
    rules = partitioning.DEFAULT_RULES
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        abstract = jax.eval_shape(task.init_params, jax.random.key(0))
        shardings = nn.unbox(partitioning.logical_sharding(abstract, mesh, rules))
    batch_sharding = partitioning.batch_sharding(mesh, rules)
    params = jax.device_put(params, shardings)
    batch = jax.device_put(batch, batch_sharding)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        fn = jax.jit(grad_fn(task), in_shardings=(shardings, batch_sharding),
                     out_shardings=shardings)
        grads = fn(params, batch)
    return jax.tree.map(np.asarray, grads)


def leaf_errors(grads, ref) -> tuple[list[dict], dict]:
    """Per-leaf and global errors of `grads` against `ref` (both pytrees of host arrays).

    The worst leaf's max_scaled leaves out leaves whose reference is below 1e-6 of the whole
    gradient's norm: the attention key bias's exact gradient is 0 (softmax is invariant to
    adding the same q.b to every logit of a query), so its reference is rounding noise and any
    error scaled by it is meaningless.
    """
    total = math.sqrt(sum(float(np.sum(np.asarray(r, np.float64) ** 2))
                          for r in jax.tree.leaves(ref)))
    rows, diff2, ref2, grad2, worst = [], 0.0, 0.0, 0.0, 0.0
    for (path, g), r in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(ref),
                          strict=True):
        g, r = np.asarray(g, np.float64), np.asarray(r, np.float64)
        d2, r2 = float(np.sum((g - r) ** 2)), float(np.sum(r * r))
        scale = float(np.max(np.abs(r)))
        max_scaled = float(np.max(np.abs(g - r))) / scale if scale else 0.0
        rows.append(dict(leaf=jax.tree_util.keystr(path), shape=list(r.shape),
                         rel_l2=math.sqrt(d2 / r2) if r2 else 0.0, max_scaled=max_scaled,
                         norm_ratio=math.sqrt(float(np.sum(g * g)) / r2) if r2 else 1.0))
        diff2, ref2, grad2 = diff2 + d2, ref2 + r2, grad2 + float(np.sum(g * g))
        if math.sqrt(r2) >= 1e-6 * total:
            worst = max(worst, max_scaled)
    return rows, dict(rel_l2=math.sqrt(diff2 / ref2), max_scaled=worst,
                      norm_ratio=math.sqrt(grad2 / ref2))


def part1(args) -> tuple[list[dict], list[dict]]:
    """The step's gradient on `args.devices` fake devices and on one, against float64."""
    _, task = make_job(args.batch, args.seq_len, "bfloat16")
    params = jax.jit(task.init_params)(jax.random.key(args.seed))
    params = jax.tree.map(np.asarray, nn.unbox(params))
    batch = task.init_batch()
    results: dict[str, Any] = {}
    timings = {}
    for name, devices, old in (("bf16-reduce", args.devices, True),
                               ("f32-reduce", args.devices, False),
                               ("bf16-reduce", 1, True), ("f32-reduce", 1, False)):
        start = time.perf_counter()
        with bf16_reduce_casts() if old else contextlib.nullcontext():
            results[(name, devices, "bfloat16")] = sharded_grad(task, params, batch, devices)
        seconds = timings[(name, devices, "bfloat16")] = time.perf_counter() - start
        print(f"part 1: {name} on {devices} device(s): {seconds:.0f} s", flush=True)
    _, task32 = make_job(args.batch, args.seq_len, "float32")
    start = time.perf_counter()
    results[("float32", 1, "float32")] = sharded_grad(task32, params, batch, 1)
    timings[("float32", 1, "float32")] = time.perf_counter() - start
    jax.config.update("jax_enable_x64", True)
    try:
        _, task64 = make_job(args.batch, args.seq_len, "float64")
        start = time.perf_counter()
        ref = jax.tree.map(np.asarray, jax.jit(grad_fn(task64))(
            jax.tree.map(lambda p: p.astype(np.float64), params), batch))
        print(f"part 1: float64 reference: {time.perf_counter() - start:.0f} s", flush=True)
    finally:
        jax.config.update("jax_enable_x64", False)
    summary, records = [], []
    for (name, devices, dtype), grads in results.items():
        rows, overall = leaf_errors(grads, ref)
        key = dict(part=1, variant=name, devices=devices, compute_dtype=dtype,
                   batch=args.batch, seq_len=args.seq_len)
        embedding = next(r for r in rows if "word_embeddings" in r["leaf"])
        summary.append(dict(key, **overall, word_embedding_rel_l2=embedding["rel_l2"],
                            word_embedding_max_scaled=embedding["max_scaled"],
                            seconds=timings[(name, devices, dtype)]))
        records += [dict(key, **row) for row in rows]
    return summary, records


def _tree_fns():
    add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b), donate_argnums=0)
    # bf16 + bf16 rounded to bf16: one add of a bf16 reduction
    add_bf16 = jax.jit(lambda a, b: jax.tree.map(
        lambda x, y: (x.astype(jnp.float32) + y.astype(jnp.float32)).astype(jnp.bfloat16), a, b),
        donate_argnums=0)
    to_bf16 = jax.jit(lambda a: jax.tree.map(lambda x: x.astype(jnp.bfloat16), a))

    def neumaier(state, g):
        # Compensated sum: (hi, lo) carries the rounding error of every add, so hi + lo is the
        # sum of the float32 rows to well below float32 rounding.
        def one(hi, lo, x):
            t = hi + x
            err = jnp.where(jnp.abs(hi) >= jnp.abs(x), (hi - t) + x, (x - t) + hi)
            return t, lo + err

        hi, lo = state
        pairs = jax.tree.map(one, hi, lo, g)
        outer = jax.tree.structure(hi)
        return jax.tree.transpose(outer, jax.tree.structure((0, 0)), pairs)

    return add, add_bf16, to_bf16, jax.jit(neumaier, donate_argnums=0)


def part2(args) -> tuple[list[dict], list[dict]]:
    """Reductions over k shards of --examples single-row gradients, on one device."""
    n = args.examples
    for k in args.shards:
        if n % k or k & (k - 1):
            raise ConfigError(f"--shards: {k} must be a power of 2 dividing --examples={n}")
    _, task = make_job(n, args.seq_len, "bfloat16")
    params = jax.jit(task.init_params)(jax.random.key(args.seed))
    params = jax.device_put(nn.unbox(params), jax.devices()[0])
    batch = task.init_batch()
    row_grad = jax.jit(grad_fn(task))
    add, add_bf16, to_bf16, neumaier = _tree_fns()

    def copy(tree):
        return jax.tree.map(jnp.copy, tree)

    exact = None  # (hi, lo)
    f32 = None
    group: dict[int, Any] = {}
    ring: dict[int, Any] = {}
    stack: dict[int, list] = {k: [] for k in args.shards}  # [(level, bf16 tree)]
    start = time.perf_counter()
    for i in range(n):
        g = row_grad(params, jax.tree.map(lambda x, i=i: x[i:i + 1], batch))
        if exact is None:
            exact = (copy(g), jax.tree.map(jnp.zeros_like, g))
            f32 = copy(g)
        else:
            exact = neumaier(exact, g)
            f32 = add(f32, g)
        for k in args.shards:
            rows = n // k
            # Every accumulator owns its buffers (the adds donate their first argument).
            group[k] = copy(g) if i % rows == 0 else add(group[k], g)
            if (i + 1) % rows:
                continue
            part = to_bf16(group[k])
            group[k] = None
            ring[k] = copy(part) if k not in ring else add_bf16(ring[k], part)
            # Pairwise: a binary counter of partial sums, each level twice the one below.
            level, value = 0, part
            while stack[k] and stack[k][-1][0] == level:
                value = add_bf16(stack[k].pop()[1], value)
                level += 1
            stack[k].append((level, value))
        if (i + 1) % 16 == 0:
            print(f"part 2: {i + 1}/{n} rows, {time.perf_counter() - start:.0f} s", flush=True)
    ref = jax.tree.map(lambda hi, lo: np.asarray(hi, np.float64) + np.asarray(lo, np.float64),
                       *exact)
    variants = {("single-device bf16", 1): to_bf16(f32), ("f32", n): f32}
    for k in args.shards:
        variants[("bf16 ring", k)] = ring[k]
        (_, tree), = stack[k]
        variants[("bf16 tree", k)] = tree
    summary, records = [], []
    for (name, k), grads in variants.items():
        rows, overall = leaf_errors(jax.tree.map(np.asarray, grads), ref)
        key = dict(part=2, reduction=name, shards=k, rows_per_shard=n // k, examples=n,
                   seq_len=args.seq_len)
        embedding = next(r for r in rows if "word_embeddings" in r["leaf"])
        summary.append(dict(key, **overall, word_embedding_rel_l2=embedding["rel_l2"],
                            word_embedding_max_scaled=embedding["max_scaled"]))
        records += [dict(key, **row) for row in rows]
    return summary, records


def _e(x: float) -> str:
    return f"{x:.2e}"


def write_markdown(path: str, header: dict, part1_rows, part2_rows, part1_leaves) -> None:
    lines = [
        "# Gradient reduction precision: BERT-base, bf16 compute, float32 params",
        "",
        f"Machine: {header['machine']} ({header['device_kind']}), jax {header['jax']}; "
        f"command: `{header['command']}`; {header['seconds']:.0f} s.",
        "Errors against a float64 reference of the same gradient: rel_l2 = |g - ref|_2 / "
        "|ref|_2 over every parameter; max_scaled = the worst parameter's max |g - ref| / "
        "max |ref| (leaving out the attention key bias, whose exact gradient is 0); norm "
        "ratio = |g|_2 / |ref|_2. See benchmarks/grad_reduction.py.",
        "",
        f"## Part 1: the step's gradient, batch {header['batch']} x {header['seq_len']}",
        "",
        "bf16-reduce: the parameter casts before zoo.nn.precision (each device's part of a "
        "gradient comes out of a bf16 dot); f32-reduce: the current code. XLA:CPU widens bf16 "
        "all-reduces to float32 (its all-reduce-promotion pass), so bf16-reduce here rounds "
        "each device's part to bf16 and sums the parts in float32; a TPU also sums in bf16 "
        "(part 2). The 1-device rows are the compute error alone.",
        "",
        "| variant | devices | compute | rel_l2 | max_scaled | norm ratio | word emb. rel_l2 |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in part1_rows:
        lines.append(f"| {r['variant']} | {r['devices']} | {r['compute_dtype']} | "
                     f"{_e(r['rel_l2'])} | {_e(r['max_scaled'])} | {r['norm_ratio']:.6f} | "
                     f"{_e(r['word_embedding_rel_l2'])} |")
    lines += ["", f"Worst parameters of bf16-reduce on {header['devices']} devices (rel_l2), "
              "beside f32-reduce:", "", "| parameter | bf16-reduce rel_l2 | f32-reduce rel_l2 |",
              "|---|---:|---:|"]
    before, after = part1_leaves
    for row in sorted(before, key=lambda r: -r["rel_l2"])[:9]:
        other = next(r for r in after if r["leaf"] == row["leaf"])
        lines.append(f"| {row['leaf']} | {_e(row['rel_l2'])} | {_e(other['rel_l2'])} |")
    lines += [
        "",
        f"## Part 2: the cross-device sum emulated, {header['examples']} rows x "
        f"{header['seq_len']}, one row's gradient per step",
        "",
        "Each row's gradient accumulated in float32; k shards of examples/k rows, each "
        "shard's part rounded once to bf16, then summed: ring = in order with a bf16 rounding "
        "after each of the k - 1 adds (a ring reduce-scatter), tree = pairwise (log2 k "
        "adds); f32 = the float32 parts summed in float32 (this change). Errors against the "
        "exact sum of the same row gradients, so only the reduction's error shows; part 1's "
        "1-device rows are the compute error it adds to.",
        "",
        "| reduction | shards | rows/shard | rel_l2 | max_scaled | norm ratio | word emb. rel_l2 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in part2_rows:
        lines.append(f"| {r['reduction']} | {r['shards']} | {r['rows_per_shard']} | "
                     f"{_e(r['rel_l2'])} | {_e(r['max_scaled'])} | {r['norm_ratio']:.6f} | "
                     f"{_e(r['word_embedding_rel_l2'])} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def report(out: str) -> None:
    """grad_reduction.md from the grad_reduction.jsonl in `out`."""
    with open(os.path.join(out, "grad_reduction.jsonl")) as f:
        records = [json.loads(line) for line in f]
    (header,) = [r for r in records if r["kind"] == "header"]
    summary = [r for r in records if r["kind"] == "summary"]
    leaves = tuple([r for r in records if r["kind"] == "leaf" and r["part"] == 1
                    and r["variant"] == v and r["devices"] == header["devices"]]
                   for v in ("bf16-reduce", "f32-reduce"))
    write_markdown(os.path.join(out, "grad_reduction.md"), header,
                   [r for r in summary if r["part"] == 1], [r for r in summary if r["part"] == 2],
                   leaves)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.grad_reduction",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16, help="part 1 sequences")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--devices", type=int, default=8, help="part 1 data-parallel devices")
    parser.add_argument("--examples", type=int, default=256, help="part 2 rows")
    parser.add_argument("--shards", default="8,32,256",
                        help="part 2 shard counts (powers of 2 dividing --examples)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="results directory (default benchmarks/results/<machine>)")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite grad_reduction.md from the grad_reduction.jsonl in --out")
    args = parser.parse_args(argv)
    args.shards = tuple(int(s) for s in args.shards.split(","))
    if args.devices > jax.device_count() or args.batch % args.devices:
        raise ConfigError(f"--devices={args.devices} must be <= {jax.device_count()} and "
                          f"divide --batch={args.batch}")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    out = machine.results_dir(args.out)
    if args.report_only:
        report(out)
        return {}
    p1, p1_records = part1(args)
    p2, p2_records = part2(args)
    device = jax.devices()[0]
    header = dict(machine=machine.machine_name(), device_kind=device.device_kind,
                  jax=jax.__version__, batch=args.batch, seq_len=args.seq_len,
                  devices=args.devices, examples=args.examples,
                  command=" ".join(["python -m benchmarks.grad_reduction",
                                    *(sys.argv[1:] if argv is None else argv)]),
                  seconds=time.perf_counter() - started)
    machine.write_jsonl(os.path.join(out, "grad_reduction.jsonl"),
                        [dict(kind="header", **header)]
                        + [dict(kind="summary", **r) for r in p1 + p2]
                        + [dict(kind="leaf", **r) for r in p1_records + p2_records])
    report(out)
    print(json.dumps(dict(header=header, part1=p1, part2=p2), indent=1))
    return dict(header=header, part1=p1, part2=p2)


if __name__ == "__main__":
    main()
