"""Training-step throughput and MFU of BERT pretraining and GPT language modelling, beside the
same models in PyTorch (Hugging Face transformers) and our LSTM beside torch.nn.LSTM.

    python -m benchmarks.step --quick    # 2-core CPU, a few minutes: tiny/small at seq 64, 128
    python -m benchmarks.step --full     # GPU: BERT base/large, GPT-2 124M/355M at 128/512/1024
    python -m benchmarks.step --quick --models gpt --sizes tiny --seq-lens 64 --profile /tmp/tr
    python -m benchmarks.step --quick --models none --lstm 128x256   # the LSTM beside torch only
    python -m benchmarks.step --quick --models gpt --sizes mini --seq-lens 128 --batch 8 \
        --lstm none --hf-flax-python /tmp/hfflax/bin/python   # GPT beside HF Flax, in turns

What is timed is the step train.py runs: the task's own loss (zoo.tasks.mlm_nsp / zoo.tasks.lm,
subclassed in benchmarks.step_jobs only to replace the corpus by random token batches of the
right shapes), the job config's optimizer (configs/bert_pretrain.py, configs/gpt.py: AdamW,
global norm clipping, schedule), TrainState, and zoo.train.loop.make_train_step's jit with
shardings and donation on a one-device mesh. The batch is placed on the device once (the loop
also copies each batch from the host; that transfer is not timed).

FLOPs per token are the tasks' own (the numbers train.py's MFU uses):
  BERT  6N + 12 L T H + 6 (H^2 + H V) P / T,    N = L (4 H^2 + 2 H F)
        (zoo.models.bert.flops_per_token; P masked positions of T)
  GPT   6N + 6 L T d,                            N = L (4 d^2 + 2 d F) + V d
        (zoo.tasks.lm.LanguageModelTask.flops_per_token: the 12 L T d attention term halved,
        a causal query sees half the keys on average)
MFU = flops_per_token x tokens per step / step time, divided by the device's spec peak
(zoo.train.metrics.peak_flops: H100/H200 989 TFLOP/s dense bf16; null where unknown, e.g.
CPUs) and, always, by the FLOP/s of one square matmul measured here in the compute dtype
(benchmarks.machine.measured_matmul_flops), so a CPU run also reports a utilisation.

Peer ratios are our time / their time on the same inputs: < 1 means ours is faster. See
benchmarks.peers for how the PyTorch side is made like for like. With --hf-flax-python, GPT is
also timed beside Hugging Face's JAX GPT-2 (transformers v4 FlaxGPT2LMHeadModel, in a venv of
its own: benchmarks/hf_flax_peer.py), one step each in turns (`time_beside_hf_flax`); without
it that column says why it is absent.

Outputs in benchmarks.machine.results_dir(--out): step.jsonl (every measurement),
step_summary.json (one row per model/size/seq), step.md (tables), step.png; --append merges a
run into the results already there (a preset split over commands with a time limit).
"""

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import machine, peers, step_report
# The jobs and tasks this times: SIZES, job_config and make_task are also used from here by the
# other benchmarks and tests that lower the same step.
from benchmarks.step_jobs import SIZES, build, here, job_config, make_task
from zoo import errors
from zoo.errors import ConfigError
from zoo.nn.recurrent import BACKENDS as RNN_BACKENDS
from zoo.nn.recurrent import RNN
from zoo.train import loop, metrics
from zoo.train.compilation import dry_run

FLOPS_FORMULAS = {
    "bert": "6N + 12 L T H + 6 (H^2 + H V) P / T per token, N = L (4 H^2 + 2 H F) "
            "(zoo.models.bert.flops_per_token; bidirectional attention, MLM head at P of T)",
    "gpt": "6N + 6 L T d per token, N = L (4 d^2 + 2 d F) + V d "
           "(zoo.tasks.lm.LanguageModelTask.flops_per_token; 12 L T d attention halved: causal)",
}


