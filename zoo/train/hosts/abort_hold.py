"""A C++ abort in a process of a multi-host run waits for the lost-host verdict before it dies.

When a peer dies mid-collective, gloo can abort a survivor from C++ before zoo's lost-host watch
(zoo.train.hosts.lost_hosts) has heard of the loss: the killed peer's socket breaks one device's
all-reduce, that device moves on while the others of the same process still wait in the old one, the
next message between them has the wrong size, and gloo's transport thread throws an uncaught
`gloo::EnforceNotMet` ("Received data size doesn't match expected size"): std::terminate aborts the
process within a second of the kill, with no line naming the lost process. The coordination agent's
LOG(FATAL) when process 0 is gone ends the same way.

So `install` puts a handler on SIGABRT that holds the aborting thread while the others go on:
the lost-host watch asks the coordination service (which lives on in process 0) and, once the
heartbeat timeout has passed, prints `error: lost process K of N: ...` and exits 1. When the
lost process is process 0, the service went with it: the handler probes process 0's address
once a second and, when nothing answers there, prints the line naming the lost coordinator and
exits 1. If no verdict comes within the hold, the handler says the abort is the process's own
and it goes ahead as it would have (at once when the process is on its way out: `Exiting` set,
or Python's exit); zoo.train.hosts.coordinator_watch still speaks for a process that dies that way.

The handler is C (zoo/train/hosts/abort_hold.cc, compiled on first use like zoo's CPU kernels) and
makes only async-signal-safe calls: it needs no GIL (a thread holding the GIL while it waits on
the aborting one cannot turn the abort into a hang: the hold ends on time) and no interpreter
(an abort after Python's finalization is an abort, not a segfault). Faulthandler, enabled
above it, writes every thread's Python stack first. Without a C++ compiler nothing is held: an
abort ends the process at once, as it would without zoo.
"""

import atexit
import ctypes
import faulthandler
import logging
import pathlib
import socket
import sys
import threading

from zoo.errors import ConfigError
from zoo.train.hosts import coordinator_watch

_log = logging.getLogger(__name__)
_library: ctypes.CDLL | None = None


class Exiting(threading.Event):
    """The lost-host machinery's "this process exits on its own terms" event; once set, a held
    abort goes ahead at once (the C handler reads a flag, not this event)."""

    def set(self) -> None:
        super().set()
        release()


def release() -> None:
    """From now on an abort goes ahead at once (the process exits on its own terms)."""
    if _library is not None:
        _library.zoo_abort_hold_exiting()


def _ipv4(address: str | None) -> tuple[int, int]:
    """(IPv4 address in network order, port) of HOST:PORT, resolved now (the handler cannot),
    or (0, 0): no probe."""
    if not address:
        return 0, 0
    try:
        host, _, port = address.rpartition(":")
        packed = socket.inet_aton(socket.gethostbyname(host.strip("[]")))
        return int.from_bytes(packed, sys.byteorder), int(port)
    except (OSError, ValueError):  # an IPv6 or unresolvable name: hold without the probe
        return 0, 0


def install(hold_s: float, exiting: Exiting, process_id: int, num_processes: int,
            coordinator: str | None, companion_fd: int | None, exit_code: int) -> bool:
    """Holds this process's C++ aborts for up to `hold_s` seconds, unless `exiting` is set.
    While it holds, a process other than 0 probes `coordinator` (process 0's address) once a
    second: when it refuses or does not answer, the handler tells the companion (`companion_fd`)
    that the process exits on its own terms, prints the line naming the lost coordinator and
    exits `exit_code`. Returns whether the hold is in place (False without a C++ compiler)."""
    global _library
    from zoo.nn.kernels import build

    try:
        library = build.compiled("abort_hold.cc", pathlib.Path(__file__).parent,
                                 "without it a C++ abort ends the process at once")
    except ConfigError as e:
        _log.warning("a C++ abort of this process will not wait for the lost-host verdict: "
                     "%s", " ".join(str(e).split())[:400])
        return False
    library.zoo_abort_hold_install.argtypes = [
        ctypes.c_double, ctypes.c_int, ctypes.c_int, ctypes.c_uint, ctypes.c_ushort,
        ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]
    ipv4, port = _ipv4(coordinator) if process_id != 0 else (0, 0)

    def lost(reason: str) -> bytes:
        return (coordinator_watch.coordinator_line(coordinator or "?", process_id,
                                                   num_processes, reason) + "\n").encode()

    held = (f"process {process_id} of {num_processes}: aborted from C++ (the lines above); it "
            f"waits up to {hold_s:.0f} s for the coordination service to say whether another "
            "process was lost\n").encode()
    own = (f"process {process_id} of {num_processes}: no other process was reported lost "
           f"within {hold_s:.0f} s: the abort above is this process's own (its lines say "
           "why)\n").encode()
    # Faulthandler's fatal handler must sit above this one: it writes every thread's stack,
    # then hands the signal down (to the hold).
    was_enabled = faulthandler.is_enabled()
    faulthandler.disable()
    failed = library.zoo_abort_hold_install(
        hold_s, -1 if companion_fd is None else companion_fd, exit_code, ipv4, port, held,
        lost("Connection refused"), lost("no answer within 1 s"), own)
    try:  # to fd 2, where the handler writes too (sys.stderr may be a capture without one)
        faulthandler.enable(file=sys.__stderr__ or sys.stderr, all_threads=True)
    except (AttributeError, OSError, ValueError):  # no file descriptor at all: no stacks
        pass
    if failed:
        if not was_enabled:
            faulthandler.disable()
        _log.warning("the abort hold could not be installed (errno %d)", failed)
        return False
    _library = library
    if exiting.is_set():
        library.zoo_abort_hold_exiting()
    # An abort on the way out (a C++ destructor, a C atexit after finalization) is not held.
    atexit.register(library.zoo_abort_hold_exiting)
    return True
