"""Tiny BERT pretraining as several real train.py processes on this machine's CPU, and the
checks that they trained as one process would: shared by test_multihost.py (an explicit
coordinator) and test_cluster_join.py (clusters JAX detects by itself)."""

import json
import os
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

from tests.numerics import assert_params_close
from tests.process_env import process_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What a test's environment must not leak into a simulated cluster's processes.
CLUSTER_VARIABLES = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
                     "JAX_COORDINATOR_PORT", "GCE_METADATA_IP", "TPU_SKIP_MDS_QUERY",
                     "TPU_WORKER_HOSTNAMES", "TPU_WORKER_ID", "SLURM_JOB_ID", "SLURM_NTASKS",
                     "SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NODELIST",
                     "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_GPUS",
                     "OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
                     "JAX_LOCAL_DEVICE_IDS")


def command(workdir, steps: int, every: int, keep: int, script=None) -> list[str]:
    """train.py (or the launcher `script`) pretraining tiny BERT for `steps` steps, eval and a
    checkpoint every `every`, `keep` checkpoints kept."""
    return [
        sys.executable, script or os.path.join(ROOT, "train.py"),
        "--config=configs/bert_pretrain.py:size=tiny", f"--workdir={workdir}",
        "--config.data.synthetic_entities=100", "--config.data.vocab_size=256",
        "--config.data.seq_len=32", "--config.data.max_predictions_per_seq=5",
        "--config.data.batch_size=8", "--config.data.eval_batch_size=8",
        "--config.data.dupe_factor=1", f"--config.train.steps={steps}",
        "--config.train.log_every=1", f"--config.train.eval_every={every}",
        f"--config.train.checkpoint_every={every}", f"--config.train.keep_checkpoints={keep}",
        "--config.train.tensorboard=false",
    ]


def base_env(devices_per_process: int, fast_compile: bool = False) -> dict:
    """This environment on the CPU with that many fake devices, and no cluster variables.
    `fast_compile`: LLVM -O0 code generation (as the fast tier's in-process tests; see
    tests/conftest.py), for runs whose few steps cost less than compiling them."""
    env = process_env(devices_per_process)
    if fast_compile and "--xla_backend_optimization_level" not in env["XLA_FLAGS"]:
        env["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
    for key in CLUSTER_VARIABLES:
        env.pop(key, None)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv: list[str], envs: list[dict]) -> list[subprocess.Popen]:
    """One process per environment, each running `argv` from the repository root."""
    return [subprocess.Popen(argv, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE) for env in envs]


def kill_all(procs) -> None:
    """SIGKILLs every process still running and reaps it: one that failed leaves the others
    waiting on collectives for minutes."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def finish(procs, timeout: float = 400) -> str:
    """Waits for every process; each must exit 0. Returns process 0's stdout."""
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout))
    finally:
        kill_all(procs)
    failures = [failure(index, proc.returncode, err)
                for index, (proc, (_, err)) in enumerate(zip(procs, outputs))
                if proc.returncode != 0]
    # Every process's account: the one that aborted is often not the one that went wrong.
    assert not failures, "\n\n".join(
        failures + [f"process {i} stdout tail:\n{out[-800:]}" for i, (out, _) in
                    enumerate(outputs)])
    return outputs[0][0]


def failure(index, code, err) -> str:
    # An abort's thread dump buries its cause (a barrier timeout, a peer that left): keep the
    # lines that are not stack frames.
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith("  ")
             and "Gloo" not in x and not x.startswith("Thread 0x")]
    return f"process {index} exited {code}:\n" + "\n".join(lines[-40:])


def preempt_one_host(procs, workdir, after_steps: int, deadline_s: float = 300) -> str:
    """Sends SIGTERM to the last process once `after_steps` steps are logged, then waits for
    all (each must exit 0). Returns process 0's stdout."""
    metrics = os.path.join(workdir, "metrics.jsonl")
    deadline = time.time() + deadline_s
    while not (os.path.exists(metrics) and len(open(metrics).readlines()) >= after_steps):
        for index, proc in enumerate(procs):
            if proc.poll() is not None:
                kill_all(procs)
                pytest.fail("before the notice, " + failure(index, proc.returncode,
                                                            proc.stderr.read()))
        assert time.time() < deadline, f"no {after_steps} steps logged in {deadline_s} s"
        time.sleep(0.05)
    procs[-1].send_signal(signal.SIGTERM)  # the notice reaches one host only
    return finish(procs)


def records(workdir, split) -> dict[int, dict]:
    # A step logged twice (before and after a resume) keeps its last value.
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return {r["step"]: r for r in map(json.loads, f) if r["split"] == split}


def params(workdir, step):
    """The saved params as host numpy arrays (the checkpoint's device layout is not ours)."""
    directory = os.path.join(workdir, "checkpoints", str(step), "state")
    saved = ocp.StandardCheckpointHandler().metadata(epath.Path(directory)).tree["params"]
    target = jax.tree.map(lambda m: np.zeros(m.shape, m.dtype), saved)
    restored = ocp.PyTreeCheckpointer().restore(directory, args=ocp.args.PyTreeRestore(
        item={"params": target},
        restore_args=ocp.checkpoint_utils.construct_restore_args({"params": target}),
        partial_restore=True))
    return restored["params"]


def assert_same_training(got, expected, steps: int) -> None:
    """Losses of every step, the final eval and the final params of run `got` equal run
    `expected`'s (to the rounding of another reduction order)."""
    train_got, train_expected = records(got, "train"), records(expected, "train")
    assert sorted(train_got) == list(range(1, steps + 1))
    # Cross-process reductions (gloo) add in another order than one process's: float rounding.
    np.testing.assert_allclose([train_got[s]["loss"] for s in range(1, steps + 1)],
                               [train_expected[s]["loss"] for s in range(1, steps + 1)],
                               rtol=1e-5)
    eval_got, eval_expected = records(got, "eval"), records(expected, "eval")
    assert eval_got[steps]["mlm_loss"] == pytest.approx(eval_expected[steps]["mlm_loss"],
                                                        rel=1e-5)
    params_got, params_expected = params(got, steps), params(expected, steps)
    assert flat(params_got).keys() == flat(params_expected).keys()
    # Parameters whose true gradient is 0 (attention key biases) move by Adam steps on rounding
    # noise, damped by eps=1e-6 to ~lr * 1e-3 per step, ~1e-5 over 20 steps at most: those are
    # measured against the largest parameter (tests/numerics.py: assert_params_close).
    assert_params_close(params_got, params_expected, 1e-4)


def flat(tree, prefix=""):
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in flat(sub, f"{prefix}/{key}").items()}
    return {prefix: np.asarray(tree)}
