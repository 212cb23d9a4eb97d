"""A real GCS JSON-API server on 127.0.0.1 for tests of gs:// paths (gcp-storage-emulator).

It runs as a child process, not a thread in the test process: the training processes a test
starts (train.py, eval.py) and SIGKILLs talk to it too, and a server inside the pytest worker
would compete with the worker's own Python for the GIL. Its objects live in a directory on disk,
so what a killed client wrote before it died is still there for the resumed one.

`env()` is what every client needs to find it, set in the tests' own environment by the
`gcs` fixture (tests/conftest.py) and passed on to the processes they start:
  STORAGE_EMULATOR_HOST            gcsfs (so etils.epath) and google-cloud-storage (tensorboardX)
  TENSORSTORE_GCS_HTTP_URL         tensorstore's gcs driver (so orbax's arrays)
  GOOGLE_AUTH_TOKEN_FOR_TESTING    tensorstore sends this token instead of looking for Google
                                   credentials (none exist here; the emulator checks none)
  GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false
                                   gcsfs >= 2025.x asks the Storage Control gRPC API whether each
                                   bucket is hierarchical; the emulator has no such API, so every
                                   bucket would log a warning and fall back to the plain
                                   filesystem anyway. Read when gcsfs is imported.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GcsServer:
    """One emulator process; `bucket()` makes a fresh bucket, `stop()` ends it."""

    def __init__(self, data_dir: str, port: int | None = None):
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._log = open(os.path.join(data_dir, "server.log"), "w")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "gcp_storage_emulator", "-d", os.path.join(data_dir, "root"),
             "start", "--host", "127.0.0.1", "--port", str(self.port), "--quiet"],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.endpoint}/storage/v1/b?project=test",
                                            timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError):
                if self._proc.poll() is not None or time.time() > deadline:
                    self.stop()
                    with open(self._log.name) as f:
                        raise RuntimeError(f"the GCS emulator did not start:\n{f.read()}")
                time.sleep(0.1)

    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.endpoint,
                "TENSORSTORE_GCS_HTTP_URL": self.endpoint,
                "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
                "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}

    def bucket(self, prefix: str = "zoo") -> str:
        """Creates a new, empty bucket and returns its name (unique per call, so tests sharing
        one server never see each other's objects)."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project=test", method="POST",
            data=json.dumps({"name": name}).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10):
            pass
        return name

    def stop(self):
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()
