"""The two sides of a benchmarks.quality pair and the loop that trains them in turns.

zoo's side is what train.py runs: the job config's task (its model and loss_fn), the optimizer of
zoo.train.optim.make_optimizer(config.optim) and zoo.train.loop's jitted train and eval steps with
their shardings and donation (benchmarks.step_jobs.build), on a one-device mesh. Only the corpus
is replaced: the task is handed the vocabulary size and each batch comes from benchmarks
.quality_data, as a dict with the LM task's keys.

The peer's side is what a PyTorch user writes: zero_grad, mean token cross-entropy, backward,
clip_grad_norm_, AdamW (torch.optim, decoupled decay) with two parameter groups, decay on every
parameter with dim >= 2 (nanoGPT's rule; embeddings included, biases and LayerNorm gains not) and
the learning rate of `peer_learning_rate` set before each step: zoo's schedule written again in
plain Python (linear warm-up from 0, then cosine or linear to end_learning_rate).

`train_in_turns` steps both sides on the same batch, one step each, the side that goes first
alternating, and times each step to the end of its work (the loss read back as a Python float,
which waits for JAX's asynchronous dispatch), so load from other processes falls on both alike.
"""

import contextlib
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from benchmarks import step_jobs
from zoo.train import loop


def lm_batch(x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """[B, T] inputs and next-token targets as the LM task's batch: every row one document
    (segment id 1, positions 0..T-1), every token weighted 1."""
    b, t = x.shape
    return {"inputs": x.astype(np.int32), "targets": y.astype(np.int32),
            "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(),
            "segment_ids": np.ones((b, t), np.int32), "weights": np.ones((b, t), np.float32)}


class ZooSide:
    """zoo's train and eval steps for `task` under `config` (see the module docstring)."""

    name = "zoo"

    def __init__(self, config: ml_collections.ConfigDict, task, eval_rows: int):
        self.setup = step_jobs.build(config, task)
        self.train_step = loop.make_train_step(self.setup, config)
        self.eval_step = loop.make_eval_step(self.setup)
        self.state = self.setup.state
        self.eval_rows = eval_rows
        self._context = contextlib.ExitStack()
        self._context.enter_context(jax.set_mesh(self.setup.mesh))
        self._context.enter_context(nn.logical_axis_rules(self.setup.rules))

    def close(self):
        self._context.close()

    def num_params(self) -> int:
        return int(sum(np.prod(p.shape) for p in jax.tree.leaves(self.state.params)))

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        batch = jax.device_put(lm_batch(x, y), self.setup.batch_sharding)
        self.state, metrics = self.train_step(self.state, batch)
        return float(metrics["loss_sum"] / metrics["weight_sum"])

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> float:
        """Mean next-token NLL over all rows, `eval_rows` rows per call (one compiled shape)."""
        nll = weight = 0.0
        for start in range(0, len(x), self.eval_rows):
            batch = lm_batch(x[start:start + self.eval_rows], y[start:start + self.eval_rows])
            sums = jax.device_get(self.eval_step(
                self.state.params, jax.device_put(batch, self.setup.batch_sharding)))
            nll, weight = nll + float(sums["nll_sum"]), weight + float(sums["weight_sum"])
        return nll / weight


def peer_learning_rate(optim: ml_collections.ConfigDict, step: int) -> float:
    """zoo.train.optim.make_schedule's learning rate at `step`, in plain Python (the peer's own
    copy; tests/benchmarks/test_quality.py checks the two agree)."""
    peak, warmup, total = optim.learning_rate, int(optim.warmup_steps), int(optim.total_steps)
    end = float(optim.get("end_learning_rate", 0.0))
    if step < warmup:
        return peak * step / warmup
    if optim.decay == "constant":
        return peak
    progress = min((step - warmup) / max(total - warmup, 1), 1.0)
    if optim.decay == "linear":
        return peak + (end - peak) * progress
    if optim.decay == "cosine":
        return end + (peak - end) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"peer_learning_rate: no peer schedule for decay={optim.decay!r}")


