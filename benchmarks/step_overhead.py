"""Where a train step's time goes beyond its forward pass: on this CPU, timed, and in the program
the TPU compiler emits, counted.

    python -m benchmarks.step_overhead              # both parts (the TPU one needs libtpu)
    python -m benchmarks.step_overhead --no-tpu --models bert --sizes small --seq-lens 128
    python -m benchmarks.step_overhead --tpu-only   # ~10 min of TPU compiles on a 2-core CPU

**CPU.** benchmarks.step's jobs (its quick preset: 512 tokens a batch, float32, the job config's
optimizer and dropout), each program compiled once and then called in turns, the order
reversed every round, so a change of load falls on all alike (medians):
  forward               the eval loss (no dropout)
  grad                  the train-mode loss gradient (dropout on), no update
  step: job             the train step as train.py builds it here (threefry dropout and the
                        layer scan unrolled on a CPU)
  step: no dropout      dropout_rate and attention_dropout_rate 0
  step: rbg, unsafe_rbg dropout drawn with XLA's RngBitGenerator (config.train.dropout_rng)
  step: no scan         model.scan_layers=False: each layer its own params, no nn.scan (and
                        no stacked params to slice)
The ratios are to `forward`; "update" is step minus grad (the optimizer, clipping, the guards).

**TPU compiler.** BERT-base seq 512 batch 16 and GPT-2 124M seq 1024 batch 8 in bfloat16 (the
shapes of the H100 run, benchmarks/results/gpu-nvidia-h100-80gb-hbm3) compiled for one v5e
chip (GPT-2's for one v6e: it needs more than a v5e's 16 GiB), per dropout generator and with no dropout: compile seconds, the compiler's bytes accessed
and FLOPs, temporaries, and the program's instructions by kind: u32 arithmetic (threefry's
rounds), rng-bit-generator, transposes, copies, reductions.

Writes step_overhead.{jsonl,md} under benchmarks/results/<machine>/ (--out).
"""

import argparse
import collections
import datetime
import json
import os
import re
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # a CPU's figures; the TPU's are compile-only

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402

from benchmarks import cli, machine  # noqa: E402
from benchmarks.step_jobs import SIZES, build, here, job_config, make_task  # noqa: E402
from zoo.train import loop
from zoo.train.compilation import aot, topologies  # noqa: E402

NO_DROPOUT = {"dropout_rate": 0.0, "attention_dropout_rate": 0.0}
# step variant -> (config.train.dropout_rng, model overrides)
STEP_VARIANTS = {
    "job": ("auto", {}),
    "no dropout": ("auto", NO_DROPOUT),
    "rbg": ("rbg", {}),
    "unsafe_rbg": ("unsafe_rbg", {}),
    "no scan": ("auto", {"scan_layers": False}),
}
# (model, size, seq_len, batch, slice) compiled for the TPU: the H100 run's shapes, each on one
# chip it fits (GPT-2's needs 17.8 GiB of temporaries: more than a v5e's 16 GiB).
TPU_JOBS = (("bert", "base", 512, 16, "v5e-1"), ("gpt", "124M", 1024, 8, "v6e-1"))
TPU_VARIANTS = {"threefry": ("threefry", {}), "rbg": ("rbg", {}),
                "unsafe_rbg": ("unsafe_rbg", {}), "no dropout": ("threefry", NO_DROPOUT)}
# An instruction: its result type (a tuple's in parentheses) and its op.
_U32_ARITHMETIC = ("add", "xor", "or", "shift-left", "shift-right-logical", "multiply")
_OP = re.compile(r"\s*(?:ROOT )?%\S+ = (.+?) ([\w\-]+)\(")


def _job(model: str, size: str, seq_len: int, batch: int, dtype: str, dropout_rng: str,
         overrides: dict, platforms: tuple[str, ...]):
    """The job's config and task, its layer scan settled for `platforms` as train.py's would be
    (zoo.train.layer_scan: unrolled on a CPU, a loop on an accelerator)."""
    config = job_config(model, size, seq_len, batch, dtype)
    config.train.dropout_rng = dropout_rng
    config.model.update(overrides)
    return config, make_task(model, config, SIZES[model][size].vocab_size, platforms=platforms)


