"""Gradient accumulation through the loop's compiled step on a sharded mesh: micro-batches on
a 2x2x2 mesh of 8 fake devices give the update of the whole batch on one device (the
one-device, in-process proof is tests/train/test_step.py)."""

import jax
import numpy as np
import pytest

from tests.numerics import assert_params_close
from tests.train import loop_steps
from zoo.commands import jobs


def _train(config, workdir, devices, batches):
    state, losses = loop_steps.train(jobs.build(config, workdir, devices=devices), config,
                                     batches)
    return losses, jax.device_get(state.params)


@pytest.mark.slow
def test_accumulated_steps_on_a_2x2x2_mesh_equal_whole_batches_on_one_device(tiny_lm_config,
                                                                              tmp_path):
    config = tiny_lm_config()
    # SGD: Adam would turn float-rounding differences between layouts into full-size steps.
    config.optim.update(name="sgd", learning_rate=0.5, warmup_steps=1)
    workdir = str(tmp_path)
    one_device = jax.devices()[:1]
    iterator = jobs.build(config, workdir, devices=one_device).task.train_batches(0, 1)
    batches = [next(iterator) for _ in range(3)]  # 8 rows each: 2 micro-batches of 4 below
    whole_losses, whole_params = _train(config, workdir, one_device, batches)

    sharded = config.copy_and_resolve_references()
    sharded.train.grad_accum_steps = 2
    sharded.mesh.update(data=2, fsdp=2, tensor=2)
    losses, params = _train(sharded, workdir, jax.devices()[:8], batches)
    np.testing.assert_allclose(losses, whole_losses, rtol=2e-5)
    assert whole_losses[-1] < whole_losses[0]  # the steps did move the model
    assert_params_close(params, whole_params, 1e-4)
