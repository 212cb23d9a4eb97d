"""Multi-host start-up: join the other processes before any device is touched.

GPU launchers (SLURM's srun, Open MPI's mpirun) and an explicit coordinator are zoo's decision,
`launch(environment)`, a pure function with a decision table in tests/train/hosts/test_launch.py:
JAX's own detection (`jax._src.clusters`) fills `local_device_ids` with `[SLURM_LOCALID]` /
`[OMPI_COMM_WORLD_LOCAL_RANK]`, GPU ordinals counted *after* CUDA_VISIBLE_DEVICES. That is
right only when every task of a node sees all the node's GPUs. Where SLURM gives each task its
own GPU (`--gpus-per-task=1` binds CUDA_VISIBLE_DEVICES per task), task 3 would ask for device 3
of the one it sees; with one task per node only GPU 0 would be used. zoo decides which of the
GPUs a process sees it uses, and computes the coordinator (the same address and port JAX's
detection derives), count and index itself, then calls `jax.distributed.initialize` with
`cluster_detection_method="deactivate"`. JAX_COORDINATOR_ADDRESS, JAX_COORDINATOR_PORT,
JAX_NUM_PROCESSES, JAX_PROCESS_ID and JAX_LOCAL_DEVICE_IDS win over the launcher's values (JAX
0.10 itself reads only the address, the port and the device ids: the count and index are
zoo's).

Everything else stays JAX's decision (`jax.distributed.initialize()` with no arguments): a
Cloud TPU VM slice (its workers read from the GCE metadata server), a GKE TPU job
(TPU_WORKER_HOSTNAMES), Kubernetes. zoo asks that detection only whether there are several
processes, so a lone process (a laptop, a single-host TPU VM, a one-task SLURM job) never starts
a coordination service. JAX keeps no public API for "which cluster am I in", hence the private
module; the lock pins the jax it was tested with (tests/train/hosts/test_cluster_join.py simulates a
2-worker TPU VM slice and a 2-task SLURM job).

Once joined, a process that dies stops the others within config.train.heartbeat_timeout_s and
a few seconds, with one line naming it (zoo.train.hosts.lost_hosts).
"""

import os
import re
from collections.abc import Mapping

from zoo import errors
from zoo.train.hosts import lost_hosts

# JAX's ports when none is given: the ephemeral range [61440, 65535], picked from the job id.
_PORT_BASE, _PORT_SPAN = 65536 - 2**12, 2**12
_SLURM = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
ALL_VISIBLE = None  # local_device_ids: every GPU the process sees


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise errors.LaunchError(f"{key}={env[key]!r} is not a whole number") from None


def _visible(env: Mapping[str, str]) -> list[str] | None:
    """The GPUs CUDA_VISIBLE_DEVICES lets this process see; None when it is unset (all)."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    value = value.strip()
    if value in ("", "NoDevFiles", "-1"):  # SLURM's "no GPU" and CUDA's "none"
        return []
    return [v.strip() for v in value.split(",")]


def _tasks_per_node(env: Mapping[str, str]) -> int | None:
    """SLURM's tasks on this node ('8(x2)', '4,4' or, uneven, '8,4': SLURM_NODEID picks this
    node's count)."""
    value = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if not value:
        return None
    counts = []
    for part in value.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise errors.LaunchError(f"SLURM_STEP_TASKS_PER_NODE={value!r} is not SLURM's format")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    if len(set(counts)) == 1:
        return counts[0]
    # Uneven nodes (srun --ntasks=12 over two 8-GPU nodes gives '8,4'): this node's own count.
    node = _int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else None
    if node is None or not 0 <= node < len(counts):
        raise errors.LaunchError(
            f"SLURM_STEP_TASKS_PER_NODE={value!r}: nodes run different numbers of tasks and "
            f"SLURM_NODEID={env.get('SLURM_NODEID')!r} does not say which node this is; start "
            "train.py with srun, or the same number of tasks on every node "
            "(srun --ntasks-per-node=...)")
    return counts[node]


