"""zoo.train.hosts.coordinator_watch, the companion that names a lost coordinator: run as the real
script with this test as its process, a pipe on its stdin and a coordinator address that
refuses (the service gone) or accepts (alive)."""

import socket
import subprocess
import sys

import pytest

from tests.train import multihost
from zoo.train.hosts import coordinator_watch

LINE = "error: lost process 0 of 4 (the coordinator): process 2 "


def _companion(address):
    return subprocess.Popen([sys.executable, coordinator_watch.__file__, address, "2", "4"],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc):
    # (communicate() would flush the stdin closed above; the one line fits the pipe.)
    proc.wait(timeout=30)
    return proc.stderr.read()


@pytest.fixture
def listening():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield f"127.0.0.1:{server.getsockname()[1]}"


def test_a_process_gone_with_its_coordinator_gets_the_line():
    proc = _companion(f"127.0.0.1:{multihost.free_port()}")  # nothing listens there
    proc.stdin.close()  # the process ended without a word (aborted, killed)
    err = _finish(proc)
    assert LINE in err and "127.0.0.1" in err, err
    assert err.count("\n") == 1, err


def test_a_process_gone_while_its_coordinator_lives_gets_none(listening):
    proc = _companion(listening)
    proc.stdin.close()  # it died for a reason of its own: its log says which
    err = _finish(proc)
    assert err == ""


def test_a_process_that_exits_on_its_own_terms_gets_none():
    proc = _companion(f"127.0.0.1:{multihost.free_port()}")
    proc.stdin.write(coordinator_watch.EXITING.decode())
    proc.stdin.close()  # then process 0 leaves last and its service with it: expected
    err = _finish(proc)
    assert err == ""


def test_unreachable_names_why(listening):
    assert coordinator_watch.unreachable(listening) is None
    assert coordinator_watch.unreachable(f"127.0.0.1:{multihost.free_port()}")
