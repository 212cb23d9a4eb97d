"""`python -m benchmarks.smoke`: the first-contact suite for a lent GPU or TPU, sized for one
10-minute call.

    python -m benchmarks.smoke                      # on the accelerator: every stage
    python -m benchmarks.smoke --stages scaling     # the stages a first call left out
    python -m benchmarks.smoke --allow-cpu --tiny   # the suite's own check, on a CPU
    python -m benchmarks.smoke --tune               # the tuning sweep (benchmarks.tune)
    python -m benchmarks.smoke --tune --allow-cpu --tiny

Stages, in order (each a `python -m` child process with its own time limit, so a kernel that
crashes or hangs costs its stage and not the suite; all of them write into the same results
directory, benchmarks/results/<machine>/ unless --out):

  attention  every attention backend the platform has against einsum, float32 and bfloat16,
             forward and gradients, five mask kinds (benchmarks.attention_check)
  bert       a BERT-base pretraining step at seq 512, bf16 (benchmarks.step --full): tokens/s,
             MFU against the spec peak and a measured matmul, and the dry run's memory
             estimate beside XLA's compiled step and the allocator's peak (one process per
             model, so the peak is that model's)
  gpt        the same for GPT-2 124M at seq 1024
  lstm       our LSTM (and torch.nn.LSTM where the parity extra has a GPU build) at n 512, d 1024
  scaling    benchmarks.scaling --full on a small grid: time and memory over n, the OOM search
             and the longest-n search

With --tune the stages are instead benchmarks.tune's sweep: tune-bert and tune-gpt (batch,
attention backend, remat, dropout's generator, then HF PyTorch's step at the kept batch) and
tune-xla (each model's best trial under MaxText's XLA GPU flags); tune.{jsonl,md}.

When the budget (--budget-s) cannot hold a stage's limit, the stage is skipped and named in the
summary, to be run by a second call with --stages. smoke.json (each stage's command, status,
exit code, seconds and last lines, plus the headline figures read back from the stages'
results files) and smoke.log (everything the stages printed) go to the results directory.
Exit status 0 when every stage that ran passed.

On a CPU it prints one line saying why it skips and exits 0 (the Pallas and cuDNN kernels, bf16
MFU and the allocator's peak are what it is for); --allow-cpu --tiny runs every stage at tiny
sizes (the Pallas kernels interpreted) so the suite itself is tested without an accelerator.
"""

import argparse
import dataclasses
import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from zoo import errors
from zoo.errors import ConfigError

TAIL_LINES = 40
# Children run from the checkout's root, so `python -m benchmarks.*` finds the package wherever
# the suite was started from.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the suite needs to know of the device, asked in a child process: the parent must not
# open the accelerator itself (a TPU has one owner at a time; on a GPU jax would reserve 75% of
# the memory the stages need).
PROBE = ("import json, jax; from benchmarks import machine; d = jax.devices()[0]; "
         "print(json.dumps({'platform': d.platform, 'device_kind': d.device_kind, "
         "'devices': jax.device_count(), 'jax': jax.__version__, "
         "'machine': machine.machine_name(), 'results_dir': machine.RESULTS_ROOT}))")


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    module: str  # run as `python -m module *args --out <dir>`
    args: tuple[str, ...]
    limit_s: float