# Each preset: its models, sizes (each model runs those it defines), sequence lengths, tokens
# per batch (batch = tokens // seq_len unless --batch), timed steps, compute dtype, the LSTM
# (steps n, width d) shapes, batch and timed calls per side, and the square matmul the MFU is
# also measured against.
PRESETS = {
    "quick": dict(models=("bert", "gpt"), sizes=("tiny", "small"), seq_lens=(64, 128),
                  tokens=512, steps=3, dtype="float32", lstm=((64, 128), (128, 256)),
                  lstm_batch=16, lstm_repeats=10, matmul=1024),
    "full": dict(models=("bert", "gpt"), sizes=("base", "large", "124M", "355M"),
                 seq_lens=(128, 512, 1024), tokens=8192, steps=10, dtype="bfloat16",
                 lstm=((128, 512), (512, 1024), (1024, 1024)), lstm_batch=64, lstm_repeats=10,
                 matmul=8192),
}


def count_params(tree) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(tree)))


def _ratio(ours: float, theirs: float) -> float:
    return ours / theirs


def bench_transformer(model: str, size: str, seq_len: int, batch: int, *, dtype: str,
                      steps: int, warmup: int, peak_spec: float | None, matmul_flops: float,
                      peer_device: str | None, profile_dir: str | None,
                      hf_flax_python: str | None = None) -> tuple[list[dict], dict]:
    """Times one (model, size, seq_len): our train step and forward, then the HF peer's; for
    GPT with `hf_flax_python` also our step and FlaxGPT2LMHeadModel's in turns
    (`time_beside_hf_flax`). Returns (jsonl records, the summary row)."""
    config = job_config(model, size, seq_len, batch, dtype)
    spec = SIZES[model][size]
    task = make_task(model, config, spec.vocab_size, here())  # settled as train.py here
    setup = build(config, task)
    # The dry run's estimate for this job on one device (what train.py --dry_run prints), set
    # beside XLA's count for the compiled step and the allocator's peak.
    estimate = dry_run.report(config, "", lambda *_: task, devices=jax.devices()[:1])
    train_step, eval_step = loop.make_train_step(setup, config), loop.make_eval_step(setup)
    batch_arrays = jax.device_put(task.init_batch(), setup.batch_sharding)
    key = dict(model=model, size=size, seq_len=seq_len, batch=batch, dtype=dtype)
    params = count_params(setup.state.params)
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
        compiled = machine.compile_stats(train_step, setup.state, batch_arrays)
        holder = [setup.state]  # donated each step: the next step takes the new state

        def run_step(b):
            holder[0], step_metrics = train_step(holder[0], b)
            return holder[0], step_metrics

        step_t = machine.time_call(run_step, batch_arrays, warmup=warmup, repeats=steps)
        forward_t = machine.time_call(eval_step, holder[0].params, batch_arrays,
                                      warmup=1, repeats=steps)
        in_turns = None
        if model == "gpt" and hf_flax_python:
            settings = peers.hf_flax_settings(task.model_config, config.optim, batch, seq_len,
                                              dtype=dtype, warmup=warmup, seed=config.train.seed)
            in_turns = time_beside_hf_flax(functools.partial(run_step, batch_arrays),
                                           hf_flax_python, settings, repeats=steps)
        if profile_dir:
            with jax.profiler.trace(os.path.join(profile_dir, f"{model}-{size}-{seq_len}")):
                for _ in range(3):
                    jax.block_until_ready(run_step(batch_arrays))

    tokens = task.tokens_per_batch()
    flops_per_token = task.flops_per_token()
    model_flops = flops_per_token * tokens / step_t["median_s"]
    peak, dry_bytes = machine.peak_memory_bytes(), estimate["total_bytes_per_device"]
    row = dict(
        key, params=params, tokens_per_step=tokens,
        step_s=step_t["median_s"], step_min_s=step_t["min_s"],
        tokens_per_s=tokens / step_t["median_s"], forward_s=forward_t["median_s"],
        compile_s=compiled["compile_s"], flops_per_token=flops_per_token,
        flops_per_step=flops_per_token * tokens, flops_formula=FLOPS_FORMULAS[model],
        xla_flops_per_step=compiled["xla_flops"], program_bytes=compiled["program_bytes"],
        # the allocator's peak since the process started (GPU/TPU; None on a CPU)
        process_peak_memory_bytes=peak, dry_run_bytes=dry_bytes,
        dry_run_vs_program=dry_bytes / compiled["program_bytes"]
        if compiled["program_bytes"] else None,
        dry_run_vs_peak=dry_bytes / peak if peak else None, model_flops_per_s=model_flops,
        mfu_spec=None if not peak_spec else model_flops / peak_spec,
        mfu_vs_matmul=model_flops / matmul_flops,
    )
    records = [dict(key, kind="train_step", params=params, **step_t, **compiled),
               dict(key, kind="forward", **forward_t)]
    if in_turns is not None:
        row["hf_flax"] = in_turns["row"]
        records += [dict(key, kind=kind, peer=in_turns["row"]["name"], **t)
                    for kind, t in in_turns["records"].items()]
    else:
        row["hf_flax"] = {"skipped": hf_flax_absent(model, hf_flax_python)}
    holder.clear()  # free our state before the peer allocates its own
    del setup, batch_arrays

    if peer_device is None:
        return records, row
    theirs = peers.time_transformer(model, task.model_config, task.init_batch(), config.optim,
                                    device=peer_device, dtype=dtype, warmup=warmup,
                                    repeats=steps)
    records += [dict(key, kind="peer_forward", peer=theirs["name"], **theirs["forward"]),
                dict(key, kind="peer_train_step", peer=theirs["name"], **theirs["step"])]
    row["peer"] = dict(
        name=theirs["name"], params=theirs["params"], attention=theirs["attention"],
        forward_s=theirs["forward"]["median_s"], step_s=theirs["step"]["median_s"],
        tokens_per_s=tokens / theirs["step"]["median_s"],
        forward_ratio=_ratio(forward_t["median_s"], theirs["forward"]["median_s"]),
        step_ratio=_ratio(step_t["median_s"], theirs["step"]["median_s"]),
        # fastest against fastest: steadier than the medians on a busy machine
        step_ratio_min=_ratio(step_t["min_s"], theirs["step"]["min_s"]),
    )
    return records, row


