"""Every GPU launch shape as a decision table: the environment srun / mpirun / the user set ->
the jax.distributed.initialize arguments zoo passes (zoo.train.hosts.distributed.launch). On CPU,
local_device_ids changes nothing, so the table is the test. Outside judges: JAX's own detection,
run on the same environment, gives the same coordinator, count and index, and the same
local_device_ids wherever zoo does not override it; where zoo does, the row says why JAX is
wrong (it counts GPUs as if every task saw the whole node)."""

import os

import jax
import pytest

from zoo import errors
from zoo.train.hosts import distributed, lost_hosts

ALL = distributed.ALL_VISIBLE
EIGHT = "0,1,2,3,4,5,6,7"
# Two 8-GPU nodes; this is task 11: node 1, local task 3.
SLURM = dict(SLURM_JOB_ID="4242", SLURM_STEP_NODELIST="gpu[07-08]", SLURM_NTASKS="16",
             SLURM_PROCID="11", SLURM_LOCALID="3", SLURM_NODEID="1",
             SLURM_STEP_TASKS_PER_NODE="8(x2)")
# One task per node: task 1 on node 1.
SLURM_NODE = dict(SLURM, SLURM_NTASKS="2", SLURM_PROCID="1", SLURM_LOCALID="0",
                  SLURM_STEP_TASKS_PER_NODE="1(x2)")
# Open MPI 4 (ORTE): mpirun's address and job id.
ORTE = "1531576320.0;tcp://10.1.0.7,10.148.0.1:34911"
OMPI = dict(OMPI_MCA_orte_hnp_uri=ORTE, OMPI_COMM_WORLD_SIZE="16", OMPI_COMM_WORLD_RANK="11",
            OMPI_COMM_WORLD_LOCAL_RANK="3", OMPI_COMM_WORLD_LOCAL_SIZE="8")
EXPLICIT = dict(JAX_COORDINATOR_ADDRESS="10.1.0.7:1234", JAX_NUM_PROCESSES="2",
                JAX_PROCESS_ID="1")