def decay_groups(module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW parameter groups: dim >= 2 decays, the rest (biases, LayerNorm) does not; frozen
    parameters (requires_grad False) are left out."""
    params = [p for p in module.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


class TorchSide:
    """A PyTorch model trained with the same recipe: `logits_fn(x_long_tensor) -> [B, T, V]`."""

    name = "peer"

    def __init__(self, module, logits_fn: Callable, optim: ml_collections.ConfigDict,
                 eval_rows: int):
        import torch

        self.torch, self.module, self.logits_fn, self.optim = torch, module, logits_fn, optim
        self.optimizer = torch.optim.AdamW(
            decay_groups(module, optim.weight_decay), lr=optim.learning_rate,
            betas=(optim.b1, optim.b2), eps=optim.eps)
        self.trainable = [p for p in module.parameters() if p.requires_grad]
        self.steps = 0
        self.eval_rows = eval_rows

    def close(self):
        pass

    def num_params(self) -> int:
        return sum(p.numel() for p in self.module.parameters())

    def _loss(self, x: np.ndarray, y: np.ndarray):
        torch = self.torch
        logits = self.logits_fn(torch.from_numpy(x).long())  # (B, T, V)
        targets = torch.from_numpy(y).long()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1))

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        lr = peer_learning_rate(self.optim, self.steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.module.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self._loss(x, y)
        loss.backward()
        if self.optim.clip_norm:
            self.torch.nn.utils.clip_grad_norm_(self.trainable, self.optim.clip_norm)
        self.optimizer.step()
        self.steps += 1
        return float(loss.item())

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> float:
        self.module.eval()
        total = 0.0
        with self.torch.no_grad():
            for start in range(0, len(x), self.eval_rows):
                xs, ys = x[start:start + self.eval_rows], y[start:start + self.eval_rows]
                total += float(self._loss(xs, ys)) * ys.size
        return total / y.size


EvalSets = dict[str, tuple[np.ndarray, np.ndarray]]


def train_in_turns(sides: list, batches: Iterable[tuple[np.ndarray, np.ndarray]], steps: int,
                   eval_every: int, eval_sets: EvalSets, final_sets: EvalSets | None = None,
                   log: Callable[[str], None] = print,
                   on_eval: Callable[[dict, int], None] | None = None
                   ) -> dict[str, dict[str, Any]]:
    """Trains every side for `steps` steps on the same batches, one step each in turns, and
    evaluates each on every set of `eval_sets` at step 0, every `eval_every` steps and at the
    end, and on `final_sets` at the end only. Returns per side: train losses, step seconds,
    the curve [(step, {set: loss})] and `final` {set: loss} (eval_sets' and final_sets').
    `on_eval(out, step)` sees the results so far after every evaluation (a run cut short still
    leaves its curve)."""
    out = {s.name: {"train_loss": [], "step_s": [], "curve": [], "final": {}} for s in sides}

    def evaluate(step: int, sets: EvalSets, key: str):
        for side in sides:
            start = time.perf_counter()
            losses = {k: side.evaluate(*v) for k, v in sets.items()}
            if key == "curve":
                out[side.name]["curve"].append((step, losses))
            if key == "final" or not final_sets:
                out[side.name]["final"].update(losses)
            log(f"  step {step:5d} {side.name:4s} "
                + " ".join(f"{k} {v:.4f}" for k, v in losses.items())
                + f" ({time.perf_counter() - start:.1f} s)")

    evaluate(0, eval_sets, "curve")
    for i, (x, y) in enumerate(batches):
        if i >= steps:
            break
        order = sides if i % 2 == 0 else sides[::-1]
        for side in order:
            # A copy each: neither side can change what the other receives.
            xs, ys = x.copy(), y.copy()
            start = time.perf_counter()
            loss = side.step(xs, ys)
            out[side.name]["step_s"].append(time.perf_counter() - start)
            out[side.name]["train_loss"].append(loss)
        done = i + 1
        if done % eval_every == 0 or done == steps:
            evaluate(done, eval_sets, "curve")
            if on_eval and done < steps:
                on_eval(out, done)
    if final_sets:
        evaluate(steps, final_sets, "final")
    return out