def time_alternating(calls: dict[str, Callable[[], Any]], *, warmup: int, repeats: int,
                     settle: bool = True) -> dict[str, dict[str, Any]]:
    """Median and minimum wall seconds of each call, timed in turns (a, b, a, b, ...): on a
    shared machine a load change then hits every side alike, which timing one side's repeats
    and then the other's does not. Each call must block until its result is ready. With
    `settle` (for work on the CPU) each timed call starts with the process idle
    (`machine.wait_until_idle`): the threads a side leaves spinning after its call (torch's
    OpenMP workers) would otherwise take cores from the next; an accelerator's kernels do not
    share them."""
    for _ in range(warmup):
        for call in calls.values():
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            if settle:
                machine.wait_until_idle()
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "repeats": repeats,
                   "samples_s": t} for name, t in times.items()}


def hf_flax_absent(model: str, hf_flax_python: str | None) -> str:
    """Why a row has no HF Flax column."""
    if model != "gpt":
        return "the HF Flax peer is GPT's only (transformers v4 FlaxGPT2LMHeadModel)"
    return ("--hf-flax-python not given: the python of a venv with transformers 4.57 and flax, "
            f"made by: {peers.HF_FLAX_VENV}")


def _cpu_and_wall(fn: Callable[[], Any]) -> dict[str, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    jax.block_until_ready(fn())
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


def _stats(samples: list[dict[str, float]]) -> dict[str, float]:
    wall, cpu = [t["wall_s"] for t in samples], [t["cpu_s"] for t in samples]
    return {"median_s": statistics.median(wall), "min_s": min(wall),
            "cpu_median_s": statistics.median(cpu), "repeats": len(samples)}


def time_beside_hf_flax(run_step: Callable[[], Any], python: str, settings: dict[str, Any], *,
                        repeats: int) -> dict[str, Any]:
    """Our train step (`run_step`, warm) and FlaxGPT2LMHeadModel's (benchmarks/hf_flax_peer.py
    under `python`, built from `settings`) one step each in turns, `repeats` times: both are JAX
    on the same XLA, so a load change on a shared machine hits both; on a CPU each step starts
    with both processes idle (`machine.wait_until_idle`). Besides wall seconds, each side's CPU
    seconds (all its threads), which other jobs on the machine move less.

    Returns {'row': the summary's hf_flax entry, 'records': {jsonl kind: times}}."""
    ours, theirs = [], []
    with peers.HFFlaxPeer(python, settings) as peer:
        platform = jax.devices()[0].platform
        if peer.info["platform"] != platform:
            raise ConfigError(
                f"--hf-flax-python {python}: its jax runs on {peer.info['platform']}, ours on "
                f"{platform}; give it a venv whose jax sees the same device")
        on_cpu = platform == "cpu"  # the processes' threads share the cores with the steps
        for _ in range(repeats):
            if on_cpu:
                machine.wait_until_idle((peer.pid,))
            ours.append(_cpu_and_wall(run_step))
            if on_cpu:
                machine.wait_until_idle((peer.pid,))
            theirs.append(peer.step())
    ours_t, theirs_t = _stats(ours), _stats(theirs)
    row = dict(
        name=peer.info["name"], transformers=peer.info["transformers"],
        jax=peer.info["jax"], params=peer.info["params"], step_s=theirs_t["median_s"],
        step_min_s=theirs_t["min_s"], cpu_s=theirs_t["cpu_median_s"],
        ours_step_s=ours_t["median_s"], ours_cpu_s=ours_t["cpu_median_s"],
        step_ratio=_ratio(ours_t["median_s"], theirs_t["median_s"]),
        step_ratio_min=_ratio(ours_t["min_s"], theirs_t["min_s"]),
        cpu_ratio=_ratio(ours_t["cpu_median_s"], theirs_t["cpu_median_s"]),
        step_ratio_interval=machine.ratio_interval([t["wall_s"] for t in ours],
                                                   [t["wall_s"] for t in theirs]),
        steps_start_idle=on_cpu,
    )
    return {"row": row, "records": {"train_step_in_turns": ours_t,
                                    "hf_flax_train_step": theirs_t}}


def lstm_backends(platform: str) -> tuple[str, ...]:
    """Our LSTM backends this platform runs: the portable scan everywhere, and the fused kernel
    of the platform (zoo.nn.cpu_lstm on a CPU, cuDNN on a GPU)."""
    return {"cpu": ("scan", "cpu_fused"), "gpu": ("scan", "cudnn")}.get(platform, ("scan",))


def bench_lstm(batch: int, steps_n: int, width: int, *, backends: tuple[str, ...], repeats: int,
               warmup: int, peer_device: str | None) -> tuple[list[dict], list[dict]]:
    """Our one-layer LSTM (zoo.nn.recurrent.RNN, float32) on (batch, n, d) inputs with each of
    `backends`: forward and forward + backward (gradients of sum(outputs) w.r.t. params and
    inputs), beside torch.nn.LSTM, all timed in turns, call by call (`time_alternating`), so
    every backend is compared with the same torch measurements. One row per backend."""
    x = jax.random.normal(jax.random.key(0), (batch, steps_n, width), jnp.float32)
    params = nn.unbox(jax.jit(RNN(hidden_size=width).init)(jax.random.key(1), x))["params"]
    calls = {}
    for backend in backends:
        rnn = RNN(hidden_size=width, cell="lstm", backend=backend)

        def forward(p, inputs, rnn=rnn):
            return rnn.apply({"params": p}, inputs)[0]  # (B, n, d)

        forward_jit = jax.jit(forward)
        backward = jax.jit(jax.grad(lambda p, inputs, f=forward: f(p, inputs).sum(),
                                    argnums=(0, 1)))
        calls[(backend, "forward")] = lambda f=forward_jit: jax.block_until_ready(f(params, x))
        calls[(backend, "train")] = lambda b=backward: jax.block_until_ready(b(params, x))
    theirs = None
    if peer_device is not None:
        theirs = peers.lstm_calls(batch, steps_n, width, device=peer_device)
        calls |= {("peer", "forward"): theirs["forward"], ("peer", "train"): theirs["train"]}
    on_cpu = jax.devices()[0].platform == "cpu"
    t = time_alternating(calls, warmup=warmup, repeats=repeats, settle=on_cpu)
    key = dict(batch=batch, n=steps_n, d=width)
    records, rows = [], []
    if theirs is not None:
        records += [dict(key, kind=f"peer_lstm_{p}", peer=theirs["name"], **t[("peer", p)])
                    for p in ("forward", "train")]
    for backend in backends:
        ours = {p: t[(backend, p)] for p in ("forward", "train")}
        records += [dict(key, kind=f"lstm_{p}", backend=backend, **ours[p])
                    for p in ("forward", "train")]
        # The 1-minute load average: a 2-core box shared with test suites slows both sides,
        # and torch's OpenMP threads far more than XLA's when oversubscribed.
        row = dict(key, backend=backend, params=count_params(params),
                   forward_s=ours["forward"]["median_s"], train_s=ours["train"]["median_s"],
                   load_avg_1m=os.getloadavg()[0], calls_start_idle=on_cpu)
        if theirs is not None:
            peer = {p: t[("peer", p)] for p in ("forward", "train")}
            row["peer"] = dict(
                name=theirs["name"], params=theirs["params"],
                forward_s=peer["forward"]["median_s"], train_s=peer["train"]["median_s"],
                forward_ratio=_ratio(ours["forward"]["median_s"], peer["forward"]["median_s"]),
                train_ratio=_ratio(ours["train"]["median_s"], peer["train"]["median_s"]),
                train_ratio_min=_ratio(ours["train"]["min_s"], peer["train"]["min_s"]),
                **{f"{p}_ratio_interval": machine.ratio_interval(ours[p]["samples_s"],
                                                                 peer[p]["samples_s"])
                   for p in ("forward", "train")},
            )
        rows.append(row)
    return records, rows


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v)
    except ValueError:
        raise ConfigError(f"{flag}={text!r} must be comma-separated integers") from None
    if not values or min(values) < 1:
        raise ConfigError(f"{flag}={text!r} must list integers >= 1")
    return values


