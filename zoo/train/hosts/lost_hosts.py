"""Lost hosts: a process of a multi-host run that dies stops the others, fast, with one line
naming it.

A lost host (killed, its machine gone) stops the others: JAX's coordination service declares a
process dead when it sends no heartbeat for config.train.heartbeat_timeout_s. Left to JAX, every
other process then aborts in C++ with its reason spread over several lines (and JAX's
missed-heartbeat callback cannot be given a Python function in this jaxlib: it dies with
std::bad_cast). So zoo starts the service recoverable (a dead process is marked, nobody is
aborted) and a daemon thread asks it which processes are alive; a survivor, wherever its main
thread is blocked (a collective waiting on the dead peer, a checkpoint barrier), prints one line
naming the lost process and exits 1, so the scheduler relaunches every process and the run
resumes from its last complete checkpoint (tests/train/hosts/test_lost_host.py measures the time).
A survivor that gloo aborts from C++ first (its collective broke with the peer's socket) is held
alive until the watch has spoken (zoo.train.hosts.abort_hold), and the watch keeps watching until
every process has reached the exit barrier, so a survivor whose main thread ended in that
collective's error names the lost process too.
Process 0 hosts the service, so it leaves last. A recoverable service no longer holds its
shutdown for the others: every process meets at an exit barrier instead. When process 0 itself
dies, the agent of every other process aborts it from C++ within a second; held, each one
finds process 0's address dead and prints the line naming it (abort_hold), and a companion
process of each (zoo.train.hosts.coordinator_watch) prints it for one that dies all the same.
"""

import atexit
import os
import re
import subprocess
import sys
import threading
import time

import jax

from zoo import errors
from zoo.errors import ConfigError
from zoo.train.hosts import abort_hold, coordinator_watch

# JAX's default is 100 s; a healthy process sends its heartbeats from a C++ thread of its own
# (not held by the GIL, a long compile or a step), so 30 s declares only a dead or frozen host.
DEFAULT_HEARTBEAT_TIMEOUT_S = 30
LOST_HOST_EXIT_CODE = 1
SHUTDOWN_TIMEOUT_S = 300
_LEFT_KEY = "zoo_left/{}"  # set by a process that passed the exit barrier (_exit_together)
# Set by a process whose job failed (its one-line error), read by every other's watch.
_FAILED_DIR = "zoo_failed/"
_FAILED_KEY = _FAILED_DIR + "{}"


def heartbeat_timeout(config) -> int:
    """config.train.heartbeat_timeout_s, validated (a config without it: JAX's detection at
    zoo's default)."""
    train = config.get("train") if config is not None else None
    value = train.get("heartbeat_timeout_s", DEFAULT_HEARTBEAT_TIMEOUT_S) if train else \
        DEFAULT_HEARTBEAT_TIMEOUT_S
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 2 \
            or value != int(value):
        raise ConfigError(f"config.train.heartbeat_timeout_s={value!r} must be a whole number "
                          "of seconds >= 2: how long a process may send no heartbeat before "
                          "the others declare it lost and exit (JAX's default is 100)")
    return int(value)


def lost_process_message(status: str, process_id: int, num_processes: int) -> str:
    """The one line a survivor prints, from the coordination service's error text."""
    first = status.strip().splitlines()[0] if status.strip() else "no detail"
    match = re.search(r"stopped sending heartbeats\):\s*([\d\s,]+)", status)
    if match:
        lost = sorted({int(x) for x in re.findall(r"\d+", match.group(1))})
        who = ", ".join(str(x) for x in lost)
        what = (f"lost process {who} of {num_processes}" if len(lost) == 1 else
                f"lost processes {who} of {num_processes}")
        pronoun = "they" if len(lost) > 1 else "it"
        return (f"error: {what}: {pronoun} sent the coordination service no heartbeat for "
                f"config.train.heartbeat_timeout_s; process {process_id} exits so that the "
                "job is relaunched (rerun every process with the same command: it resumes "
                "from the last complete checkpoint)")
    if process_id != 0 and ("heartbeat" in status.lower() or "unavailable" in status.lower()
                            or "leader" in status.lower()):
        return (f"error: lost process 0 of {num_processes} (the coordinator): process "
                f"{process_id} cannot reach its coordination service ({first}); it exits so "
                "that the job is relaunched (rerun every process with the same command: it "
                "resumes from the last complete checkpoint)")
    return (f"error: the coordination service reported a failure of another process "
            f"({first}); process {process_id} of {num_processes} exits so that the job is "
            "relaunched (rerun every process with the same command: it resumes from the last "
            "complete checkpoint)")


# The write end of the pipe to this process's coordinator_watch companion (None without one).
_companion_pipe: int | None = None


