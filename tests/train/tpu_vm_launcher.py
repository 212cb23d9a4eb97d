"""train.py on a simulated Cloud TPU VM worker, for tests/train/hosts/test_cluster_join.py.

    python tests/train/tpu_vm_launcher.py <train.py flags>

JAX decides whether it runs on a TPU VM while importing itself: jax._src.cloud_tpu_init scans
the PCI bus for TPU chips and, finding one (with libtpu), sets `running_in_cloud_tpu_vm`;
finding none, it sets TPU_SKIP_MDS_QUERY so that no metadata server is ever asked. Only on a
TPU VM does its cluster detection then ask the GCE metadata server (GCE_METADATA_IP) for this
worker's number and the slice's workers. This box has no TPU chip, so the launcher stands in
for the chip scan's two results before train.py starts; everything after it (the metadata
queries, the coordinator address, the process count and index) is JAX's own code against the
test's local metadata server. The stand-in lives here, in the test harness, never in zoo/.
"""

import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jax._src.clusters import cloud_tpu_cluster  # noqa: E402  (imports jax: the scan runs)

os.environ.pop("TPU_SKIP_MDS_QUERY", None)
cloud_tpu_cluster.running_in_cloud_tpu_vm = True

if __name__ == "__main__":
    sys.argv = [os.path.join(ROOT, "train.py")] + sys.argv[1:]
    sys.path.insert(0, ROOT)
    runpy.run_path(sys.argv[0], run_name="__main__")
