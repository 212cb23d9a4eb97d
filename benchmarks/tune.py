"""The tuning sweep of a lent GPU or TPU: the knobs of BERT-base's and GPT-2 124M's train steps,
timed one at a time, with MFU, beside Hugging Face's PyTorch step at the batch it keeps.
`python -m benchmarks.smoke --tune` runs it as stages sized for one 10-minute call.

    python -m benchmarks.tune --models bert --budget-s 230        # on the accelerator
    python -m benchmarks.tune --models bert,gpt --xla-flags maxtext --best-only --append
    python -m benchmarks.tune --allow-cpu --tiny                    # its own check, on a CPU

Per model, while --budget-s lasts (a trial that cannot finish in what is left is skipped):
  1. batch: the recipe's (BERT 16 x 512, GPT-2 8 x 1024), doubled until the step no longer fits
     (the allocator's RESOURCE_EXHAUSTED) or --max-doublings; the batch of the most tokens/s
     is kept;
  2. at that batch, one knob at a time away from the best so far (a coordinate search, since a
     10-minute call holds ~20 compiles, not the grid): attention backend, remat policy,
     dropout's generator (config.train.dropout_rng);
  3. HF PyTorch's step at the kept batch (benchmarks.peers), where torch sees the device.
XLA flags act per process, so each flag set is a process of its own: with --best-only a
process times each model's best trial so far (read back from tune.jsonl) under its flags.

Every trial appends one JSON line to tune.jsonl (status ok / oom / error / skipped, step
seconds, tokens/s, MFU of the spec peak, the allocator's peak so far); tune.md is rewritten
from all of them: per model the trials in order and the best, beside the peer.
"""

import argparse
import json
import os
import sys
import time

# XLA flags act when the backend starts: they are set before jax is imported.
XLA_FLAG_SETS = {
    "default": "",
    # MaxText's GPU flags (the ones that act on one device): the latency-hiding scheduler,
    # cuBLAS for matmuls instead of Triton's, a high-priority stream for async work.
    "maxtext": ("--xla_gpu_enable_latency_hiding_scheduler=true "
                "--xla_gpu_enable_triton_gemm=false "
                "--xla_gpu_enable_highest_priority_async_stream=true"),
    "no_command_buffer": "--xla_gpu_enable_command_buffer=",
}


def _set_xla_flags(argv) -> None:
    name = "default"
    if "--xla-flags" in argv[:-1]:
        name = argv[argv.index("--xla-flags") + 1]
    if XLA_FLAG_SETS.get(name):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " "
                                   + XLA_FLAG_SETS[name]).strip()


_set_xla_flags(sys.argv)

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402

from benchmarks import cli, machine, peers  # noqa: E402
from benchmarks.step_jobs import SIZES, build, job_config, make_task  # noqa: E402
from zoo.errors import ConfigError  # noqa: E402
from zoo.train import loop, metrics  # noqa: E402

# model -> (size, seq_len, first batch): the smoke suite's shapes; --tiny's for the CPU check.
JOBS = {"bert": ("base", 512, 16), "gpt": ("124M", 1024, 8)}
TINY_JOBS = {"bert": ("tiny", 32, 2), "gpt": ("tiny", 32, 2)}
# knob -> values tried, the first the baseline's (the job configs' own, dropout 'auto')
KNOBS = {
    "backend": ("einsum", "cudnn", "pallas_gpu", "dot_product"),
    "remat": ("none", "dots", "full"),
    "dropout_rng": ("auto", "threefry", "unsafe_rbg"),
}
TINY_KNOBS = {"backend": ("einsum", "blockwise"), "remat": ("none", "full"),
              "dropout_rng": ("auto", "rbg")}


def _out_of_memory(error: Exception) -> bool:
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text