# Sized so that the whole suite fits one 10-minute call on an H100 (the limits add up to 570 s).
# First contact (2026-11-27, H100, jax 0.11.2): attention took ~160 s (compiling ~100 cases;
# it had 90 and timed out), bert 60, gpt 45, lstm 24, scaling 95 of a 90 s sweep budget.
ACCELERATOR = (
    Stage("attention", "benchmarks.attention_check", (), 200),
    Stage("bert", "benchmarks.step", ("--full", "--models", "bert", "--sizes", "base",
                                      "--seq-lens", "512", "--steps", "5", "--lstm", "none"), 100),
    Stage("gpt", "benchmarks.step", ("--full", "--models", "gpt", "--sizes", "124M",
                                     "--seq-lens", "1024", "--steps", "5", "--lstm", "none",
                                     "--append"), 90),
    Stage("lstm", "benchmarks.step", ("--full", "--models", "none", "--lstm", "512x1024",
                                      "--append"), 40),
    Stage("scaling", "benchmarks.scaling", ("--full", "--no-resume", "--n", "1024", "4096",
                                            "16384", "--d", "1024", "--budget-s", "90",
                                            "--oom-max-n", "131072", "--length-max-s", "10",
                                            "--length-max-n", "262144"), 140),
)
# The same stages at sizes a 2-core CPU runs in about a minute (the suite's own test).
TINY = (
    Stage("attention", "benchmarks.attention_check",
          ("--allow-cpu", "--size", "tiny", "--masks", "packed_causal", "--backends", "einsum",
           "blockwise", "pallas_gpu", "cudnn"), 120),
    Stage("bert", "benchmarks.step", ("--quick", "--models", "bert", "--sizes", "tiny",
                                      "--seq-lens", "32", "--batch", "2", "--steps", "2",
                                      "--lstm", "none", "--no-peers"), 120),
    Stage("gpt", "benchmarks.step", ("--quick", "--models", "gpt", "--sizes", "tiny",
                                     "--seq-lens", "32", "--batch", "2", "--steps", "2",
                                     "--lstm", "none", "--no-peers", "--append"), 120),
    Stage("lstm", "benchmarks.step", ("--quick", "--models", "none", "--lstm", "8x16",
                                      "--lstm-repeats", "2", "--no-peers", "--append"), 120),
    Stage("scaling", "benchmarks.scaling", ("--quick", "--n", "32", "64", "--d", "32",
                                            "--models", "attention_einsum",
                                            "attention_blockwise", "lstm", "--repeats", "1",
                                            "--no-oom", "--no-length"), 120),
)
# --tune: benchmarks.tune's sweep in one 10-minute call. Each model's sweep (batch, attention
# backend, remat, dropout's generator, then HF PyTorch's step) is a process of its own; XLA
# flags act per process, so the last stage times each model's best trial under MaxText's flags.
TUNE = (
    Stage("tune-bert", "benchmarks.tune", ("--models", "bert", "--budget-s", "220"), 250),
    Stage("tune-gpt", "benchmarks.tune", ("--models", "gpt", "--budget-s", "200", "--append"),
          230),
    Stage("tune-xla", "benchmarks.tune", ("--models", "bert,gpt", "--xla-flags", "maxtext",
                                          "--best-only", "--budget-s", "70", "--append"), 90),
)
TINY_TUNE = (
    Stage("tune-bert", "benchmarks.tune", ("--models", "bert", "--tiny", "--allow-cpu",
                                           "--steps", "2", "--max-doublings", "1"), 200),
    Stage("tune-gpt", "benchmarks.tune", ("--models", "gpt", "--tiny", "--allow-cpu", "--steps",
                                          "2", "--max-doublings", "1", "--append"), 200),
    Stage("tune-xla", "benchmarks.tune", ("--models", "bert,gpt", "--tiny", "--allow-cpu",
                                          "--xla-flags", "maxtext", "--best-only", "--steps",
                                          "2", "--append"), 120),
)
STAGE_NAMES = tuple(s.name for s in ACCELERATOR + TUNE)


def run_stage(stage: Stage, out: str, limit_s: float, log) -> dict:
    """Runs one stage as a child process, streaming its lines to the console and `log`; kills
    its process group at `limit_s`. Returns {name, command, status, exit, seconds, tail}."""
    command = [sys.executable, "-m", stage.module, *stage.args, "--out", out]
    print(f"== {stage.name}: {' '.join(command[1:])} (limit {limit_s:.0f} s)", flush=True)
    log.write(f"== {stage.name}: {' '.join(command)}\n")
    tail: list[str] = []
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True, cwd=REPO_ROOT)

    def pump():
        for line in child.stdout:
            print("   " + line, end="", flush=True)
            log.write(line)
            tail.append(line.rstrip("\n"))
            del tail[:-TAIL_LINES]

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = child.wait(timeout=limit_s)
        status = "ok" if code == 0 else "failed"
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the stage and anything it started
        code = child.wait()
        status = "timeout"
    reader.join(timeout=10)
    seconds = time.perf_counter() - start
    print(f"== {stage.name}: {status} (exit {code}) in {seconds:.0f} s", flush=True)
    return {"name": stage.name, "command": " ".join(command[1:]), "status": status,
            "exit": code, "seconds": seconds, "limit_s": limit_s, "tail": tail}


