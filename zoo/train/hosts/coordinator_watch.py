"""The line that names a lost coordinator, from a small companion process of each other process.

Process 0 hosts JAX's coordination service. When it dies, every other process loses the service and
its gloo peer in the same instant, and C++ aborts it (the coordination agent's LOG(FATAL)
"Terminating process because the JAX distributed service detected fatal errors", or gloo's uncaught
EnforceNotMet) within a second: measured with 4 processes on CPU, 0.3-0.6 s after process 0's
SIGKILL, while zoo.train.hosts.lost_hosts polls the service once a second. The abort is held
(zoo.train.hosts.abort_hold), and the held process prints the line itself; this companion is the
second line of defence, for a process that dies all the same (the hold ran out, a signal no handler
can hold, a jaxlib whose abort path bypasses it). No hook of this jaxlib runs Python there (the
missed-heartbeat callback dies with std::bad_cast, see lost_hosts), so the line comes from outside:
zoo.train.hosts.lost_hosts starts this script (stdlib only, no jax: ~20 ms and a few MB) beside
every process but 0, with a pipe on its stdin. The process writes one byte before it exits on its
own terms (zoo's exit barrier, a lost-host report of its own); when the pipe closes without that
byte, or the process is no longer this script's parent, it ended abruptly, and this script tries a
TCP connection to the coordinator's address. Refused or timed out: the service is gone, and it
prints

    error: lost process 0 of N (the coordinator): ...

to the stderr it shares with the process (right after the process's abort text), then exits.
Reachable: the process ended for a reason of its own (its log says which); nothing is printed.

    python coordinator_watch.py HOST:PORT PROCESS_ID NUM_PROCESSES
"""

import os
import select
import signal
import socket
import sys

EXITING = b"x"  # what the process writes before it exits on its own terms
# A dead process 0 on a live machine refuses at once; a machine that is gone lets a connection
# time out: this bounds how long after its process the line may come.
PROBE_TIMEOUT_S = 5.0
_POLL_S = 0.2  # how often the parent is checked for when the pipe says nothing


def coordinator_line(address: str, process_id: int, num_processes: int, reason: str) -> str:
    """The line printed for process `process_id` that lost the coordinator at `address`."""
    return (f"error: lost process 0 of {num_processes} (the coordinator): process {process_id} "
            f"was aborted by JAX/gloo (the lines above) when the coordination service that "
            f"process 0 hosts at {address} went away ({reason}); rerun every process with the "
            "same command: it resumes from the last complete checkpoint")


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def unreachable(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the coordinator at `address` cannot be reached, or None when it accepts a
    connection."""
    try:
        with socket.create_connection(_split(address), timeout=timeout_s):
            return None
    except OSError as e:  # refused, timed out, no route, the name no longer resolves
        return e.strerror or type(e).__name__


def _parent_gone(parent: int) -> bool:
    """True when the parent ended without saying so; exits silently when it said so."""
    readable, _, _ = select.select([0], [], [], _POLL_S)
    if readable:
        if os.read(0, 1) == EXITING:
            sys.exit(0)
        return True  # end of file: every copy of the write end is closed
    # A child the process forked may still hold the write end: its parent is then gone
    # although the pipe stays open.
    return os.getppid() != parent


def main(argv: list[str]) -> None:
    address, process_id, num_processes = argv[1], int(argv[2]), int(argv[3])
    # Ctrl-C reaches the whole process group: the process handles it, this script waits.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    while not _parent_gone(parent):
        pass
    reason = unreachable(address)
    if reason is not None:
        print(coordinator_line(address, process_id, num_processes, reason), file=sys.stderr,
              flush=True)


if __name__ == "__main__":
    main(sys.argv)
