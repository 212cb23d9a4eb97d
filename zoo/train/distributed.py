"""Multi-host start-up: join the other processes before any device is touched."""

import os

import jax


def _detected() -> bool:
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        return True  # explicit: JAX_COORDINATOR_ADDRESS + JAX_NUM_PROCESSES + JAX_PROCESS_ID
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1:
        return True
    # A TPU pod slice lists every worker; a single-host TPU VM lists one.
    return "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")


def initialize() -> None:
    """Calls jax.distributed.initialize() when this process is one of several.

    JAX detects SLURM and TPU pods itself; elsewhere set JAX_COORDINATOR_ADDRESS (host:port of
    process 0), JAX_NUM_PROCESSES and JAX_PROCESS_ID.
    """
    if not _detected():
        return
    num = os.environ.get("JAX_NUM_PROCESSES")
    pid = os.environ.get("JAX_PROCESS_ID")
    jax.distributed.initialize(
        num_processes=int(num) if num else None, process_id=int(pid) if pid else None
    )
