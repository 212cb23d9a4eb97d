"""Joining a cluster (zoo.train.hosts.distributed: JAX's detection, zoo's decision for SLURM): a
2-worker Cloud TPU VM slice, simulated by one GCE metadata server per worker on 127.0.0.1, and (in
the acceptance tier) a 2-task SLURM job. Their train.py processes pretrain tiny BERT as one process
on the same 4 devices would; a preemption notice to one TPU worker makes both save the same step,
and the rerun finishes like the uninterrupted run. A lone process starts no coordination service."""

import http.server
import os
import threading

import jax
import ml_collections
import pytest

from tests.train import multihost
from zoo.train.hosts import distributed, lost_hosts

STEPS, EVERY = 12, 4
# A dozen steps of tiny BERT cost less than compiling them: -O0 code generation for every run
# here (each compared only with runs compiled the same way).
FAST = True
DEVICES = 4  # 1 process x 4 devices, or 2 processes x 2
LAUNCHER = os.path.join(multihost.ROOT, "tests", "train", "tpu_vm_launcher.py")
METADATA_PATH = "/computeMetadata/v1/instance/attributes/"


class MetadataServer:
    """One TPU VM worker's GCE metadata server: the attributes JAX's GceTpuCluster reads (this
    worker's number, the slice's worker endpoints, the TPU environment), 404 for the rest, and
    only for requests carrying the Metadata-Flavor header, as GCE's."""

    def __init__(self, worker: int, workers: int):
        endpoints = ",".join(f"{i}:8470:127.0.0.1" for i in range(workers))
        self.attributes = {"agent-worker-number": str(worker),
                           "worker-network-endpoints": endpoints, "tpu-env": ""}
        self.asked = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                key = self.path.removeprefix(METADATA_PATH)
                server.asked.append(key)
                if (not self.path.startswith(METADATA_PATH) or key not in server.attributes
                        or self.headers.get("Metadata-Flavor") != "Google"):
                    self.send_response(404)
                    self.end_headers()
                    return
                body = server.attributes[key].encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def tpu_vm_slice():
    servers = [MetadataServer(worker, workers=2) for worker in range(2)]
    yield servers
    for server in servers:
        server.close()


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    """The reference: one process with all DEVICES devices."""
    workdir = str(tmp_path_factory.mktemp("single"))
    multihost.finish(multihost.launch(multihost.command(workdir, STEPS, EVERY, keep=STEPS),
                                      [multihost.base_env(DEVICES, FAST)]))
    return workdir


