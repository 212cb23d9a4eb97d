"""Where metrics go: JSON lines (the record of truth), TensorBoard, and a console progress line."""

import datetime
import json
import sys
import time

import jax
import numpy as np

from zoo import paths
from zoo.train.compilation import chips


class _JsonLines:
    """A JSON-lines file that survives a kill with every line written before it.

    Locally: appended and flushed line by line. In GCS an object cannot be appended to, so the
    whole file (the lines already there when the run started, then this run's) is uploaded
    again after each line: an upload replaces the object at once, so a kill mid-upload leaves
    the previous version, losing at most the line being written. The cost is the file's size
    per log line (a 10,000-line log is about 2 MB), small beside a checkpoint."""

    def __init__(self, path: str):
        self._path = paths.as_path(path)
        self._remote = paths.is_remote(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        if self._remote:
            self._lines = self._path.read_bytes() if self._path.exists() else b""
        else:
            self._file = open(self._path, "a", encoding="utf-8")

    def write(self, line: str) -> None:
        if self._remote:
            self._lines += line.encode("utf-8")
            self._path.write_bytes(self._lines)
        else:
            self._file.write(line)
            self._file.flush()  # a killed run keeps every line written so far

    def close(self) -> None:
        if not self._remote:
            self._file.close()


class MetricsWriter:
    """Appends `{"step": s, "split": ..., **metrics}` to <workdir>/metrics.jsonl and TensorBoard
    (a local or gs:// workdir).

    Only process 0 writes, so a multi-host run produces one record.
    """

    def __init__(self, workdir: str, tensorboard: bool = True):
        self._enabled = jax.process_index() == 0
        self._jsonl = None
        self._tb = None
        if not self._enabled:
            return
        self._jsonl = _JsonLines(paths.join(workdir, "metrics.jsonl"))
        if tensorboard:
            from tensorboardX import SummaryWriter  # imported lazily: slow, and optional

            # tensorboardX writes gs:// itself (google-cloud-storage: each flush uploads the
            # event file again, as _JsonLines does); locally it makes the directory.
            self._tb = SummaryWriter(paths.join(workdir, "tensorboard"))

    def write(self, step: int, split: str, metrics: dict[str, float]) -> None:
        if not self._enabled:
            return
        clean = {k: float(v) for k, v in metrics.items()}
        self._jsonl.write(json.dumps({"step": int(step), "split": split, **clean}) + "\n")
        if self._tb is not None:
            for k, v in clean.items():
                self._tb.add_scalar(f"{split}/{k}", v, int(step))

    def scalars(self, step: int, prefix: str, metrics: dict[str, float]) -> None:
        """TensorBoard only: `prefix`/name for each metric (metrics.jsonl keeps the train and
        eval records)."""
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(f"{prefix}/{k}", float(v), int(step))

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()


def peak_flops(devices, override: float = 0.0) -> float | None:
    """Total dense bf16 peak FLOP/s of `devices` (zoo.train.compilation.chips;
    config.train.peak_flops per device overrides it); None where unknown (CPUs), and MFU is then not
    shown."""
    devices = list(devices)
    if override:
        return override * len(devices)
    chip = chips.for_device_kind(devices[0].device_kind)
    return None if chip is None else chip.peak_flops * len(devices)


class Progress:
    """Console line per log interval: a bar, step, loss, tokens/s, MFU, HFU and ETA, measured
    between calls (so compile time shows up only in the first interval).

    MFU counts the model's FLOPs per token (the task's flops_per_token: 6N for the weights plus
    attention, causal attention counted at half the full square as MaxText counts it) against the
    devices' dense bf16 peak (zoo.train.compilation.chips); HFU counts what the step executes (its
    matmuls from the jaxpr: recomputation by remat, and the full square an einsum computes for
    causal attention, included; zoo.train.compilation.flops), so HFU >= MFU and the gap is
    recomputation.
    """

    def __init__(self, total_steps: int, start_step: int = 0, flops_per_token: float = 0.0,
                 peak_flops: float | None = None, stream=None,
                 executed_flops_per_token: float = 0.0):
        self.total = total_steps
        self._stream = stream
        self._last_time = time.perf_counter()
        self._last_step = start_step
        self._flops_per_token = flops_per_token
        self._executed_flops_per_token = executed_flops_per_token
        self._peak = peak_flops

    def update(self, step: int, metrics: dict[str, float], tokens: float) -> dict[str, float]:
        now = time.perf_counter()
        elapsed = max(now - self._last_time, 1e-9)
        steps = max(step - self._last_step, 1)
        self._last_time, self._last_step = now, step
        rates = {"tokens_per_sec": tokens / elapsed, "steps_per_sec": steps / elapsed}
        if self._peak and self._flops_per_token:
            rates["mfu"] = rates["tokens_per_sec"] * self._flops_per_token / self._peak
        if self._peak and self._executed_flops_per_token:
            rates["hfu"] = rates["tokens_per_sec"] * self._executed_flops_per_token / self._peak
        eta = datetime.timedelta(seconds=int((self.total - step) * elapsed / steps))
        if jax.process_index() == 0:
            filled = int(20 * step / max(self.total, 1))
            shown = " | ".join(
                f"{k} {v:.4g}" for k, v in metrics.items()
                if k in ("loss", "accuracy", "lr") or (k in ("skipped_steps", "spike_skips") and v)
            )
            mfu = f" | MFU {rates['mfu']:.1%}" if "mfu" in rates else ""
            mfu += f" (HFU {rates['hfu']:.1%})" if "hfu" in rates else ""
            print(
                f"[{'#' * filled}{'.' * (20 - filled)}] step {step:>6}/{self.total} | {shown} | "
                f"{rates['tokens_per_sec']:,.0f} tok/s{mfu} | ETA {eta}",
                file=self._stream or sys.stdout, flush=True,  # sys.stdout now, not at import
            )
        return rates


class EvalProgress:
    """A console line every `every_s` seconds of an eval pass (process 0): batches done, of how
    many when the pass knows, the time so far and the ETA. Silent for a pass shorter than
    `every_s`; a beam search over a validation split can take minutes, and minutes without a
    word read as a hang."""

    def __init__(self, total: int | None = None, every_s: float = 30.0, stream=None,
                 clock=time.perf_counter):
        self.total, self.every_s, self._stream, self._clock = total, every_s, stream, clock
        self._start = self._last = clock()
        self.done = 0

    def update(self) -> None:
        """One more batch evaluated."""
        self.done += 1
        now = self._clock()
        if now - self._last < self.every_s or jax.process_index() != 0:
            return
        self._last = now
        elapsed = now - self._start
        of = f"/{self.total}" if self.total else ""
        eta = ""
        if self.total:
            left = elapsed / self.done * (self.total - self.done)
            eta = f" | ETA {datetime.timedelta(seconds=int(left))}"
        print(f"eval: batch {self.done}{of} | {datetime.timedelta(seconds=int(elapsed))} so far"
              f"{eta}", file=self._stream or sys.stdout, flush=True)


def sum_metrics(history: list[dict]) -> dict[str, float]:
    """Adds per-step metric sums fetched from device in one transfer."""
    host = jax.device_get(history)
    return {k: float(np.sum([h[k] for h in host])) for k in host[0]}