def _slurm_coordinator(env: Mapping[str, str]) -> str:
    # The first host of SLURM_STEP_NODELIST ('node[001-016],gpu7' -> 'node001'), as JAX's
    # SlurmCluster reads it.
    nodes = env["SLURM_STEP_NODELIST"]
    head = re.match(r"[^,\[]*", nodes).group(0)
    if nodes[len(head):len(head) + 1] == "[":
        head += re.match(r"[^,\-\]]*", nodes[len(head) + 1:]).group(0)
    port = env.get("JAX_COORDINATOR_PORT") or str(
        _int(env, "SLURM_JOB_ID") % _PORT_SPAN + _PORT_BASE)
    return f"{head}:{port}"


def _ompi_coordinator(env: Mapping[str, str]) -> str:
    # mpirun's own address from OMPI_MCA_orte_hnp_uri ('1531576320.0;tcp://10.0.0.1,...:34911'),
    # as JAX's OmpiCluster reads it. Open MPI 5 (PRRTE) no longer sets it.
    uri = env.get("OMPI_MCA_orte_hnp_uri")
    if uri is None:
        raise errors.LaunchError(
            "OMPI_COMM_WORLD_SIZE is set but OMPI_MCA_orte_hnp_uri is not (Open MPI 5 launches "
            "through PRRTE), so no coordinator can be derived: set "
            "JAX_COORDINATOR_ADDRESS=<rank 0's host>:<free port> for every rank (mpirun -x)")
    found = re.search(r"tcp://(.+?)[,:]|tcp6://\[(.+?)[,\]]", uri)
    if found is None:
        raise errors.LaunchError(f"OMPI_MCA_orte_hnp_uri={uri!r} names no TCP address: set "
                                 "JAX_COORDINATOR_ADDRESS=<rank 0's host>:<free port>")
    port = env.get("JAX_COORDINATOR_PORT") or str(
        int(uri.split(".", 1)[0]) // 2**12 % _PORT_SPAN + _PORT_BASE)
    return f"{found.group(1) or found.group(2)}:{port}"


def _local_devices(env: Mapping[str, str], launcher: str, local: int | None,
                   per_node: int | None) -> list[int] | None:
    """Which of the GPUs this process sees it uses (ordinals after CUDA_VISIBLE_DEVICES)."""
    if env.get("JAX_LOCAL_DEVICE_IDS"):  # the user's word, as in JAX
        return [_int({"JAX_LOCAL_DEVICE_IDS": i}, "JAX_LOCAL_DEVICE_IDS")
                for i in env["JAX_LOCAL_DEVICE_IDS"].split(",")]
    visible = _visible(env)
    if local is None or visible == []:  # explicit coordinator; or no GPU at all (a CPU run)
        return ALL_VISIBLE
    if launcher == "SLURM" and env.get("SLURM_GPUS_PER_TASK") and visible is not None:
        # srun --gpus-per-task=N: SLURM binds each task to its own N GPUs (CUDA_VISIBLE_DEVICES
        # and, from gres_common.c, SLURM_STEP_GPUS are the task's own), so the task drives
        # every GPU it sees, however many tasks share the node.
        return ALL_VISIBLE
    # The step's GPUs on this node, when SLURM allocated them (--gpus-*, --gres=gpu:N).
    step = env.get("SLURM_STEP_GPUS") if launcher == "SLURM" else None
    step_count = len(step.split(",")) if step else None
    names = (f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}" if visible is not None
             else "CUDA_VISIBLE_DEVICES unset")
    if visible is not None and step_count and len(visible) < step_count:
        # This task sees a share of the node's GPUs: its own (--gpus-per-task), all of them.
        if len(visible) * per_node == step_count:
            return ALL_VISIBLE
        raise errors.LaunchError(
            f"{per_node} task(s) on this node see {len(visible)} GPU(s) each ({names}) of the "
            f"step's {step_count} (SLURM_STEP_GPUS={step}): GPUs would sit idle. Leave "
            "CUDA_VISIBLE_DEVICES to SLURM and launch one task per GPU (srun "
            "--ntasks-per-node=<GPUs> --gpus-per-task=1) or one per node (srun "
            "--ntasks-per-node=1 --gpus-per-node=<GPUs>)")
    if visible is not None and len(visible) == 1:
        return ALL_VISIBLE  # its one GPU, whatever its local rank (JAX would ask for [local])
    if per_node is None:
        if visible is None:
            return [local]  # nothing to check against: JAX's guess, one GPU per local rank
        raise errors.LaunchError(
            f"task {local} on this node sees {len(visible)} GPUs ({names}) and "
            "the tasks per node are not set (SLURM_STEP_TASKS_PER_NODE, "
            "OMPI_COMM_WORLD_LOCAL_SIZE), so zoo cannot tell how to share them: start train.py "
            "with srun or mpirun, not directly in the batch script")
    if per_node == 1:
        return ALL_VISIBLE  # one task per node drives all its GPUs (JAX would take GPU 0)
    if visible is None or len(visible) == per_node:
        return [local]  # every task sees the node's GPUs: one each, by local rank (as JAX)
    count = "OMPI_COMM_WORLD_LOCAL_SIZE" if launcher == "Open MPI" else "SLURM_STEP_TASKS_PER_NODE"
    raise errors.LaunchError(
        f"{per_node} tasks on this node ({count}) each see {len(visible)} GPUs ({names}): zoo "
        "runs one task per GPU or one task per node. Launch as many tasks per node as it has "
        "GPUs, or one, or give each task its own GPU (srun --gpus-per-task=1)")