# (launch shape, environment, (coordinator, count, index), local_device_ids, JAX's guess)
TABLE = [
    ("srun --ntasks-per-node=8 --gpus-per-task=1: SLURM binds each task to its GPU",
     dict(SLURM, CUDA_VISIBLE_DEVICES="3", SLURM_STEP_GPUS=EIGHT),
     ("gpu07:61586", 16, 11), ALL, [3]),
    ("the same, SLURM_STEP_GPUS not set (an older SLURM)",
     dict(SLURM, CUDA_VISIBLE_DEVICES="3"), ("gpu07:61586", 16, 11), ALL, [3]),
    ("srun --ntasks-per-node=8 --gpus-per-node=8: every task sees the node's 8",
     dict(SLURM, CUDA_VISIBLE_DEVICES=EIGHT, SLURM_STEP_GPUS=EIGHT),
     ("gpu07:61586", 16, 11), [3], [3]),
    ("srun --ntasks-per-node=8, no GPU allocation (CUDA_VISIBLE_DEVICES unset)",
     SLURM, ("gpu07:61586", 16, 11), [3], [3]),
    ("srun --ntasks-per-node=1 --gpus-per-node=8: one task drives its node's 8",
     dict(SLURM_NODE, CUDA_VISIBLE_DEVICES=EIGHT, SLURM_STEP_GPUS=EIGHT),
     ("gpu07:61586", 2, 1), ALL, [0]),
    ("srun --ntasks-per-node=1, no GPU allocation",
     SLURM_NODE, ("gpu07:61586", 2, 1), ALL, [0]),
    ("srun --ntasks-per-node=2 --gpus-per-task=4: each task its own 4",
     dict(SLURM, SLURM_NTASKS="4", SLURM_PROCID="3", SLURM_LOCALID="1",
          SLURM_STEP_TASKS_PER_NODE="2(x2)", CUDA_VISIBLE_DEVICES="4,5,6,7",
          SLURM_STEP_GPUS=EIGHT), ("gpu07:61586", 4, 3), ALL, [1]),
    # What SLURM really sets under per-task binding (gres_common.c: SLURM_STEP_GPUS is the
    # task's own GPUs; srun exports SLURM_GPUS_PER_TASK).
    ("srun --ntasks-per-node=2 --gpus-per-task=4, SLURM's own task environment",
     dict(SLURM, SLURM_NTASKS="4", SLURM_PROCID="3", SLURM_LOCALID="1",
          SLURM_STEP_TASKS_PER_NODE="2(x2)", CUDA_VISIBLE_DEVICES="4,5,6,7",
          SLURM_STEP_GPUS="4,5,6,7", SLURM_GPUS_PER_TASK="4"), ("gpu07:61586", 4, 3), ALL, [1]),
    ("srun --ntasks-per-node=2 --gpus-per-task=2 on 4-GPU nodes: as many GPUs as tasks",
     dict(SLURM, SLURM_NTASKS="4", SLURM_PROCID="3", SLURM_LOCALID="1",
          SLURM_STEP_TASKS_PER_NODE="2(x2)", CUDA_VISIBLE_DEVICES="2,3",
          SLURM_STEP_GPUS="2,3", SLURM_GPUS_PER_TASK="2"), ("gpu07:61586", 4, 3), ALL, [1]),
    ("srun --ntasks-per-node=8 --gpus-per-task=1, SLURM's own task environment",
     dict(SLURM, CUDA_VISIBLE_DEVICES="3", SLURM_STEP_GPUS="3", SLURM_GPUS_PER_TASK="1"),
     ("gpu07:61586", 16, 11), ALL, [3]),
    ("srun --ntasks=12 --gpus-per-task=1 over two 8-GPU nodes: 8 tasks, then 4",
     dict(SLURM, SLURM_NTASKS="12", SLURM_STEP_TASKS_PER_NODE="8,4", CUDA_VISIBLE_DEVICES="3",
          SLURM_STEP_GPUS="3", SLURM_GPUS_PER_TASK="1"), ("gpu07:61586", 12, 11), ALL, [3]),
    ("srun --ntasks=12 over two 8-GPU nodes, every task seeing its node's GPUs: one each",
     dict(SLURM, SLURM_NTASKS="12", SLURM_STEP_TASKS_PER_NODE="8,4"),
     ("gpu07:61586", 12, 11), [3], [3]),
    ("srun with JAX_COORDINATOR_PORT",
     dict(SLURM, CUDA_VISIBLE_DEVICES="3", JAX_COORDINATOR_PORT="7777"),
     ("gpu07:7777", 16, 11), ALL, [3]),
    ("mpirun -np 16 (Open MPI 4), 8 ranks a node, each sees the node's 8",
     OMPI, ("10.1.0.7:62624", 16, 11), [3], [3]),
    ("mpirun -np 2 --map-by ppr:1:node: one rank drives its node's 8",
     dict(OMPI, OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_RANK="1",
          OMPI_COMM_WORLD_LOCAL_RANK="0", OMPI_COMM_WORLD_LOCAL_SIZE="1"),
     ("10.1.0.7:62624", 2, 1), ALL, [0]),
    ("mpirun -np 16 with a wrapper setting CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK",
     dict(OMPI, CUDA_VISIBLE_DEVICES="3"), ("10.1.0.7:62624", 16, 11), ALL, [3]),
    ("mpirun -np 16 (Open MPI 5: no ORTE URI) with JAX_COORDINATOR_ADDRESS",
     dict({k: v for k, v in OMPI.items() if k != "OMPI_MCA_orte_hnp_uri"},
          JAX_COORDINATOR_ADDRESS="gpu07:1234"), ("gpu07:1234", 16, 11), [3], None),
    ("explicit coordinator, one process per node",
     EXPLICIT, ("10.1.0.7:1234", 2, 1), ALL, None),
    ("explicit coordinator with JAX_LOCAL_DEVICE_IDS",
     dict(EXPLICIT, JAX_LOCAL_DEVICE_IDS="2,3"), ("10.1.0.7:1234", 2, 1), [2, 3], [2, 3]),
    ("explicit coordinator inside srun: the address is the user's, the rest SLURM's",
     dict(SLURM, CUDA_VISIBLE_DEVICES="3", JAX_COORDINATOR_ADDRESS="10.1.0.7:1234"),
     ("10.1.0.7:1234", 16, 11), ALL, [3]),
]


def _jax_guess(env, monkeypatch):
    """What jax.distributed.initialize() would pick in `env` by itself."""
    from jax._src import clusters

    monkeypatch.setattr(os, "environ", dict(env))
    local = [int(i) for i in env["JAX_LOCAL_DEVICE_IDS"].split(",")] if env.get(
        "JAX_LOCAL_DEVICE_IDS") else None  # read by initialize before detection
    return clusters.ClusterEnv.auto_detect_unset_distributed_params(
        env.get("JAX_COORDINATOR_ADDRESS"), None, None, local, None, 300)


@pytest.mark.parametrize("shape, env, joined, local, jax_local", TABLE,
                         ids=[row[0] for row in TABLE])
