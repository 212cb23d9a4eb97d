"""Multi-host start-up: join the other processes before any device is touched.

Which cluster this process belongs to is JAX's own decision (`jax._src.clusters`, the detection
`jax.distributed.initialize()` runs with no arguments): a Cloud TPU VM slice (its workers read
from the GCE metadata server), a GKE TPU job (TPU_WORKER_HOSTNAMES), SLURM, Open MPI,
Kubernetes, or an explicit coordinator (JAX_COORDINATOR_ADDRESS + JAX_NUM_PROCESSES +
JAX_PROCESS_ID). zoo asks the same detection only whether there are several processes, so a
lone process (a laptop, a single-host TPU VM, a one-task SLURM job) never starts a coordination
service. JAX keeps no public API for "which cluster am I in", hence the private module; the lock
pins the jax it was tested with (tests/train/test_cluster_join.py simulates a 2-worker TPU VM
slice and a 2-task SLURM job).
"""

import os

import jax


def detect() -> tuple[str, int] | None:
    """(the cluster JAX detects, its process count), or None when none is detected."""
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        count = os.environ.get("JAX_NUM_PROCESSES")
        return "explicit coordinator", int(count) if count else 0
    from jax._src import clusters  # JAX's detection (see the module docstring)

    for env in clusters.ClusterEnv._cluster_types:
        # Opt-in environments (mpi4py) are only used when asked for by name, as in JAX.
        if not env.opt_in_only_method and env.is_env_present():
            return env.__name__, env.get_process_count()
    return None


def initialize() -> None:
    """Calls jax.distributed.initialize() when this process is one of several."""
    found = detect()
    if found is None or found[1] == 1:
        return
    if found[0] == "explicit coordinator":
        count, index = os.environ.get("JAX_NUM_PROCESSES"), os.environ.get("JAX_PROCESS_ID")
        jax.distributed.initialize(num_processes=int(count) if count else None,
                                   process_id=int(index) if index else None)
        return
    jax.distributed.initialize()  # coordinator, count and index from the same detection