def _start_companion(address: str, process_id: int, num_processes: int) -> None:
    """Starts coordinator_watch beside this process (not process 0: it hosts the service)."""
    global _companion_pipe
    read, write = os.pipe()
    # Run by path, not -m: the script needs no zoo and no jax. Its stderr is this process's.
    # Its stdout goes nowhere: a reader of this process's stdout pipe sees its end of file when
    # this process ends, not when the companion does.
    subprocess.Popen([sys.executable, coordinator_watch.__file__, address, str(process_id),
                      str(num_processes)], stdin=read, stdout=subprocess.DEVNULL,
                     close_fds=True)
    os.close(read)
    _companion_pipe = write


def tell_companion_exiting() -> None:
    """This process exits on its own terms (having said why): its companion
    (zoo.train.hosts.coordinator_watch) ends without a word. Call before an os._exit."""
    global _companion_pipe
    if _companion_pipe is not None:
        abort_hold.release()  # the hold's handler writes to this pipe: not once it is closed
        try:
            os.write(_companion_pipe, coordinator_watch.EXITING)
            os.close(_companion_pipe)
        except OSError:  # the companion is gone already (killed with the process group)
            pass
        _companion_pipe = None


def _report_and_exit(line: str) -> None:
    tell_companion_exiting()
    sys.stdout.flush()
    if line:
        print(line, file=sys.stderr, flush=True)
    os._exit(LOST_HOST_EXIT_CODE)


# This process's connection to the others once joined, for failure_published.
_joined: dict = {}


def failed_peer(client, process_id: int) -> tuple[int, str] | None:
    """(process, its error line) of the first other process that published a failure."""
    try:
        found = client.key_value_dir_get(_FAILED_DIR)
    except Exception:  # noqa: BLE001 - the service is gone: nothing to read
        return None
    failures = sorted((int(key.rsplit("/", 1)[1]), value) for key, value in found)
    return next(((i, line) for i, line in failures if i != process_id), None)


def peer_failed_message(peer: int, line: str, process_id: int, num_processes: int) -> str:
    return (f"error: process {peer} of {num_processes} failed: {line} (process {process_id} "
            "exits because of it; fix that and rerun every process)")


def failure_published(line: str) -> str | None:
    """zoo.errors.failure_hooks: this process's failure goes to the coordination service (the
    others' watch reads it and exits naming it) and its exit skips the exit barrier. Returns
    the line naming another process whose failure came first, if one did."""
    client = _joined.get("client")
    if client is None:
        return None
    process_id, num_processes = _joined["process_id"], _joined["num_processes"]
    _joined["failed"] = True
    peer = failed_peer(client, process_id)
    try:
        client.key_value_set(_FAILED_KEY.format(process_id), line)
    except Exception:  # noqa: BLE001 - the service is gone; the others see this one lost
        pass
    return peer_failed_message(*peer, process_id, num_processes) if peer else None


def _watch_peers(client, process_id: int, num_processes: int, every_s: float,
                 exiting: threading.Event) -> None:
    """Asks the coordination service which processes are alive, and whether one published a
    failure, every `every_s` seconds, on a daemon thread: the main thread may be blocked in a
    collective that will never return."""
    everyone = list(range(num_processes))
    while not exiting.wait(every_s):
        peer = None if _joined.get("failed") else failed_peer(client, process_id)
        if peer is not None and not exiting.is_set():
            line = peer_failed_message(*peer, process_id, num_processes)
            if process_id == 0:
                # The service lives here: the failed process is still on its way out (JAX's
                # shutdown needs the service; without it its agent aborts from C++, and the
                # others have yet to read the failure).
                _serve_a_while(client, everyone, line, every_s)
                line = ""  # printed
            _report_and_exit(line)
        try:
            live = client.get_live_nodes(everyone)
        except Exception as e:  # the service itself (process 0) is gone  # noqa: BLE001
            if exiting.is_set():  # process 0 finished first and took the service with it
                return
            if process_id != 0:
                _report_and_exit(lost_process_message(f"UNAVAILABLE: {e}", process_id,
                                                      num_processes))
            raise
        lost = [i for i in everyone if i not in live and not _left(client, i)]
        if lost and not exiting.is_set():
            line = lost_process_message(
                "The following tasks are unhealthy (stopped sending heartbeats): "
                + ",".join(map(str, lost)), process_id, num_processes)
            if process_id == 0 and len(lost) < num_processes - 1:
                _serve_a_while(client, everyone, line, every_s)
                line = ""  # printed
            _report_and_exit(line)


def _serve_a_while(client, everyone, line: str, every_s: float) -> None:
    """Process 0 hosts the service: leaving at once would take it away before the other
    survivors heard why (they would abort with the service's own error instead). Prints
    `line`, then keeps answering their liveness queries for two of their polls."""
    if line:
        print(line, file=sys.stderr, flush=True)
    threading.Thread(target=_keep_answering, args=(client, everyone), daemon=True).start()
    time.sleep(2 * every_s + 1)


