"""Multi-host training on real processes: 2 local processes joined by jax.distributed (CPU
collectives over 127.0.0.1) pretrain tiny BERT together, each reading only its rows of every
global batch, writing one checkpoint; they match the single-process run, a run resumes under
another process count (2 -> 1 and 1 -> 2), and a preemption notice to one host makes both save
the same step and exit 0."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath

# Minutes of real processes (issue 16): the acceptance tier.
pytestmark = pytest.mark.acceptance

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICES = 4  # global device count of every run: 1 process x 4 devices or 2 processes x 2
HALF, STEPS, EVERY = 10, 60, 10  # a checkpoint every EVERY steps, all kept


def _command(workdir, steps):
    return [
        sys.executable, os.path.join(ROOT, "train.py"),
        "--config=configs/bert_pretrain.py:size=tiny", f"--workdir={workdir}",
        "--config.data.synthetic_entities=100", "--config.data.vocab_size=256",
        "--config.data.seq_len=32", "--config.data.max_predictions_per_seq=5",
        "--config.data.batch_size=8", "--config.data.eval_batch_size=8",
        "--config.data.dupe_factor=1", f"--config.train.steps={steps}",
        "--config.train.log_every=1", f"--config.train.eval_every={HALF}",
        f"--config.train.checkpoint_every={EVERY}", f"--config.train.keep_checkpoints={STEPS}",
        "--config.train.tensorboard=false",
    ]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(workdir, steps, processes):
    """Starts train.py as `processes` processes sharing DEVICES CPU devices."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES // processes}")
    for key in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        env.pop(key, None)
    port = _free_port()
    procs = []
    for index in range(processes):
        if processes > 1:
            env = dict(env, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                       JAX_NUM_PROCESSES=str(processes), JAX_PROCESS_ID=str(index))
        procs.append(subprocess.Popen(_command(workdir, steps), cwd=ROOT, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    return procs


def _finish(procs):
    """Waits for every process; each must exit 0. Returns process 0's stdout."""
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=400))
    finally:
        for proc in procs:  # one failed process leaves the others waiting on collectives
            if proc.poll() is None:
                proc.kill()
    failures = [_failure(index, proc.returncode, err)
                for index, (proc, (_, err)) in enumerate(zip(procs, outputs))
                if proc.returncode != 0]
    # Every process's account: the one that aborted is often not the one that went wrong.
    assert not failures, "\n\n".join(
        failures + [f"process {i} stdout tail:\n{out[-800:]}" for i, (out, _) in
                    enumerate(outputs)])
    return outputs[0][0]


def _failure(index, code, err):
    # An abort's thread dump buries its cause (a barrier timeout, a peer that left): keep the
    # lines that are not stack frames.
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith("  ")
             and "Gloo" not in x and not x.startswith("Thread 0x")]
    return f"process {index} exited {code}:\n" + "\n".join(lines[-40:])


def _train(workdir, steps, processes):
    return _finish(_launch(workdir, steps, processes))


def _records(workdir, split):
    # A step logged twice (before and after a resume) keeps its last value.
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return {r["step"]: r for r in map(json.loads, f) if r["split"] == split}


def _params(workdir, step):
    """The saved params as host numpy arrays (the checkpoint's device layout is not ours)."""
    directory = os.path.join(workdir, "checkpoints", str(step), "state")
    saved = ocp.StandardCheckpointHandler().metadata(epath.Path(directory)).tree["params"]
    target = jax.tree.map(lambda m: np.zeros(m.shape, m.dtype), saved)
    restored = ocp.PyTreeCheckpointer().restore(directory, args=ocp.args.PyTreeRestore(
        item={"params": target},
        restore_args=ocp.checkpoint_utils.construct_restore_args({"params": target}),
        partial_restore=True))
    return restored["params"]


def _assert_same_training(got, expected, steps):
    train_got, train_expected = _records(got, "train"), _records(expected, "train")
    assert sorted(train_got) == list(range(1, steps + 1))
    # Cross-process reductions (gloo) add in another order than one process's: float rounding.
    np.testing.assert_allclose([train_got[s]["loss"] for s in range(1, steps + 1)],
                               [train_expected[s]["loss"] for s in range(1, steps + 1)],
                               rtol=1e-5)
    eval_got, eval_expected = _records(got, "eval"), _records(expected, "eval")
    assert eval_got[steps]["mlm_loss"] == pytest.approx(eval_expected[steps]["mlm_loss"],
                                                        rel=1e-5)
    flat_got = _flat(_params(got, steps))
    flat_expected = _flat(_params(expected, steps))
    assert flat_got.keys() == flat_expected.keys()
    # atol: parameters whose true gradient is 0 (attention key biases) move by Adam steps on
    # rounding noise, damped by eps=1e-6 to ~lr * 1e-3 per step, ~1e-5 over 20 steps at most.
    for name, value in flat_expected.items():
        np.testing.assert_allclose(flat_got[name], value, rtol=1e-4, atol=3e-5, err_msg=name)


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}/{key}").items()}
    return {prefix: np.asarray(tree)}


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
    _assert_same_training(two_processes, single_process, HALF)
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
    _assert_same_training(workdir, single_process, STEPS)


def test_one_process_checkpoint_resumes_as_two_processes(single_process, tmp_path):
    workdir = str(tmp_path / "resumed")
    shutil.copytree(single_process, workdir)
    resume_from = STEPS - 2 * EVERY
    for later in (STEPS - EVERY, STEPS):
        shutil.rmtree(os.path.join(workdir, "checkpoints", str(later)))
    os.remove(os.path.join(workdir, "summary.json"))
    out = _train(workdir, STEPS, processes=2)
    assert f"starting at step {resume_from} of {STEPS}" in out
    _assert_same_training(workdir, single_process, STEPS)


def test_sigterm_to_one_host_saves_one_step_on_both_and_resumes(single_process, tmp_path):
    workdir = str(tmp_path / "preempted")
    procs = _launch(workdir, STEPS, processes=2)
    metrics = os.path.join(workdir, "metrics.jsonl")
    deadline = time.time() + 300
    while not (os.path.exists(metrics) and len(open(metrics).readlines()) >= 15):
        for index, proc in enumerate(procs):
            if proc.poll() is not None:
                for other in procs:  # left alone, it would wait on collectives for minutes
                    if other.poll() is None:
                        other.kill()
                pytest.fail("before the notice, " + _failure(index, proc.returncode,
                                                             proc.stderr.read()))
        assert time.time() < deadline, "no 15 steps logged in 300 s"
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGTERM)  # the notice reaches host 1 only
    out = _finish(procs)  # both exit 0
    saved = int(out.split("SIGTERM: saved step ")[1].split()[0])
    assert saved < STEPS, "the run finished before the notice arrived"
    data = os.path.join(workdir, "checkpoints", str(saved), "data")
    assert sorted(os.listdir(data))[-2:] == ["process_0-of-2.json", "process_1-of-2.json"]
    out = _train(workdir, STEPS, processes=2)
    assert f"starting at step {saved} of {STEPS}" in out
    _assert_same_training(workdir, single_process, STEPS)
