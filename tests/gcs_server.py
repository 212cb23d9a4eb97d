"""A real GCS JSON-API server on 127.0.0.1 for tests of gs:// paths (gcp-storage-emulator).

It runs as a child process, not a thread in the test process: the training processes a test
starts (train.py, eval.py) and SIGKILLs talk to it too, and a server inside the pytest worker
would compete with the worker's own Python for the GIL. Its objects live in a directory on disk,
so what a killed client wrote before it died is still there for the resumed one.

`env()` is what every client needs to find it, set in the tests' own environment by the
`gcs` fixture (tests/conftest.py) and passed on to the processes they start:
  STORAGE_EMULATOR_HOST            gcsfs (so etils.epath) and google-cloud-storage (tensorboardX)
  TENSORSTORE_GCS_HTTP_URL         tensorstore's gcs driver (so orbax's arrays)
  CLOUD_STORAGE_EMULATOR_ENDPOINT  google-cloud-cpp's storage client inside array_record (so
                                   TFDS array_record files in a bucket); without it the reader
                                   tries storage.googleapis.com and hangs offline
  GOOGLE_AUTH_TOKEN_FOR_TESTING    tensorstore sends this token instead of looking for Google
                                   credentials (none exist here; the emulator checks none)
  GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false
                                   gcsfs >= 2025.x asks the Storage Control gRPC API whether each
                                   bucket is hierarchical; the emulator has no such API, so every
                                   bucket would log a warning and fall back to the plain
                                   filesystem anyway. Read when gcsfs is imported.

One gap of the emulator is filled here (`_serve`): real GCS answers every object download with
x-goog-generation / x-goog-metageneration headers, and gcp-storage-emulator 2026.7.19 sends
neither. tensorstore takes the object's generation from that header; without it every read
looks like generation 0, and its next conditional write ("replace the version I read": how
OCDBT updates the manifest of an orbax checkpoint) fails with "Malformed StorageGeneration".
The emulator also ignores ifGenerationMatch preconditions, so what it proves is single-writer
behaviour, not GCS's protection against concurrent writers.

A polite local server hides what costs time and fails on a real bucket, so it can misbehave on
request (tests/gcs_behaviour.py has the details): `latency(s)` delays every request, `fail(...)`
answers the next requests matching a pattern with an HTTP error, a reset connection, a body cut
short; `requests(since=mark())` reads the request log (method, op, object, range, status, bytes).
Listings come in pages of at most 1,000 entries, as GCS sends them. The knobs are server-wide:
the `gcs_knobs` fixture (tests/conftest.py) puts them back after each test.
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

    def __init__(self, data_dir: str, port: int | None = None, latency_s: float = 0.0):
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.request_log = os.path.join(data_dir, "requests.jsonl")
        self._log = open(os.path.join(data_dir, "server.log"), "w")
        self._proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "-d", os.path.join(data_dir, "root"),
             "start", "--host", "127.0.0.1", "--port", str(self.port), "--quiet"],
            stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, "ZOO_GCS_REQUEST_LOG": self.request_log,
                 "ZOO_GCS_LATENCY_S": str(latency_s)})
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
                "CLOUD_STORAGE_EMULATOR_ENDPOINT": self.endpoint,
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

    # -- misbehaving on request (tests/gcs_behaviour.py) --

    def latency(self, seconds: float) -> None:
        """Every request from now on waits `seconds` before it is served."""
        self._control("POST", "latency", {"seconds": seconds})

    def fail(self, fault: int | str = 503, count: int = 1, *, object: str | None = None,
             method: str | None = None, op: str | None = None) -> None:
        """The next `count` requests matching `object` (a glob over the object name, e.g.
        '*/shard-*.json'), `method` ('GET', 'POST', ...) and `op` ('list', 'read', 'stat',
        'write', 'delete', ...) get `fault`: an HTTP error status, 'reset' (connection closed
        before any answer), 'drop' (closed after half the body), 'truncate' (half the body,
        with a matching Content-Length) or 'silent' (never answered). Rules are consumed in
        the order given."""
        self._control("POST", "faults", {"fault": fault, "count": count, "object": object,
                                         "method": method, "op": op})

    def state(self) -> dict:
        """{"latency_s", "faults": the rules with their remaining counts, "requests": served}"""
        return self._control("GET", "state")

    def reset_behaviour(self) -> None:
        """No latency, no pending faults."""
        self._control("DELETE", "faults")
        self._control("POST", "latency", {"seconds": 0})

    def mark(self) -> int:
        """A position in the request log, for `requests(since=...)`."""
        return self.state()["requests"]

    def requests(self, since: int = 0) -> list[dict]:
        """The logged requests after `since` (each: seq, t, method, op, bucket, object, prefix,
        range, status, bytes, fault)."""
        with open(self.request_log) as f:
            lines = [json.loads(line) for line in f if line.endswith("\n")]
        return [r for r in lines if r["seq"] > since]

    def _control(self, method: str, name: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(
            f"{self.endpoint}/_zoo/{name}", method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as e:
            raise ValueError(json.loads(e.read())["error"]) from None

    def stop(self):
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()


def _serve(argv: list[str]) -> None:
    """The emulator's own command line, with downloads that carry the generation headers and
    the knobs of tests/gcs_behaviour.py."""
    import gcs_behaviour  # this script's own directory is on sys.path
    from gcp_storage_emulator.handlers import objects

    download = objects.download

    def download_with_generation(request, response, storage, *args, **kwargs):
        download(request, response, storage, *args, **kwargs)
        if response.status.value < 300:
            obj = storage.get_file_obj(request.params["bucket_name"],
                                       request.params["object_id"])
            response["x-goog-generation"] = str(obj["generation"])
            response["x-goog-metageneration"] = str(obj["metageneration"])

    # Before the server module is imported: its routing table holds the function itself.
    objects.download = download_with_generation
    gcs_behaviour.install(gcs_behaviour.from_environment())
    from gcp_storage_emulator.__main__ import main

    main(argv)


if __name__ == "__main__":
    _serve(sys.argv[1:])