def trial(model: str, size: str, seq_len: int, batch: int, settings: dict, *, dtype: str,
          steps: int) -> dict:
    """Compiles and times one train step; a step that does not fit is status 'oom', one that
    fails otherwise (a kernel this device lacks) 'error' with its first line."""
    row = dict(model=model, size=size, seq_len=seq_len, batch=batch, **settings)
    began = time.perf_counter()
    try:
        config = job_config(model, size, seq_len, batch, dtype)
        config.model.update(backend=settings["backend"], remat=settings["remat"])
        config.train.dropout_rng = settings["dropout_rng"]
        task = make_task(model, config, SIZES[model][size].vocab_size)
        setup = build(config, task)
        train_step = loop.make_train_step(setup, config)
        data = jax.device_put(task.init_batch(), setup.batch_sharding)
        holder = [setup.state]

        def run(b):
            holder[0], out = train_step(holder[0], b)
            return out

        with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
            timed = machine.time_call(run, data, warmup=1, repeats=steps)
    except Exception as error:  # noqa: BLE001 - a kernel's failure is a row; the sweep goes on
        status = "oom" if _out_of_memory(error) else "error"
        first = (str(error).strip().splitlines() or [""])[0][:300]
        return dict(row, status=status, error=f"{type(error).__name__}: {first}",
                    seconds=time.perf_counter() - began)
    tokens = task.tokens_per_batch()
    peak = metrics.peak_flops(jax.devices()[:1])
    flops = task.flops_per_token() * tokens / timed["median_s"]
    return dict(row, status="ok", step_s=timed["median_s"],
                tokens_per_s=tokens / timed["median_s"],
                mfu_spec=None if peak is None else flops / peak,
                # the allocator's peak since the process started (None on a CPU)
                process_peak_memory_bytes=machine.peak_memory_bytes(),
                seconds=time.perf_counter() - began)


def _best(rows: list[dict]) -> dict | None:
    ok = [r for r in rows if r.get("status") == "ok"]
    return max(ok, key=lambda r: r["tokens_per_s"]) if ok else None


class Sweep:
    """Runs trials while the budget lasts, each appended to tune.jsonl as it ends."""

    def __init__(self, path: str, budget_s: float, flags: str, dtype: str, steps: int):
        self.path, self.deadline = path, time.perf_counter() + budget_s
        self.flags, self.dtype, self.steps = flags, dtype, steps
        self.last_s = 0.0  # the slowest trial so far: what the next one is expected to need

    def run(self, model, size, seq_len, batch, settings) -> dict:
        left = self.deadline - time.perf_counter()
        if left < self.last_s:
            row = dict(model=model, size=size, seq_len=seq_len, batch=batch, **settings,
                       status="skipped", error=f"{left:.0f} s of --budget-s left")
        else:
            row = trial(model, size, seq_len, batch, settings, dtype=self.dtype,
                        steps=self.steps)
            self.last_s = max(self.last_s, row["seconds"])
        row.update(xla_flags=self.flags, device=jax.devices()[0].device_kind)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
        return row


def sweep_model(sweep: Sweep, model: str, job, knobs: dict, max_doublings: int) -> list[dict]:
    size, seq_len, batch = job
    settings = {k: v[0] for k, v in knobs.items()}
    rows = [sweep.run(model, size, seq_len, batch, settings)]
    for _ in range(max_doublings):
        if rows[-1]["status"] != "ok":
            break
        batch *= 2
        rows.append(sweep.run(model, size, seq_len, batch, settings))
    best = _best(rows)
    if best is None:
        return rows
    for knob, values in knobs.items():
        for value in values:
            if value == best[knob]:
                continue
            trial_settings = {k: best[k] for k in knobs} | {knob: value}
            rows.append(sweep.run(model, size, seq_len, best["batch"], trial_settings))
        best = _best(rows)
    return rows


def peer_row(model: str, best: dict, dtype: str, steps: int) -> dict:
    """HF PyTorch's step at the best trial's batch, or why it is absent."""
    platform = jax.devices()[0].platform
    reason = peers.unavailable_reason(platform)
    row = dict(model=model, size=best["size"], seq_len=best["seq_len"], batch=best["batch"],
               peer=True)
    if reason:
        return dict(row, status="skipped", error=reason)
    device = peers.setup_torch(platform)["torch_device"]
    config = job_config(model, best["size"], best["seq_len"], best["batch"], dtype)
    task = make_task(model, config, SIZES[model][best["size"]].vocab_size)
    theirs = peers.time_transformer(model, task.model_config, task.init_batch(), config.optim,
                                    device=device, dtype=dtype, warmup=1, repeats=steps)
    step_s = theirs["step"]["median_s"]
    return dict(row, status="ok", name=theirs["name"], step_s=step_s,
                tokens_per_s=task.tokens_per_batch() / step_s)


def _latest_best(rows: list[dict], model: str) -> dict | None:
    return _best([r for r in rows if r["model"] == model and not r.get("peer")])


