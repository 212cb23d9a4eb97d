"""Restart cost with and without the persistent compilation cache
(zoo.train.compilation.compile_cache).

    python -m benchmarks.restart            # ~5 min on the 2-core CPU box

Two measurements, each in fresh processes (a restart is a new process):
- tiny BERT pretraining (train.py, 1 CPU device, the default XLA flags): a run saves step 2,
  then is relaunched to 4 steps from that checkpoint; restart-to-first-step is the wall time
  from the relaunch to its first progress line (step 3), with the cache off (cold) and with the
  cache the first run filled (warm).
- BERT-base's train step (configs/bert_pretrain.py:size=base, seq 128, global batch 16, the
  job's AdamW, donation and shardings from zoo.train.program) on 8 fake CPU devices (data=8):
  lower + compile in a fresh process on an empty cache directory (cold), then again in another
  fresh process on the same directory (warm).

Writes restart.jsonl and restart.md to benchmarks/results/<machine>/.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_ARGS = [
    "--config=configs/bert_pretrain.py:size=tiny", "--config.data.synthetic_entities=100",
    "--config.data.vocab_size=256", "--config.data.seq_len=32",
    "--config.data.max_predictions_per_seq=5", "--config.data.batch_size=8",
    "--config.data.eval_batch_size=8", "--config.data.dupe_factor=1",
    "--config.train.log_every=1", "--config.train.eval_every=2",
    "--config.train.checkpoint_every=2", "--config.train.tensorboard=false",
]


def _env(devices: int) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    for key in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
        env.pop(key, None)
    return env


def _train(workdir: str, steps: int, cache: str) -> dict:
    """train.py to `steps`; seconds from launch to the first progress line and to the exit."""
    argv = [sys.executable, os.path.join(ROOT, "train.py"), *TINY_ARGS, f"--workdir={workdir}",
            f"--config.train.steps={steps}", f"--config.train.compilation_cache_dir={cache}"]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, env=_env(1), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    first = None
    for line in proc.stdout:
        if first is None and re.search(r"step\s+\d+/\d+", line):
            first = time.perf_counter() - start
    err = proc.stderr.read()
    if proc.wait():
        raise RuntimeError(f"train.py failed:\n{err[-3000:]}")
    return {"first_step_s": round(first, 2), "total_s": round(time.perf_counter() - start, 2)}


def tiny_restart(tmp: str, repeats: int) -> list[dict]:
    cache = os.path.join(tmp, "tiny_cache")
    saved = os.path.join(tmp, "saved")
    _train(saved, 2, cache)  # fills the cache and saves step 2
    records = []
    for repeat in range(repeats):
        for label, cache_dir in (("cold", "off"), ("warm", cache)):
            workdir = os.path.join(tmp, f"restart-{label}-{repeat}")
            shutil.copytree(saved, workdir, ignore=shutil.ignore_patterns("compile_cache"))
            records.append({"bench": "tiny BERT restart", "cache": label, "repeat": repeat,
                            **_train(workdir, 4, cache_dir)})
            print(records[-1], flush=True)
    return records


def compile_child(cache: str) -> None:
    """In a fresh process with 8 fake devices: BERT-base's train step, lowered and compiled."""
    import flax.linen as nn  # noqa: F401  (jax after the environment is set)
    import jax

    from benchmarks import step as bench_step
    from zoo.train.compilation import compile_cache
    from zoo.train import partitioning, program

    start = time.perf_counter()
    config = bench_step.job_config("bert", "base", 128, 16, "float32")
    config.train.compilation_cache_dir = cache
    compile_cache.enable(config.train, cache)
    task = bench_step.make_task("bert", config, bench_step.SIZES["bert"]["base"].vocab_size)
    mesh = partitioning.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    train_step, args = program.abstract_train_step(task, config, mesh)
    with program.lowering_context(config, mesh):
        t0 = time.perf_counter()
        lowered = train_step.lower(*args)
        t1 = time.perf_counter()
        lowered.compile()
        t2 = time.perf_counter()
    print(json.dumps({"devices": len(jax.devices()), "mesh": dict(mesh.shape),
                      "trace_lower_s": round(t1 - t0, 2), "compile_s": round(t2 - t1, 2),
                      "process_to_compiled_s": round(t2 - start, 2)}))


def base_compile(tmp: str) -> list[dict]:
    cache = os.path.join(tmp, "base_cache")
    records = []
    for label in ("cold", "warm"):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "benchmarks.restart", "--compile-child",
                               cache], cwd=ROOT, env=_env(8), capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(proc.stderr[-3000:])
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        entries = [n for n in os.listdir(cache) if n.startswith("jit_train_step")]
        records.append({"bench": "BERT-base train step compile", "cache": label, **result,
                        "launch_to_compiled_s": round(time.perf_counter() - start, 2),
                        "train_step_entries": len(entries)})
        print(records[-1], flush=True)
    return records


def write_markdown(path: str, records: list[dict], header: str) -> None:
    lines = [header, "", "| measurement | cache | restart / launch to first step or compiled (s) "
             "| compile (s) | process total (s) |", "|---|---|---|---|---|"]
    for r in records:
        if r["bench"].startswith("tiny"):
            lines.append(f"| {r['bench']} (repeat {r['repeat']}) | {r['cache']} | "
                         f"{r['first_step_s']} | | {r['total_s']} |")
        else:
            lines.append(f"| {r['bench']}, {r['devices']} devices {r['mesh']} | {r['cache']} | "
                         f"{r['launch_to_compiled_s']} | {r['compile_s']} (lowering "
                         f"{r['trace_lower_s']}) | |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="results directory (default benchmarks/results/<machine>)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--compile-child", metavar="CACHE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compile_child:
        return compile_child(args.compile_child)
    os.environ.update(_env(1))
    from benchmarks import machine

    out = machine.results_dir(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        records = tiny_restart(tmp, args.repeats) + base_compile(tmp)
    stamp = {"date": datetime.date.today().isoformat(), "machine": machine.machine_name(),
             "zoo": machine.zoo_commit()}
    records = [{**r, **stamp} for r in records]
    machine.write_jsonl(os.path.join(out, "restart.jsonl"), records)
    write_markdown(os.path.join(out, "restart.md"), records,
                   f"# Restart cost, cold vs warm compilation cache\n\n{stamp['machine']}, "
                   f"zoo {stamp['zoo']}, {stamp['date']}: `python -m benchmarks.restart`")
    print(open(os.path.join(out, "restart.md")).read())


if __name__ == "__main__":
    main()
