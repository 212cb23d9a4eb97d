"""The tiny GPT job as a real process (train.py on one CPU device), for the tests that kill,
corrupt or starve a run and compare it with one that never stopped."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp

from tests.process_env import process_env
from zoo import paths

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def command(workdir, steps: int, every: int, script=None) -> list[str]:
    """train.py (or `script`: a launcher list such as [fault_launcher.py, --fault=...]) with the
    tiny GPT job: `steps` steps, a checkpoint every `every`, every step logged."""
    return [
        sys.executable, *(script or [os.path.join(ROOT, "train.py")]),
        "--config=configs/gpt.py:size=tiny", f"--workdir={workdir}",
        "--config.data.seq_len=16", "--config.data.batch_size=8", "--config.data.vocab_size=128",
        f"--config.train.steps={steps}", "--config.train.log_every=1",
        "--config.train.eval_every=100000", f"--config.train.checkpoint_every={every}",
        "--config.train.keep_checkpoints=3", "--config.train.tensorboard=false",
        "--config.train.best_metric=",
    ]


def env() -> dict:
    # One device per process: the point here is process death, not sharding.
    return process_env(1)


def run(workdir, steps: int, every: int, script=None, check=True):
    """Runs the job to its end (or its failure); with `check`, it must exit 0."""
    proc = subprocess.run(command(workdir, steps, every, script), cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def logged_steps(workdir) -> list[dict]:
    """metrics.jsonl's complete lines (a killed process may leave half of one); the workdir
    may be gs://..."""
    path = paths.as_path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines(keepends=True)
            if line.endswith("\n")]


def losses_by_step(workdir) -> dict[int, float]:
    # A step logged twice (before the fault and again after resuming) keeps its last value.
    return {r["step"]: r["loss"] for r in logged_steps(workdir) if r["split"] == "train"}


def saved_state(workdir, step: int):
    manager = ocp.CheckpointManager(paths.as_path(workdir) / "checkpoints")
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
    manager.close()
    return restored["state"]


def assert_same_state(a, b) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def assert_identical_runs(resumed, uninterrupted, steps: int) -> None:
    """Every step's loss equal (exact floats) and the final saved states equal bit for bit."""
    expected, got = losses_by_step(uninterrupted), losses_by_step(resumed)
    assert sorted(got) == list(range(1, steps + 1))
    assert got == expected
    assert_same_state(saved_state(resumed, steps), saved_state(uninterrupted, steps))