def write_report(out: str) -> str:
    path = os.path.join(out, "tune.jsonl")
    rows = [json.loads(line) for line in open(path) if line.strip()] if os.path.exists(path) else []
    lines = ["# Tuning sweep", "",
             f"`python -m benchmarks.tune` / `python -m benchmarks.smoke --tune`, zoo "
             f"{machine.zoo_commit()}. One knob at a time from the best so far; tokens/s are "
             "medians of timed steps, MFU is of the device's dense bf16 spec peak.", ""]
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        lines += [f"## {model}", "", "| flags | batch | backend | remat | dropout rng | status "
                  "| step ms | tokens/s | MFU |", "|" + "---|" * 9]
        for r in (r for r in mine if not r.get("peer")):
            cells = [r.get("xla_flags", ""), r["batch"], r["backend"], r["remat"],
                     r["dropout_rng"]]
            if r["status"] == "ok":
                mfu = "" if r.get("mfu_spec") is None else f"{r['mfu_spec']:.1%}"
                cells += ["ok", f"{r['step_s'] * 1e3:.1f}", f"{r['tokens_per_s']:,.0f}", mfu]
            else:
                cells += [f"{r['status']}: {r.get('error', '')}", "", "", ""]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
        best = _latest_best(rows, model)
        peer = [r for r in mine if r.get("peer")]
        lines.append("")
        if best:
            lines.append(f"Best: batch {best['batch']}, {best['backend']}, remat "
                         f"{best['remat']}, dropout {best['dropout_rng']}, flags "
                         f"{best.get('xla_flags')}: {best['tokens_per_s']:,.0f} tokens/s.")
        if peer and peer[-1]["status"] == "ok" and best:
            lines.append(f"HF PyTorch at batch {peer[-1]['batch']}: "
                         f"{peer[-1]['tokens_per_s']:,.0f} tokens/s; zoo / HF "
                         f"{best['tokens_per_s'] / peer[-1]['tokens_per_s']:.2f}x.")
        elif peer:
            lines.append(f"HF PyTorch: {peer[-1]['status']}: {peer[-1].get('error', '')}")
        lines.append("")
    report = os.path.join(out, "tune.md")
    with open(report, "w") as f:
        f.write("\n".join(lines))
    return report


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert,gpt")
    parser.add_argument("--xla-flags", default="default", choices=sorted(XLA_FLAG_SETS))
    parser.add_argument("--budget-s", type=float, default=230.0)
    parser.add_argument("--best-only", action="store_true",
                        help="time each model's best trial in tune.jsonl under --xla-flags")
    parser.add_argument("--max-doublings", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per trial")
    parser.add_argument("--no-peer", action="store_true", help="no HF PyTorch step")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes and knobs (CPU check)")
    parser.add_argument("--allow-cpu", action="store_true", help="run on a CPU too")
    parser.add_argument("--append", action="store_true", help="keep tune.jsonl's rows")
    parser.add_argument("--out", default=None, help="results folder (default: the machine's)")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> str | None:
    models = args.models.split(",")
    jobs, knobs = (TINY_JOBS, TINY_KNOBS) if args.tiny else (JOBS, KNOBS)
    unknown = [m for m in models if m not in jobs]
    if unknown:
        raise ConfigError(f"--models: unknown {unknown}; choose from {list(jobs)}")
    if jax.devices()[0].platform == "cpu" and not args.allow_cpu:
        print("benchmarks.tune: skipped: jax sees no GPU or TPU here; --allow-cpu --tiny "
              "checks the sweep itself", flush=True)
        return None
    out = machine.results_dir(args.out)
    path = os.path.join(out, "tune.jsonl")
    if not args.append and os.path.exists(path):
        os.remove(path)
    dtype = "float32" if jax.devices()[0].platform == "cpu" else "bfloat16"
    sweep = Sweep(path, args.budget_s, args.xla_flags, dtype, args.steps)
    for model in models:
        if args.best_only:
            before = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
            best = _latest_best(before, model)
            if best is None:
                print(f"benchmarks.tune: no ok trial of {model} in {path} to time under "
                      f"--xla-flags {args.xla_flags}", flush=True)
                continue
            sweep.run(model, best["size"], best["seq_len"], best["batch"],
                      {k: best[k] for k in knobs})
            continue
        best = _best(sweep_model(sweep, model, jobs[model], knobs, args.max_doublings))
        if best and not args.no_peer:
            row = peer_row(model, best, dtype, args.steps)
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    report = write_report(out)
    print(f"wrote {report}", flush=True)
    return report


def main(argv=None) -> int:
    return cli.exit_status(lambda: run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