def test_each_launch_shape_gets_the_gpus_its_process_sees(shape, env, joined, local, jax_local,
                                                          monkeypatch):
    launcher, kwargs = distributed.launch(env)
    assert (kwargs["coordinator_address"], kwargs["num_processes"],
            kwargs["process_id"]) == joined
    assert kwargs["local_device_ids"] == local
    assert kwargs["cluster_detection_method"] == "deactivate"  # JAX fills nothing in
    address, count, index, guess = _jax_guess(env, monkeypatch)
    assert guess == jax_local  # the row's claim about JAX, checked against JAX
    if count is not None:  # JAX detects this launcher: the same join
        assert (address, count, index) == joined
    else:  # the user's coordinator; or Open MPI 5, which JAX 0.10 does not detect at all
        assert launcher == "explicit coordinator" or "Open MPI 5" in shape


def test_a_lone_process_or_another_cluster_is_not_zoos_to_join():
    assert distributed.launch({}) is None  # a laptop; TPU VMs and Kubernetes: JAX decides
    assert distributed.launch(dict(SLURM, SLURM_NTASKS="1", SLURM_PROCID="0")) == ("SLURM", None)
    assert distributed.launch(dict(OMPI, OMPI_COMM_WORLD_SIZE="1", OMPI_COMM_WORLD_RANK="0")
                              ) == ("Open MPI", None)
    # An address without count and index is left to JAX's detection, as before.
    assert distributed.launch(dict(JAX_COORDINATOR_ADDRESS="h:1")) is None


@pytest.mark.parametrize("env, names", [
    # One task per node, but something narrowed CUDA_VISIBLE_DEVICES: 7 GPUs would sit idle.
    (dict(SLURM_NODE, CUDA_VISIBLE_DEVICES="0", SLURM_STEP_GPUS=EIGHT),
     ["CUDA_VISIBLE_DEVICES=0", "SLURM_STEP_GPUS=" + EIGHT, "--ntasks-per-node=1"]),
    # 2 tasks on a node both seeing all 8: JAX would take GPUs 0 and 1, leaving 6 idle.
    (dict(SLURM, SLURM_NTASKS="4", SLURM_PROCID="3", SLURM_LOCALID="1",
          SLURM_STEP_TASKS_PER_NODE="2(x2)", CUDA_VISIBLE_DEVICES=EIGHT),
     ["SLURM_STEP_TASKS_PER_NODE", "CUDA_VISIBLE_DEVICES=" + EIGHT, "--gpus-per-task=1"]),
    # 8 tasks a node, each seeing 4 GPUs.
    (dict(OMPI, CUDA_VISIBLE_DEVICES="0,1,2,3"),
     ["OMPI_COMM_WORLD_LOCAL_SIZE", "CUDA_VISIBLE_DEVICES=0,1,2,3"]),
    # Open MPI 5 (PRRTE) sets no OMPI_MCA_orte_hnp_uri: no coordinator to derive.
    ({k: v for k, v in OMPI.items() if k != "OMPI_MCA_orte_hnp_uri"},
     ["OMPI_MCA_orte_hnp_uri", "JAX_COORDINATOR_ADDRESS", "mpirun -x"]),
    # Several GPUs visible and the tasks per node unknown (python run in the batch script).
    (dict({k: v for k, v in SLURM.items() if k != "SLURM_STEP_TASKS_PER_NODE"},
          CUDA_VISIBLE_DEVICES=EIGHT), ["SLURM_STEP_TASKS_PER_NODE", "srun"]),
    (dict({k: v for k, v in SLURM.items() if k != "SLURM_NODEID"},
          SLURM_STEP_TASKS_PER_NODE="8,4"),
     ["SLURM_STEP_TASKS_PER_NODE='8,4'", "SLURM_NODEID=None"]),
    (dict(EXPLICIT, JAX_PROCESS_ID="2"), ["process index 2", "count 2"]),
], ids=["node-task-hidden-gpus", "2-tasks-share-8", "ranks-see-4", "open-mpi-5",
        "no-tasks-per-node", "uneven-nodes-unknown-node", "index-past-count"])
def test_a_layout_that_idles_or_misses_gpus_is_one_clear_error(env, names):
    with pytest.raises(errors.LaunchError) as raised:
        distributed.launch(env)
    for name in names:
        assert name in str(raised.value)


def test_initialize_passes_the_decision_to_jax(monkeypatch):
    started = []
    monkeypatch.setattr(jax.distributed, "initialize",
                        lambda *a, **k: started.append((a, k)))
    monkeypatch.setattr(os, "environ", dict(SLURM_NODE, CUDA_VISIBLE_DEVICES=EIGHT))
    distributed.initialize()
    assert started == [((), dict(coordinator_address="gpu07:61586", num_processes=2,
                                 process_id=1, local_device_ids=None,
                                 cluster_detection_method="deactivate",
                                 heartbeat_timeout_seconds=lost_hosts.DEFAULT_HEARTBEAT_TIMEOUT_S))]