def _tpu_vm_workers(workdir, servers):
    # Each worker asks its own metadata server; the coordinator port is JAX's override of its
    # fixed TPU port (8482), so parallel tests cannot collide.
    port = str(multihost.free_port())
    envs = [dict(multihost.base_env(DEVICES // 2, FAST), GCE_METADATA_IP=server.address,
                 JAX_COORDINATOR_PORT=port) for server in servers]
    return multihost.launch(multihost.command(workdir, STEPS, EVERY, keep=STEPS,
                                              script=LAUNCHER), envs)


@pytest.mark.slow
def test_tpu_vm_workers_join_through_the_metadata_server_survive_a_notice_and_train_as_one(
        tpu_vm_slice, single_process, tmp_path):
    workdir = str(tmp_path / "slice")
    out = multihost.preempt_one_host(_tpu_vm_workers(workdir, tpu_vm_slice), workdir,
                                     after_steps=3)
    assert "parameters on mesh {'data': 4" in out  # one global mesh over both workers
    for server in tpu_vm_slice:  # JAX found the slice where a TPU VM publishes it
        assert {"agent-worker-number", "worker-network-endpoints"} <= set(server.asked)
    saved = int(out.split("SIGTERM: saved step ")[1].split()[0])
    assert saved < STEPS, "the run finished before the notice arrived"
    data = os.path.join(workdir, "checkpoints", str(saved), "data")
    assert sorted(os.listdir(data))[-2:] == ["process_0-of-2.json", "process_1-of-2.json"]
    out = multihost.finish(_tpu_vm_workers(workdir, tpu_vm_slice))
    assert f"starting at step {saved} of {STEPS}" in out
    multihost.assert_same_training(workdir, single_process, STEPS)


@pytest.mark.acceptance  # the same join through JAX's detection: the fast tier has the TPU VM
def test_slurm_tasks_join_and_train_as_one(single_process, tmp_path):
    workdir = str(tmp_path / "slurm")
    port = str(multihost.free_port())
    envs = [dict(multihost.base_env(DEVICES // 2, FAST), SLURM_JOB_ID="4242", SLURM_NTASKS="2",
                 SLURM_PROCID=str(task), SLURM_LOCALID=str(task),
                 SLURM_STEP_NODELIST="127.0.0.1", JAX_COORDINATOR_PORT=port)
            for task in range(2)]
    out = multihost.finish(multihost.launch(multihost.command(workdir, STEPS, EVERY,
                                                              keep=STEPS), envs))
    assert "parameters on mesh {'data': 4" in out
    multihost.assert_same_training(workdir, single_process, STEPS)


def test_a_lone_process_starts_no_coordination_service(monkeypatch):
    for key in multihost.CLUSTER_VARIABLES:
        monkeypatch.delenv(key, raising=False)
    started = []
    monkeypatch.setattr(jax.distributed, "initialize",
                        lambda *a, **k: started.append((a, k)))
    assert distributed.detect() is None
    distributed.initialize()
    # A one-task SLURM job is a cluster of one: detected, nothing started.
    for key, value in dict(SLURM_JOB_ID="1", SLURM_NTASKS="1", SLURM_PROCID="0",
                           SLURM_LOCALID="0", SLURM_STEP_NODELIST="node1").items():
        monkeypatch.setenv(key, value)
    assert distributed.detect() == ("SlurmCluster", 1)
    distributed.initialize()
    assert started == []
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    distributed.initialize()
    # zoo's decision for SLURM (tests/train/hosts/test_launch.py has the table): JAX's coordinator
    # port for job 1, one GPU per local task as JAX would (no tasks per node to check against),
    # and zoo's heartbeat timeout (zoo.train.hosts.lost_hosts).
    assert started == [((), dict(coordinator_address="node1:61441", num_processes=2,
                                 process_id=0, local_device_ids=[0],
                                 cluster_detection_method="deactivate",
                                 heartbeat_timeout_seconds=lost_hosts.DEFAULT_HEARTBEAT_TIMEOUT_S))]


@pytest.mark.parametrize("value", [1, 2.5, "30", True, -5])
def test_heartbeat_timeout_must_be_whole_seconds_of_at_least_2(value):
    from zoo.errors import ConfigError
    config = ml_collections.ConfigDict({"train": {"heartbeat_timeout_s": value}})
    with pytest.raises(ConfigError, match=r"config\.train\.heartbeat_timeout_s=.* must be"):
        lost_hosts.heartbeat_timeout(config)


def test_heartbeat_timeout_default_and_value():
    assert lost_hosts.heartbeat_timeout(None) == lost_hosts.DEFAULT_HEARTBEAT_TIMEOUT_S == 30
    config = ml_collections.ConfigDict({"train": {"heartbeat_timeout_s": 10}})
    assert lost_hosts.heartbeat_timeout(config) == 10


def test_lost_process_lines():
    line = lost_hosts.lost_process_message(
        "The following tasks are unhealthy (stopped sending heartbeats): 1,3", 0, 4)
    assert line.startswith("error: lost processes 1, 3 of 4: they sent the coordination "
                           "service no heartbeat for config.train.heartbeat_timeout_s; process "
                           "0 exits")
    line = lost_hosts.lost_process_message("UNAVAILABLE: Socket closed", 2, 4)
    assert line.startswith("error: lost process 0 of 4 (the coordinator): process 2 cannot "
                           "reach its coordination service (UNAVAILABLE: Socket closed)")