def _lstm_shapes(text: str) -> tuple[tuple[int, int], ...]:
    if text in ("", "none"):
        return ()
    try:
        shapes = tuple(tuple(int(v) for v in item.split("x")) for item in text.split(","))
    except ValueError:
        shapes = ((),)
    if any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise ConfigError(f"--lstm={text!r} must be comma-separated STEPSxWIDTH pairs, e.g. "
                         "'64x128,128x256' (or 'none')")
    return shapes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    preset = parser.add_mutually_exclusive_group()
    preset.add_argument("--quick", action="store_true",
                        help="2-core CPU preset (the default): tiny/small, seq 64/128, float32")
    preset.add_argument("--full", action="store_true",
                        help="GPU preset: BERT base/large, GPT-2 124M/355M, seq 128/512/1024, "
                             "bfloat16")
    parser.add_argument("--models", help="comma-separated: bert,gpt ('none': the LSTM only)")
    parser.add_argument("--sizes", help=f"comma-separated; each model runs those it has: "
                        f"{ {m: list(s) for m, s in SIZES.items()} }")
    parser.add_argument("--seq-lens", help="comma-separated sequence lengths")
    parser.add_argument("--batch", type=int,
                        help="sequences per step (default: the preset's tokens / seq len)")
    parser.add_argument("--steps", type=int, help="timed steps per measurement")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before timing")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="compute dtype")
    parser.add_argument("--lstm", help="LSTM shapes STEPSxWIDTH,... ('none' to skip)")
    parser.add_argument("--lstm-backends",
                        help="our LSTM backends to time, comma-separated (default: scan and the "
                             "platform's fused kernel: cpu_fused on a CPU, cudnn on a GPU)")
    parser.add_argument("--lstm-repeats", type=int,
                        help="timed LSTM calls per side, ours and torch's in turns "
                             "(default: the preset's)")
    parser.add_argument("--profile", metavar="DIR",
                        help="write a jax.profiler trace of 3 steps per config under DIR")
    parser.add_argument("--no-peers", action="store_true", help="skip the PyTorch peers")
    parser.add_argument("--hf-flax-python", metavar="PYTHON",
                        help="python of a venv with transformers 4.57 and flax (no torch): also "
                             "time GPT beside FlaxGPT2LMHeadModel, step by step in turns "
                             f"(benchmarks/hf_flax_peer.py). Make one with: {peers.HF_FLAX_VENV}")
    parser.add_argument("--out", help="results directory (default benchmarks/results/<machine>)")
    parser.add_argument("--append", action="store_true",
                        help="merge into the results already in --out (same machine, preset "
                             "and dtype): a preset split over several runs, e.g. --models bert "
                             "then --models gpt --append where one command has a time limit")
    args = parser.parse_args(argv)
    args.preset = "full" if args.full else "quick"
    p = PRESETS[args.preset]
    if args.models == "none":
        args.models = ()
    else:
        args.models = tuple(args.models.split(",")) if args.models else p["models"]
    args.sizes = tuple(args.sizes.split(",")) if args.sizes else p["sizes"]
    args.seq_lens = _ints(args.seq_lens, "--seq-lens") if args.seq_lens else p["seq_lens"]
    args.steps = args.steps or p["steps"]
    args.dtype = args.dtype or p["dtype"]
    args.lstm = p["lstm"] if args.lstm is None else _lstm_shapes(args.lstm)
    args.lstm_repeats = args.lstm_repeats or p["lstm_repeats"]
    if args.lstm_backends is not None:
        args.lstm_backends = tuple(args.lstm_backends.split(","))
        unknown = [b for b in args.lstm_backends if b not in RNN_BACKENDS]
        if unknown or not args.lstm_backends:
            raise ConfigError(f"--lstm-backends={','.join(args.lstm_backends)!r}: choose from "
                              f"{', '.join(RNN_BACKENDS)}")
    if args.batch is not None and args.batch < 1:
        raise ConfigError(f"--batch={args.batch} must be >= 1")
    if args.steps < 1 or args.warmup < 0 or args.lstm_repeats < 1:
        raise ConfigError(f"--steps={args.steps} and --lstm-repeats={args.lstm_repeats} must "
                          f"be >= 1 and --warmup={args.warmup} >= 0")
    for model in args.models:
        if model not in SIZES:
            raise ConfigError(f"--models: unknown model {model!r}; choose from {list(SIZES)}")
    unknown = [s for s in args.sizes if not any(s in SIZES[m] for m in args.models)]
    if unknown and args.models:
        raise ConfigError(f"--sizes: no selected model has {unknown}; sizes: "
                         f"{ {m: list(SIZES[m]) for m in args.models} }")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs the benchmark and writes its outputs; returns the summary."""
    args = parse_args(argv)
    started = time.perf_counter()
    out = machine.results_dir(args.out)
    device = jax.devices()[0]
    platform = device.platform
    peak_spec = metrics.peak_flops([device])
    compute_dtype = jnp.dtype(args.dtype)
    matmul_size = PRESETS[args.preset]["matmul"]
    matmul_flops = machine.measured_matmul_flops(matmul_size, compute_dtype)
    summary: dict[str, Any] = dict(
        machine=machine.machine_name(), platform=platform, device_kind=device.device_kind,
        jax=jax.__version__, preset=args.preset, dtype=args.dtype, steps=args.steps,
        warmup=args.warmup, xla_cpu_threads=peers.cpu_threads() if platform == "cpu" else None,
        peak_flops_spec=peak_spec, matmul_flops=matmul_flops,
        matmul=f"{matmul_size}x{matmul_size} @ {matmul_size}x{matmul_size} {args.dtype}",
        flops_formulas={m: FLOPS_FORMULAS[m] for m in args.models},
        mfu="flops_per_token * tokens_per_step / step_s / peak (peak = spec: mfu_spec; "
            "= measured matmul FLOP/s: mfu_vs_matmul)",
        ratios="ours / theirs (time): < 1 means ours is faster",
    )
    reason = "--no-peers" if args.no_peers else peers.unavailable_reason(platform)
    peer_device = None
    if reason is None:
        summary["peers"] = peers.setup_torch(platform)
        peer_device = summary["peers"]["torch_device"]
    else:
        summary["peers"] = {"skipped": reason}
    summary["hf_flax"] = ({"python": args.hf_flax_python} if args.hf_flax_python else
                          {"skipped": hf_flax_absent("gpt", None)})
    records: list[dict] = [dict(kind="machine", **{k: v for k, v in summary.items()
                                                   if not isinstance(v, dict)})]
    rows, lstm_rows = [], []
    tokens = PRESETS[args.preset]["tokens"]
    for model in args.models:
        for size in (s for s in args.sizes if s in SIZES[model]):
            for seq_len in args.seq_lens:
                batch = args.batch or max(1, tokens // seq_len)
                print(f"{model} {size} seq {seq_len} batch {batch} ...", flush=True)
                new, row = bench_transformer(
                    model, size, seq_len, batch, dtype=args.dtype, steps=args.steps,
                    warmup=args.warmup, peak_spec=peak_spec, matmul_flops=matmul_flops,
                    peer_device=peer_device, profile_dir=args.profile,
                    hf_flax_python=args.hf_flax_python)
                if peer_device is None:
                    row["peer"] = {"skipped": reason}
                records += new
                rows.append(row)
                print("  " + step_report.row_line(row), flush=True)
    backends = args.lstm_backends or lstm_backends(platform)
    for steps_n, width in args.lstm:
        batch = args.batch or PRESETS[args.preset]["lstm_batch"]
        print(f"lstm n {steps_n} d {width} batch {batch} ...", flush=True)
        new, backend_rows = bench_lstm(batch, steps_n, width, backends=backends,
                                       repeats=args.lstm_repeats, warmup=args.warmup,
                                       peer_device=peer_device)
        for row in backend_rows:
            if peer_device is None:
                row["peer"] = {"skipped": reason}
            print("  " + step_report.lstm_line(row), flush=True)
        records += new
        lstm_rows += backend_rows
    summary.update(configs=rows, lstm=lstm_rows, lstm_repeats=args.lstm_repeats,
                   wall_s=time.perf_counter() - started)
    if args.append:
        summary, records = step_report.merge(out, summary, records)
    step_report.write_all(out, summary, records)
    print(f"wrote {out}/step.{{jsonl,md,png}} and step_summary.json "
          f"({summary['wall_s']:.0f} s)", flush=True)
    return summary


if __name__ == "__main__":
    with errors.reported("benchmarks.step"):
        main()
