"""Small train states saved as checkpoints, for the restore tests (tests/train/
test_checkpoint_restore.py, test_restore_decisions.py)."""

import glob
import os

import jax
import jax.numpy as jnp
import optax

from zoo.checkpoints.checkpoint import Checkpointer
from zoo.train.state import TrainState


def small_state(offset: float = 0.0, width: int = 32) -> TrainState:
    params = {"w": jnp.arange(width * width, dtype=jnp.float32).reshape(width, width) + offset,
              "b": jnp.full((width,), offset)}
    return TrainState.create(params, optax.sgd(0.1), jax.random.key(0))


def save_steps(workdir, steps=(2, 4)) -> None:
    """Checkpoints of small_state(step) at each step."""
    saver = Checkpointer(workdir)
    for step in steps:
        saver.save(step, small_state(float(step)))
    saver.close()


def file_tree(directory) -> list[str]:
    return sorted(os.path.relpath(p, directory)
                  for p in glob.glob(os.path.join(directory, "**"), recursive=True))
