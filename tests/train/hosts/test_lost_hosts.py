"""zoo.train.hosts.lost_hosts' exit paths, on two real jax.distributed processes with a 2 s
heartbeat timeout and no model (tests/train/lost_host_process.py): a survivor whose main thread ends
in a collective's error, or that C++ aborts (gloo; JAX's agent when the coordinator is lost), still
names the lost process and exits 1 within the heartbeat timeout; an abort after the exit barrier is
not held; and a clean exit names nobody, whichever process reaches the exit barrier first. The whole
train.py scenarios (a kill mid-step, mid-save) are tests/train/hosts/test_lost_host.py."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.train import multihost

SCRIPT = os.path.join(multihost.ROOT, "tests", "train", "lost_host_process.py")
LINE = "error: lost process 1 of 2: "
# Detection takes the heartbeat timeout (2 s) and a poll; the rest is a loaded box's slack.
# Before the exit barrier let the watch thread report, this case waited the barrier's 300 s.
BOUND_S = 25


def _launch(tmp_path, modes):
    port = multihost.free_port()
    env = multihost.base_env(1)
    logs = [open(tmp_path / f"process_{i}.log", "w") for i in range(2)]
    procs = [subprocess.Popen([sys.executable, SCRIPT, f"127.0.0.1:{port}", str(i), mode,
                               str(tmp_path)], env=env, stdout=log, stderr=subprocess.STDOUT)
             for i, (mode, log) in enumerate(zip(modes, logs))]
    return procs, [log.name for log in logs]


def _wait_joined(tmp_path, procs, logs):
    deadline = time.monotonic() + 120
    while not all(os.path.exists(tmp_path / f"joined_{i}") for i in range(2)):
        for proc, log in zip(procs, logs):
            assert proc.poll() is None, open(log).read()[-3000:]
        assert time.monotonic() < deadline, "the two processes did not join within 120 s"
        time.sleep(0.05)


def _exit_code(proc):
    """Its exit code, or None while it still runs BOUND_S seconds on."""
    try:
        return proc.wait(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        return None


def _finish(procs, timeout):
    try:
        return [proc.wait(timeout=timeout) for proc in procs]
    finally:
        multihost.kill_all(procs)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["raise_when_cut", "abort_when_cut"])
def test_a_survivor_whose_collective_failed_names_the_lost_process(tmp_path, mode):
    """raise: the collective's error reaches the main thread (gloo: "Connection reset by
    peer"); abort: gloo aborts the process from C++ (std::terminate on a message of the wrong
    size), which zoo.train.hosts.abort_hold holds until the lost-host watch has spoken."""
    procs, logs = _launch(tmp_path, [mode, "wait"])
    _wait_joined(tmp_path, procs, logs)
    procs[1].send_signal(signal.SIGKILL)
    procs[1].wait()
    killed = time.monotonic()
    (tmp_path / "peer_killed").touch()  # process 0's main thread raises now
    code = _exit_code(procs[0])
    seconds = time.monotonic() - killed
    multihost.kill_all(procs)
    text = open(logs[0]).read()
    assert code == 1 and seconds < BOUND_S, (code, seconds, text[-3000:])
    if mode == "raise_when_cut":  # its own error, and then the line
        assert "Connection reset by peer" in text, text[-3000:]
    else:
        assert "process 0 of 2: aborted from C++" in text, text[-3000:]
    assert LINE in text, text[-3000:]


@pytest.mark.slow
def test_a_clean_exit_names_nobody_whoever_reaches_the_barrier_first(tmp_path):
    for modes in (["finish", "finish_late"], ["finish_late", "finish"]):
        procs, logs = _launch(tmp_path, modes)
        codes = _finish(procs, 120)
        texts = [open(log).read() for log in logs]
        assert codes == [0, 0], (modes, codes, texts)
        assert not any("lost process" in text for text in texts), (modes, texts)
        for i in range(2):
            os.remove(tmp_path / f"joined_{i}")


def test_an_abort_on_the_way_out_is_not_held(tmp_path):
    procs, logs = _launch(tmp_path, ["abort_at_exit", "finish"])
    codes = _finish(procs, 60)
    text = open(logs[0]).read()
    # (Process 1 may or may not be gone before process 0's crash: it does not matter here.)
    assert codes[0] == -signal.SIGABRT, (codes, text[-3000:])
    assert "aborted from C++" not in text, text[-3000:]  # what a held abort prints first


def test_a_survivor_of_a_lost_coordinator_names_it_itself(tmp_path):
    """Process 0 hosts the coordination service: killed, the agent of process 1 aborts it from
    C++ (LOG(FATAL)) within a second. Held (zoo.train.hosts.abort_hold), process 1 finds process 0's
    address dead and exits 1 with the line; unheld it died of SIGABRT, and only its companion
    (zoo.train.hosts.coordinator_watch) could speak."""
    procs, logs = _launch(tmp_path, ["wait", "wait"])
    _wait_joined(tmp_path, procs, logs)
    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait()
    code = _exit_code(procs[1])
    multihost.kill_all(procs)
    text = open(logs[1]).read()
    assert code == 1, (code, text[-3000:])
    assert "process 1 of 2: aborted from C++" in text, text[-3000:]
    assert "error: lost process 0 of 2 (the coordinator): process 1 " in text, text[-3000:]


# An abort after the interpreter is finalized: glibc's C-level atexit (__cxa_atexit) runs in
# exit(), after Python's own exit handlers and finalization.
_ABORT_AFTER_SHUTDOWN = """
import ctypes
from zoo.train.hosts import abort_hold
assert abort_hold.install(60.0, abort_hold.Exiting(), 1, 2, None, None, 1)
libc = ctypes.CDLL(None)
libc.__cxa_atexit.argtypes = [ctypes.c_void_p] * 3
libc.__cxa_atexit(ctypes.cast(libc.abort, ctypes.c_void_p), None, None)
"""


def test_an_abort_after_the_interpreter_is_gone_exits_as_an_abort():
    # Before: the held abort's handler (Python, through ctypes) ran on a finalized interpreter
    # and the process died of a segfault (exit 139), not the abort.
    proc = subprocess.run([sys.executable, "-c", _ABORT_AFTER_SHUTDOWN], cwd=multihost.ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGABRT, (proc.returncode, proc.stderr[-2000:])


# An abort on a thread that does not hold the GIL while another thread holds it (a C call
# through ctypes.PyDLL keeps it, as a C extension waiting on the aborting thread would).
_ABORT_WHILE_THE_GIL_IS_HELD = """
import ctypes, signal, threading, time
from zoo.train.hosts import abort_hold
assert abort_hold.install(3.0, abort_hold.Exiting(), 1, 2, None, None, 1)
waiting = threading.Thread(target=ctypes.CDLL(None).sleep, args=(120,))  # GIL released
waiting.start()
time.sleep(0.5)  # it is in its native sleep
signal.pthread_kill(waiting.ident, signal.SIGABRT)  # an abort on that thread, as gloo's
ctypes.PyDLL(None).sleep(120)  # PyDLL: the GIL held for the whole call
"""


def test_an_abort_held_while_another_thread_holds_the_gil_ends_on_time():
    """Before: the hold's handler was Python (through ctypes): it waited for the GIL, which the
    other thread kept for its whole 120 s sleep (and for ever, had it waited on the aborting
    thread). The C handler needs no GIL: the hold runs its 3 s and the abort goes ahead."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _ABORT_WHILE_THE_GIL_IS_HELD],
                          cwd=multihost.ROOT, capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - started
    assert proc.returncode == -signal.SIGABRT, (proc.returncode, proc.stderr[-2000:])
    assert "process 1 of 2: aborted from C++" in proc.stderr, proc.stderr[-2000:]
    assert "Fatal Python error: Aborted" in proc.stderr  # faulthandler's stacks, above it
    assert "no other process was reported lost within 3 s: the abort above is this " \
        "process's own" in proc.stderr, proc.stderr[-2000:]
    assert elapsed < 30, elapsed


def test_without_a_compiler_nothing_is_held_and_an_abort_is_an_abort(tmp_path):
    script = ("import logging, os; logging.basicConfig()\n"
              "from zoo.train.hosts import abort_hold\n"
              "assert not abort_hold.install(60.0, abort_hold.Exiting(), 1, 2, None, None, 1)\n"
              "os.abort()\n")
    env = dict(os.environ, CXX="no-such-compiler", ZOO_KERNEL_CACHE=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script], cwd=multihost.ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGABRT, (proc.returncode, proc.stderr[-2000:])
    assert ("zoo/train/hosts/abort_hold.cc could not be built: no working C++ compiler"
            in proc.stderr)
    assert "aborted from C++" not in proc.stderr