def _cpu_calls(model: str, size: str, seq_len: int) -> dict:
    """name -> (setup, a no-argument call running one compiled program)."""
    batch = 512 // seq_len
    calls = {}
    for name, (rng, overrides) in STEP_VARIANTS.items():
        config, task = _job(model, size, seq_len, batch, "float32", rng, overrides, here())
        setup = build(config, task)
        data = jax.device_put(task.init_batch(), setup.batch_sharding)
        train_step = loop.make_train_step(setup, config)
        holder = [setup.state]  # donated each call

        def run_step(train_step=train_step, holder=holder, data=data):
            holder[0], metrics = train_step(holder[0], data)
            return metrics

        calls[f"step: {name}"] = (setup, run_step)
        if name != "job":
            continue
        eval_step = loop.make_eval_step(setup)
        calls["forward"] = (setup, lambda e=eval_step, h=holder, d=data: e(h[0].params, d))
        grad = jax.jit(jax.grad(lambda p, b, k, loss_fn=task.loss_fn:
                                loss_fn(p, b, k, True)["loss_sum"]))
        key = jax.random.key(1)
        calls["grad"] = (setup, lambda g=grad, h=holder, d=data: g(h[0].params, d, key))
    return calls


def time_cpu(model: str, size: str, seq_len: int, rounds: int) -> list[dict]:
    calls = _cpu_calls(model, size, seq_len)
    times = {name: [] for name in calls}
    order = list(calls)
    for r in range(rounds + 2):  # two warm-up rounds compile and settle each program
        for name in (order if r % 2 == 0 else order[::-1]):
            setup, call = calls[name]
            with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
                began = time.perf_counter()
                jax.block_until_ready(call())
                if r >= 2:
                    times[name].append(time.perf_counter() - began)
    key = dict(part="cpu", model=model, size=size, seq_len=seq_len, batch=512 // seq_len)
    return [dict(key, program=name, median_s=statistics.median(t), min_s=min(t), rounds=rounds)
            for name, t in times.items()]


def _instruction_kinds(hlo: str) -> dict[str, int]:
    """The compiled program's instructions (fused bodies included) by kind."""
    kinds = collections.Counter()
    for line in hlo.splitlines():
        m = _OP.match(line)
        if not m:
            continue
        result, op = m.groups()
        kinds[op] += 1
        if result.startswith("u32[") and op in _U32_ARITHMETIC:
            kinds["u32 arithmetic"] += 1
    return kinds


def compile_tpu(model: str, size: str, seq_len: int, batch: int, slice_name: str,
                variant: str) -> dict:
    rng, overrides = TPU_VARIANTS[variant]
    config, task = _job(model, size, seq_len, batch, "bfloat16", rng, overrides, ("tpu",))
    compiled = aot.compile_train_step(task, config, topologies.parse(slice_name))
    kinds = _instruction_kinds(compiled.hlo)
    return dict(part="tpu", model=model, size=size, seq_len=seq_len, batch=batch,
                variant=variant, slice=slice_name, compile_s=compiled.compile_seconds,
                bytes_accessed=compiled.bytes_accessed, executed_flops=compiled.executed_flops,
                temp_bytes=compiled.temp_bytes,
                **{k: kinds.get(k, 0) for k in ("u32 arithmetic", "rng-bit-generator",
                                                 "transpose", "copy", "reduce", "fusion")})


def _cpu_table(records: list[dict]) -> list[str]:
    others = [v for v in STEP_VARIANTS if v != "job"]
    lines = ["| model | size | seq | forward ms | grad / fwd | **step / fwd** | update / fwd | "
             + " | ".join(f"step / fwd, {v}" for v in others) + " |",
             "|" + "---|" * (7 + len(others))]
    shapes = sorted({(r["model"], r["size"], r["seq_len"]) for r in records},
                    key=lambda s: (s[0], list(SIZES[s[0]]).index(s[1]), s[2]))
    for shape in shapes:
        t = {r["program"]: r["median_s"] for r in records
             if (r["model"], r["size"], r["seq_len"]) == shape}
        fwd = t["forward"]
        cells = [f"{fwd * 1e3:.1f}", f"{t['grad'] / fwd:.2f}", f"**{t['step: job'] / fwd:.2f}**",
                 f"{(t['step: job'] - t['grad']) / fwd:.2f}"]
        cells += [f"{t['step: ' + v] / fwd:.2f}" for v in others]
        lines.append(f"| {shape[0]} | {shape[1]} | {shape[2]} | " + " | ".join(cells) + " |")
    return lines


def _tpu_table(records: list[dict]) -> list[str]:
    lines = ["| model | chip | seq x batch | dropout | compile s | GB accessed | temporaries GiB "
             "| u32 arithmetic | rng-bit-generator | transposes | copies | reductions |",
             "|" + "---|" * 12]
    for r in records:
        lines.append(
            f"| {r['model']} {r['size']} | {r['slice']} | {r['seq_len']} x {r['batch']} "
            f"| {r['variant']} "
            f"| {r['compile_s']:.0f} | {r['bytes_accessed'] / 1e9:.1f} "
            f"| {r['temp_bytes'] / 2**30:.2f} | {r['u32 arithmetic']} | {r['rng-bit-generator']} "
            f"| {r['transpose']} | {r['copy']} | {r['reduce']} |")
    return lines


def write_report(out: str, records: list[dict]) -> str:
    cpu = [r for r in records if r["part"] == "cpu"]
    tpu = [r for r in records if r["part"] == "tpu"]
    lines = ["# Where the train step's time goes beyond its forward", "",
             f"`python -m benchmarks.step_overhead` on {machine.machine_name()}, zoo "
             f"{machine.zoo_commit()}, {datetime.date.today()}. How to read it: the module "
             "docstring of benchmarks/step_overhead.py.", ""]
    if cpu:
        lines += ["## On this CPU (medians of programs called in turns)", ""] + _cpu_table(cpu)
        lines.append("")
    if tpu:
        lines += ["## In the TPU compiler's program (one chip, bfloat16)", ""]
        lines += _tpu_table(tpu) + [""]
    path = os.path.join(out, "step_overhead.md")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="bert,gpt")
    parser.add_argument("--sizes", default="tiny,small")
    parser.add_argument("--seq-lens", default="64,128")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-tpu", action="store_true", help="skip the TPU compiler's part")
    parser.add_argument("--tpu-only", action="store_true", help="only the TPU compiler's part")
    parser.add_argument("--out", default=None, help="results folder (default: the machine's)")
    parser.add_argument("--append", action="store_true",
                        help="keep the rows already in step_overhead.jsonl (a run in parts)")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> list[dict]:
    out = machine.results_dir(args.out)
    path = os.path.join(out, "step_overhead.jsonl")
    records = []
    if args.append and os.path.exists(path):
        records = [json.loads(line) for line in open(path) if line.strip()]
    with open(path, "a" if args.append else "w") as jsonl:
        def keep(rows):
            for row in rows:
                records.append(row)
                jsonl.write(json.dumps(row) + "\n")
                jsonl.flush()
                print(json.dumps(row), flush=True)

        if not args.tpu_only:
            for model in args.models.split(","):
                for size in args.sizes.split(","):
                    for seq_len in _ints(args.seq_lens):
                        keep(time_cpu(model, size, seq_len, args.rounds))
        if not args.no_tpu:
            for job in (j for j in TPU_JOBS if j[0] in args.models.split(",")):
                for variant in TPU_VARIANTS:
                    keep([compile_tpu(*job, variant)])
    print("wrote " + write_report(out, records))
    return records


def main(argv=None) -> int:
    return cli.exit_status(lambda: run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