def headlines(out: str) -> dict:
    """The figures a first contact is for, read back from the stages' results files."""
    found: dict = {}
    path = os.path.join(out, "attention_check.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            checked = json.load(f)
        found["attention"] = {k: checked[k] for k in ("counts", "failures")}
    path = os.path.join(out, "tune.jsonl")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        found["tune"] = [r for r in rows if r.get("status") == "ok"]
    path = os.path.join(out, "step_summary.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            summary = json.load(f)
        found["train_steps"] = [
            {k: row.get(k) for k in ("model", "size", "seq_len", "batch", "tokens_per_s",
                                      "mfu_spec", "mfu_vs_matmul", "dry_run_bytes",
                                      "program_bytes", "process_peak_memory_bytes")}
            for row in summary.get("configs", [])]
        found["lstm"] = [{k: row.get(k) for k in ("n", "d", "batch", "train_s")}
                         for row in summary.get("lstm", [])]
    return found


def probe() -> dict:
    """{platform, device_kind, devices, jax, machine, results_dir} of the device jax sees."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=300, check=False, cwd=REPO_ROOT)
    if done.returncode:
        raise RuntimeError(f"benchmarks.smoke: jax could not start on this machine:\n"
                           f"{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def select(stages: Sequence[Stage], names: Sequence[str] | None) -> list[Stage]:
    if not names:
        return list(stages)
    unknown = [n for n in names if n not in STAGE_NAMES]
    if unknown:
        raise ConfigError(f"--stages: unknown {unknown}; the stages are {list(STAGE_NAMES)}")
    return [s for s in stages if s.name in names]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.smoke", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", nargs="+", metavar="STAGE",
                        help=f"run only these, in the suite's order: {' '.join(STAGE_NAMES)}")
    parser.add_argument("--budget-s", type=float, default=570.0,
                        help="seconds for the whole suite; a stage whose limit does not fit "
                             "what is left is skipped (default 570: one 10-minute call)")
    parser.add_argument("--allow-cpu", action="store_true", help="run on a CPU too")
    parser.add_argument("--tiny", action="store_true",
                        help="tiny sizes: the suite's own check (with --allow-cpu on a CPU)")
    parser.add_argument("--tune", action="store_true",
                        help="the tuning sweep (benchmarks.tune) instead of the first-contact "
                             "stages")
    parser.add_argument("--out", help="results directory (default benchmarks/results/<machine>)")
    args = parser.parse_args(argv)
    suites = {(False, False): ACCELERATOR, (True, False): TINY, (False, True): TUNE,
              (True, True): TINY_TUNE}
    stages = select(suites[(args.tiny, args.tune)], args.stages)
    device = probe()
    if device["platform"] == "cpu" and not args.allow_cpu:
        print("benchmarks.smoke: skipped: jax sees no GPU or TPU here (backend cpu); this suite "
              "is the first contact with a lent accelerator (docs/benchmarks/index.md)",
              flush=True)
        return 0
    out = os.path.abspath(args.out or os.path.join(device["results_dir"], device["machine"]))
    os.makedirs(out, exist_ok=True)
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    start = time.perf_counter()
    results = []
    with open(os.path.join(out, "smoke.log"), "w", encoding="utf-8") as log:
        for stage in stages:
            left = args.budget_s - (time.perf_counter() - start)
            if stage.limit_s > left:
                print(f"== {stage.name}: skipped: its limit {stage.limit_s:.0f} s exceeds the "
                      f"{left:.0f} s left of --budget-s; run it with --stages {stage.name}",
                      flush=True)
                results.append({"name": stage.name, "status": "skipped",
                                "reason": f"{left:.0f} s of --budget-s left"})
                continue
            results.append(run_stage(stage, out, stage.limit_s, log))
    report = {"machine": device["machine"],
              "device": f"{device['platform']} {device['device_kind']}",
              "devices": device["devices"], "jax": device["jax"], "started": started,
              "tiny": args.tiny, "tune": args.tune,
              "command": "python -m benchmarks.smoke " + " ".join(argv or sys.argv[1:]),
              "seconds": time.perf_counter() - start, "stages": results,
              "headlines": headlines(out)}
    with open(os.path.join(out, "smoke.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    print(f"benchmarks.smoke on {report['device']}: "
          + ", ".join(f"{r['name']} {r['status']}" for r in results)
          + f"; {report['seconds']:.0f} s; wrote smoke.json and smoke.log to {out}", flush=True)
    return 0 if all(r["status"] in ("ok", "skipped") for r in results) else 1


if __name__ == "__main__":
    with errors.reported("benchmarks.smoke"):
        sys.exit(main())
