"""What every benchmark shares: the machine's name, where its results go, and how a jitted
function is timed and sized.

Timing: one warm-up call (compilation, first-touch allocation), then `repeats` calls each ended by
`jax.block_until_ready` (JAX dispatches asynchronously: without it a call would time only the
enqueue); the median is reported, the minimum kept beside it. Sizes: XLA's own cost analysis
(FLOPs, bytes accessed) and memory analysis (argument, output and temporary buffers of the
compiled program) of the same jitted function, plus the allocator's peak where the backend keeps
one (GPU/TPU; the CPU backend does not, so there the compiled program's buffers stand for it).
"""

import importlib.util
import json
import math
import os
import platform
import re
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp

RESULTS_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def machine_name() -> str:
    """A directory-safe name for this machine: the accelerator kind (e.g. 'nvidia-h100-80gb-hbm3'),
    or 'cpu-<cores>c-<arch>' on a CPU."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        name = f"cpu-{os.cpu_count()}c-{platform.machine()}"
    else:
        name = f"{device.platform}-{device.device_kind}"
    return re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-")


def results_dir(out: str | None = None) -> str:
    """`out`, or benchmarks/results/<machine>; created."""
    directory = out or os.path.join(RESULTS_ROOT, machine_name())
    os.makedirs(directory, exist_ok=True)
    return directory


def time_call(fn: Callable, *args, warmup: int = 1, repeats: int = 5) -> dict[str, float]:
    """Median and minimum wall seconds of `fn(*args)` over `repeats` timed calls."""
    if repeats < 1:
        raise ValueError(f"time_call: repeats={repeats} must be >= 1")
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return {"median_s": statistics.median(times), "min_s": min(times), "repeats": repeats}


def ratio_interval(ours: list[float], theirs: list[float], confidence: float = 0.9
                   ) -> dict[str, float]:
    """The median of per-turn ratios ours[i] / theirs[i] (two sides timed in turns) and a
    distribution-free interval for it: order statistics of the sorted ratios, [r_(k), r_(n-k+1)]
    with the largest k whose coverage 1 - 2 P(Binomial(n, 1/2) < k) is at least `confidence`
    (with too few turns for that, the whole range and the coverage it has).

    Why: a box shared with other work drifts by 10-20% over minutes; a load change inside a turn
    moves both sides of that turn, so the spread of the per-turn ratios is the noise a
    comparison has to beat. A ratio whose interval holds 1.0 is parity within that noise."""
    if len(ours) != len(theirs) or not ours:
        raise ValueError(f"ratio_interval: {len(ours)} and {len(theirs)} times; give one per "
                         "turn on each side")
    ratios = sorted(a / b for a, b in zip(ours, theirs))
    n = len(ratios)

    def coverage(k: int) -> float:  # of [r_(k), r_(n-k+1)], 1-based
        return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2.0**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= confidence:
        k += 1
    return {"ratio": statistics.median(ratios), "low": ratios[k - 1], "high": ratios[n - k],
            "coverage": coverage(k), "turns": n}


def _cpu_seconds(pids: Iterable[int]) -> float:
    """CPU seconds used so far by this process and by the processes `pids` (every thread's,
    from /proc/<pid>/task/*/schedstat; a process or thread gone, or no /proc, counts 0)."""
    total = time.process_time()
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0]) / 1e9
            except (OSError, ValueError, IndexError):
                continue
    return total


def wait_until_idle(pids: Iterable[int] = (), *, quiet_s: float = 0.02, limit_s: float = 1.0
                    ) -> float:
    """Waits until this process's threads, and those of the processes `pids`, use no CPU for
    `quiet_s` (at most `limit_s`) and returns the seconds waited.

    Why: a library's worker threads can keep running after its call has returned. torch's
    OpenMP workers (libgomp) spin-wait up to GOMP_SPINCOUNT pauses before they sleep, about
    20 ms on the 2-core box, so a call timed just after one of torch's shared the cores with
    them: there zoo's LSTM forward (benchmarks.step, in turns) measured 1.57x torch's, and
    1.34x with each side timed alone in a process of its own. A JAX train step's process
    keeps using 15-50 ms of CPU in the 50 ms after its step returns (GPT small, either side),
    so the peer in another process (benchmarks.peers.HFFlaxPeer) is waited for too. "Idle" is
    the CPU time growing by under a tenth of the wall time over `quiet_s`: 20 ms, longer than
    the scheduler keeps a runnable thread waiting on a busy 2-core machine (with 5 ms a
    spinning thread descheduled for the whole window passed for idle)."""
    pids = tuple(pids)
    start = time.perf_counter()
    cpu = _cpu_seconds(pids)
    while time.perf_counter() - start < limit_s:
        time.sleep(quiet_s)
        now = _cpu_seconds(pids)
        if now - cpu < quiet_s / 10:
            break
        cpu = now
    return time.perf_counter() - start


def compile_stats(jitted: Any, *args) -> dict[str, float | None]:
    """Compile time, XLA's FLOPs and bytes accessed, and the compiled program's buffer bytes
    (arguments + outputs + temporaries) for `jitted(*args)`. Call it before the function first
    runs: a program already compiled in this process comes from jax's cache in no time."""
    return compile_with_stats(jitted, *args)[1]


def compile_with_stats(jitted: Any, *args) -> tuple[Any, dict[str, float | None]]:
    """`compile_stats` and the compiled executable itself (to run it without a retrace)."""
    start = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    compile_s = time.perf_counter() - start
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per program
        cost = cost[0] if cost else {}
    cost = cost or {}
    memory = compiled.memory_analysis()
    buffers = None
    if memory is not None:
        buffers = (memory.argument_size_in_bytes + memory.output_size_in_bytes
                   + memory.temp_size_in_bytes - memory.alias_size_in_bytes)
    return compiled, {
        "compile_s": compile_s,
        "xla_flops": cost.get("flops"),
        "xla_bytes_accessed": cost.get("bytes accessed"),
        "temp_bytes": None if memory is None else memory.temp_size_in_bytes,
        "program_bytes": buffers,
    }


def peak_memory_bytes(device=None) -> int | None:
    """The allocator's peak bytes in use on `device` (None where the backend keeps no stats)."""
    stats = (device or jax.devices()[0]).memory_stats()
    return None if not stats else stats.get("peak_bytes_in_use")


def device_memory_bytes(device=None) -> int | None:
    """Memory the device can hold (the allocator's limit; None on the CPU backend)."""
    stats = (device or jax.devices()[0]).memory_stats()
    return None if not stats else stats.get("bytes_limit")


def available_memory_bytes() -> int:
    """Memory a new allocation can take now: Linux's MemAvailable (free + reclaimable cache),
    else the physical RAM."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def measured_matmul_flops(size: int = 2048, dtype=jnp.float32, repeats: int = 5) -> float:
    """FLOP/s of one square matmul on this device: the rate MFU is also reported against where
    no spec is known (and beside the spec where it is)."""
    a = jnp.ones((size, size), dtype)
    matmul = jax.jit(lambda x, y: x @ y)
    seconds = time_call(matmul, a, a, repeats=repeats)["median_s"]
    return 2.0 * size**3 / seconds


def write_jsonl(path: str, records: Iterable[dict]) -> None:
    with open(path, "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")


def zoo_commit() -> str:
    """The short commit of the zoo checkout being measured, '+uncommitted zoo/ changes' when
    its zoo/ differs from it ('unknown' outside git)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        run = lambda *cmd: subprocess.run(["git", "-C", root, *cmd], check=True,
                                          capture_output=True, text=True).stdout.strip()
        sha, dirty = run("rev-parse", "--short", "HEAD"), run("status", "--porcelain", "zoo")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+uncommitted zoo/ changes" if dirty else "")


def load_module_file(path: str, name: str):
    """The Python file `path` (e.g. another commit's version of a zoo module, from `git show`)
    imported as a module of its own named `name`, to measure beside the current one; its
    imports resolve to this checkout's modules."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"load_module_file: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