def launch(env: Mapping[str, str]) -> tuple[str, dict | None] | None:
    """(launcher, jax.distributed.initialize keyword arguments) for an Open MPI or SLURM launch
    or an explicit coordinator; the arguments are None for a lone process (nothing to join).
    None when the environment is none of these: JAX's own detection decides (TPU, Kubernetes).

    Raises zoo.errors.LaunchError for a layout that would leave GPUs idle or ask for a GPU the
    process cannot see, naming the variables and what to do."""
    local = per_node = None
    if "OMPI_COMM_WORLD_SIZE" in env:  # mpirun / mpiexec (JAX, too, puts it before SLURM)
        launcher = "Open MPI"
        count, index = _int(env, "OMPI_COMM_WORLD_SIZE"), _int(env, "OMPI_COMM_WORLD_RANK")
        local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK")
        per_node = (_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE")
                    if "OMPI_COMM_WORLD_LOCAL_SIZE" in env else None)
    elif all(key in env for key in _SLURM):  # JAX's test for a SLURM step
        launcher = "SLURM"
        count, index = _int(env, "SLURM_NTASKS"), _int(env, "SLURM_PROCID")
        local = _int(env, "SLURM_LOCALID")
    elif env.get("JAX_COORDINATOR_ADDRESS") and env.get("JAX_NUM_PROCESSES") and env.get(
            "JAX_PROCESS_ID"):
        launcher, count, index = "explicit coordinator", None, None
    else:
        return None
    count = _int(env, "JAX_NUM_PROCESSES") if env.get("JAX_NUM_PROCESSES") else count
    index = _int(env, "JAX_PROCESS_ID") if env.get("JAX_PROCESS_ID") else index
    if count == 1:
        return launcher, None
    if not 0 <= index < count:
        raise errors.LaunchError(f"process index {index} is not below the process count {count}"
                                 f" ({launcher})")
    if launcher == "SLURM":
        per_node = _tasks_per_node(env)
    address = env.get("JAX_COORDINATOR_ADDRESS") or (
        _slurm_coordinator(env) if launcher == "SLURM" else _ompi_coordinator(env))
    return launcher, dict(coordinator_address=address, num_processes=count, process_id=index,
                          local_device_ids=_local_devices(env, launcher, local, per_node),
                          cluster_detection_method="deactivate")


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


def initialize(config=None) -> None:
    """Joins the other processes when this process is one of several: jax.distributed.initialize
    with config.train.heartbeat_timeout_s, through zoo.train.hosts.lost_hosts (which reports a
    process that dies)."""
    timeout = lost_hosts.heartbeat_timeout(config)  # a bad value is refused on one process too
    planned = launch(os.environ)
    if planned is not None:
        if planned[1] is not None:
            lost_hosts.join(timeout, planned[1])
        return
    found = detect()
    if found is None or found[1] == 1:
        return
    kwargs = {}
    if found[0] == "explicit coordinator":  # an address, count or index missing: JAX's guess
        count, index = os.environ.get("JAX_NUM_PROCESSES"), os.environ.get("JAX_PROCESS_ID")
        kwargs = dict(num_processes=int(count) if count else None,
                      process_id=int(index) if index else None)
    lost_hosts.join(timeout, kwargs)  # else coordinator, count and index from the detection
