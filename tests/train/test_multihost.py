"""Multi-host training on real processes: 2 local processes joined by jax.distributed (CPU
collectives over 127.0.0.1) pretrain tiny BERT together, each reading only its rows of every
global batch, writing one checkpoint; they match the single-process run, a run resumes under
another process count (2 -> 1 and 1 -> 2), and a preemption notice to one host makes both save
the same step and exit 0."""

import json
import os
import shutil

import pytest

from tests.train import multihost

# Minutes of real processes (issue 16): the acceptance tier.
pytestmark = pytest.mark.acceptance

DEVICES = 4  # global device count of every run: 1 process x 4 devices or 2 processes x 2
HALF, STEPS, EVERY = 10, 60, 10  # a checkpoint every EVERY steps, all kept


def _launch(workdir, steps, processes):
    """Starts train.py as `processes` processes sharing DEVICES CPU devices, joined through an
    explicit coordinator (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID)."""
    env = multihost.base_env(DEVICES // processes)
    port = multihost.free_port()
    envs = [env if processes == 1 else
            dict(env, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                 JAX_NUM_PROCESSES=str(processes), JAX_PROCESS_ID=str(index))
            for index in range(processes)]
    return multihost.launch(multihost.command(workdir, steps, EVERY, keep=STEPS), envs)


def _train(workdir, steps, processes):
    return multihost.finish(_launch(workdir, steps, processes))


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    """The reference: one process with all DEVICES devices, STEPS steps."""
    workdir = str(tmp_path_factory.mktemp("single"))
    _train(workdir, STEPS, processes=1)
    return workdir


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """The first HALF steps as 2 processes x 2 devices, with one checkpoint at HALF."""
    workdir = str(tmp_path_factory.mktemp("two"))
    out = _train(workdir, HALF, processes=2)
    assert "parameters on mesh {'data': 4" in out  # one global mesh over both processes
    return workdir


def test_two_processes_train_like_one(two_processes, single_process):
    multihost.assert_same_training(two_processes, single_process, HALF)
    # One checkpoint for both processes: one state, one data position per process (the same
    # global batch index, which is what lets another process count resume it).
    data = os.path.join(two_processes, "checkpoints", str(HALF), "data")
    saved = sorted(n for n in os.listdir(data) if n.endswith(".json"))
    assert saved == ["process_0-of-2.json", "process_1-of-2.json"]
    positions = [json.load(open(os.path.join(data, n))) for n in saved]
    assert positions[0] == positions[1]


def test_two_process_checkpoint_resumes_as_one_process(two_processes, single_process,
                                                       tmp_path):
    workdir = str(tmp_path / "resumed")
    shutil.copytree(two_processes, workdir)
    out = _train(workdir, STEPS, processes=1)
    assert f"starting at step {HALF} of {STEPS}" in out
    multihost.assert_same_training(workdir, single_process, STEPS)


def test_one_process_checkpoint_resumes_as_two_processes(single_process, tmp_path):
    workdir = str(tmp_path / "resumed")
    shutil.copytree(single_process, workdir)
    resume_from = STEPS - 2 * EVERY
    for later in (STEPS - EVERY, STEPS):
        shutil.rmtree(os.path.join(workdir, "checkpoints", str(later)))
    os.remove(os.path.join(workdir, "summary.json"))
    out = _train(workdir, STEPS, processes=2)
    assert f"starting at step {resume_from} of {STEPS}" in out
    multihost.assert_same_training(workdir, single_process, STEPS)


def test_sigterm_to_one_host_saves_one_step_on_both_and_resumes(single_process, tmp_path):
    workdir = str(tmp_path / "preempted")
    out = multihost.preempt_one_host(_launch(workdir, STEPS, processes=2), workdir,
                                     after_steps=15)  # both exit 0
    saved = int(out.split("SIGTERM: saved step ")[1].split()[0])
    assert saved < STEPS, "the run finished before the notice arrived"
    data = os.path.join(workdir, "checkpoints", str(saved), "data")
    assert sorted(os.listdir(data))[-2:] == ["process_0-of-2.json", "process_1-of-2.json"]
    out = _train(workdir, STEPS, processes=2)
    assert f"starting at step {saved} of {STEPS}" in out
    multihost.assert_same_training(workdir, single_process, STEPS)
