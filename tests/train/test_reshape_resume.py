"""Issue 30 item 3: a run saved by 2 processes x 4 devices resumes on another shape of the same 8
devices, 1 process x 8 and 4 processes x 2, with the losses, eval and parameters of a run that
never stopped (params and optimizer state re-laid onto the new mesh by orbax, the data position
read from the global batch index every process saved)."""

import json
import os
import shutil

import pytest

from tests.train import multihost

# Real processes for minutes: the acceptance tier.
pytestmark = pytest.mark.acceptance

DEVICES = 8
HALF, STEPS, EVERY = 10, 20, 10


def _train(workdir, steps, processes):
    env = multihost.base_env(DEVICES // processes, fast_compile=True)
    port = multihost.free_port()
    envs = [env if processes == 1 else
            dict(env, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                 JAX_NUM_PROCESSES=str(processes), JAX_PROCESS_ID=str(index))
            for index in range(processes)]
    return multihost.finish(multihost.launch(
        multihost.command(workdir, steps, EVERY, keep=STEPS), envs))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("one-by-eight"))
    _train(workdir, STEPS, processes=1)
    return workdir


@pytest.fixture(scope="module")
def saved_by_two_by_four(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("two-by-four"))
    out = _train(workdir, HALF, processes=2)
    assert "parameters on mesh {'data': 8" in out
    data = os.path.join(workdir, "checkpoints", str(HALF), "data")
    saved = sorted(n for n in os.listdir(data) if n.endswith(".json"))
    assert saved == ["process_0-of-2.json", "process_1-of-2.json"]
    # What lets another process count read it: both processes saved the same global position.
    positions = [json.load(open(os.path.join(data, n))) for n in saved]
    assert positions[0] == positions[1]
    return workdir


@pytest.mark.parametrize("processes", [1, 4])  # 1 x 8 and 4 x 2 devices
def test_two_by_four_resumes_on_another_shape_as_if_never_stopped(
        saved_by_two_by_four, uninterrupted, processes, tmp_path):
    workdir = str(tmp_path / "resumed")
    shutil.copytree(saved_by_two_by_four, workdir)
    out = _train(workdir, STEPS, processes)
    assert f"starting at step {HALF} of {STEPS}" in out
    assert "parameters on mesh {'data': 8" in out
    multihost.assert_same_training(workdir, uninterrupted, STEPS)