def _left(client, process_id: int) -> bool:
    """Whether `process_id` passed the exit barrier before it disconnected (_exit_together):
    then it left, it was not lost."""
    try:
        return bool(client.key_value_try_get(_LEFT_KEY.format(process_id)))
    except Exception:  # NOT_FOUND: it never got there  # noqa: BLE001
        return False


def _keep_answering(client, everyone) -> None:
    while True:
        try:
            client.get_live_nodes(everyone)
        except Exception:  # noqa: BLE001
            return


def join(heartbeat_timeout_s: int, kwargs: dict) -> None:
    """jax.distributed.initialize(**kwargs) with a recoverable coordination service, then a
    daemon thread that reports a lost process, and an exit barrier (the module docstring)."""
    from jax._src import distributed as jax_distributed

    # Recoverable: the service marks a silent process dead instead of aborting everyone from
    # C++; _watch_peers sees it and reports it (see the module docstring).
    with jax.enable_recoverability(True) if hasattr(jax, "enable_recoverability") else \
            jax_distributed._ENABLE_RECOVERABILITY(True):
        jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat_timeout_s,
                                   **kwargs)
    state = jax_distributed.global_state
    if state.client is None:  # (a test's stand-in for jax.distributed.initialize)
        return
    _joined.update(client=state.client, process_id=state.process_id,
                   num_processes=state.num_processes, failed=False)
    if failure_published not in errors.failure_hooks:
        errors.failure_hooks.append(failure_published)
    if state.process_id != 0 and state.coordinator_address:
        _start_companion(state.coordinator_address, state.process_id, state.num_processes)
    exiting = abort_hold.Exiting()
    every_s = max(1.0, heartbeat_timeout_s / 10)
    watch = threading.Thread(target=_watch_peers, name="zoo-lost-host",
                             args=(state.client, state.process_id, state.num_processes,
                                   every_s, exiting), daemon=True)
    watch.start()
    # gloo or the coordination agent may abort this process from C++ before the watch has
    # heard of the loss that caused it: the abort waits for the watch's line (abort_hold).
    abort_hold.install(heartbeat_timeout_s + 3 * every_s + 10, exiting, state.process_id,
                       state.num_processes, state.coordinator_address, _companion_pipe,
                       LOST_HOST_EXIT_CODE)
    # A recoverable service no longer holds its shutdown until every process has finished:
    # without this barrier process 0 could exit first and take the service with it, and the
    # others would abort on their way out. Registered after JAX's own atexit shutdown, so it
    # runs before it; the same 5 minutes as JAX's shutdown_timeout_seconds.
    atexit.register(_exit_together, state.client, state.process_id, state.num_processes,
                    exiting, watch, 2 * every_s + 10, every_s)


def _exit_together(client, process_id: int, num_processes: int, exiting: threading.Event,
                   watch: threading.Thread, watch_join_s: float, every_s: float) -> None:
    if _joined.get("failed"):
        # This process failed and published why (failure_published): the others exit on
        # their own when their watch reads it; none will come to the barrier. Process 0 hosts
        # the service they read it from, so it stays for two of their polls.
        exiting.set()
        tell_companion_exiting()
        if process_id == 0:
            _serve_a_while(client, list(range(num_processes)), "", every_s)
        watch.join(timeout=watch_join_s)
        return
    # Until every process is here, a lost process is still a loss: the watch thread keeps
    # reporting it (and each companion keeps watching process 0). A survivor whose main thread
    # ended with a collective's error (gloo: "Connection reset by peer" from the killed peer)
    # comes here at once; with the watch stopped it waited in this barrier for the full
    # SHUTDOWN_TIMEOUT_S and never said why (1 of 9 two-process kills on the 2-core box).
    try:
        client.wait_at_barrier("zoo_exit", timeout_in_ms=SHUTDOWN_TIMEOUT_S * 1000)
        client.key_value_set(_LEFT_KEY.format(process_id), "1")  # before it disconnects
    except Exception:  # a process that is gone (or late): JAX's shutdown says so  # noqa: BLE001
        pass
    # From here on, losing process 0 is the expected end (it leaves last), not a loss.
    exiting.set()
    tell_companion_exiting()
    try:
        if process_id == 0:
            # The service lives in this process: it stays up until every other process has
            # disconnected (get_live_nodes returns once the live ones have all asked, and a
            # disconnected one is no longer live).
            deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
            while (len(client.get_live_nodes(list(range(num_processes)))) > 1
                   and time.monotonic() < deadline):
                time.sleep(0.05)
    except Exception:  # noqa: BLE001
        pass
    # The watch thread may be inside get_live_nodes (C++, the GIL released, waiting for every
    # live process to ask). Left there, it wakes during interpreter shutdown, is torn down by a
    # forced unwind that the binding's catch (...) swallows, and a process that finished cleanly
    # aborts ("FATAL: exception not rethrown", exit -6): 5 of 32 two-process prepare runs, four
    # at a time on 2 cores (0 of 32 with this join). Its last call returns once the others have
    # asked or disconnected.
    watch.join(timeout=watch_join_s)
