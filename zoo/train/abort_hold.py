"""A C++ abort in a process of a multi-host run waits for the lost-host verdict before it dies.

When a peer dies mid-collective, gloo can abort a survivor from C++ before zoo's lost-host
watch (zoo.train.lost_hosts) has heard of the loss: the killed peer's socket breaks one device's
all-reduce, that device moves on while the others of the same process still wait in the old
one, and the next message between them has the wrong size, so gloo's transport thread throws
an uncaught `gloo::EnforceNotMet` ("Received data size doesn't match expected size") and
std::terminate aborts the process within a second of the kill. Seen on the 2-core box under
load (tests/train/test_lost_host.py): the survivor of 1 of 3 two-process kills mid-step, one
survivor of a 1-of-4 kill, and the CI run that failed; exit -6 and no line naming the lost
process. The coordination agent's LOG(FATAL) when process 0 is gone ends
the same way, for every other process.

So `install` puts a handler on SIGABRT (through libc: Python's own signal handlers only set a
flag and return, and abort() then kills the process anyway). The handler writes every thread's
stack, as faulthandler would have, says that it holds, and keeps the aborting thread asleep
while the other threads go on: the lost-host watch asks the coordination service (which lives
on in process 0 even while one of its threads is held) and, once the heartbeat timeout has
passed, prints `error: lost process K of N: ...` and exits 1. When the lost process is process
0, the service went with it and the watch's queries hang: the held thread itself probes process
0's address once a second, and when nothing answers there it prints the line naming the lost
coordinator and exits 1 (the agent's LOG(FATAL) comes within a second of process 0's death).
If no verdict comes within the hold, or the process was already on its way out, the abort goes
ahead as it would have (and zoo.train.coordinator_watch still speaks for a process that dies
that way).

The handler is Python, so it runs once the aborting thread has the GIL. jaxlib releases the GIL
while a thread waits on devices, collectives or the coordination service (the main thread in
every held abort seen here sat in device_get); a thread that kept it while waiting on the
aborting one would turn the abort into a hang instead, which no Python watchdog could end.
"""

import atexit
import ctypes
import faulthandler
import os
import signal
import sys
import threading
import time
from typing import Callable

from zoo.train import coordinator_watch

_SIGNAL_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int)
_installed = None  # the ctypes callback, kept alive for as long as it is installed
_holding = threading.Event()  # one thread holds; a second abort meanwhile only waits with it
_PROBE_EVERY_S = 1.0


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    return libc


def install(hold_s: float, exiting: threading.Event, process_id: int, num_processes: int,
            coordinator: str | None, report: Callable[[str], None]) -> None:
    """Holds this process's C++ aborts for up to `hold_s` seconds, unless `exiting` is set (a
    process that is shutting down aborts at once). While it holds, a process other than 0
    probes `coordinator` (process 0's address) once a second: when it no longer answers,
    there is no verdict to wait for, and `report` prints the line naming the lost coordinator
    and exits."""
    global _installed
    libc = _libc()

    def held(signum):  # runs on the aborting thread, inside abort()
        if _holding.is_set():  # another thread's abort holds already (gloo, then the agent)
            while True:
                time.sleep(1)
        _holding.set()
        if not exiting.is_set():
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
            print(f"process {process_id} of {num_processes}: aborted from C++ (the lines "
                  f"above); it waits up to {hold_s:.0f} s for the coordination service to "
                  "say whether another process was lost", file=sys.stderr, flush=True)
            deadline = time.monotonic() + hold_s
            while time.monotonic() < deadline and not exiting.is_set():
                # The lost-host watch exits the process from its own thread; only the
                # coordinator's own loss is seen from here (the watch's queries then hang).
                why = coordinator_watch.unreachable(coordinator, _PROBE_EVERY_S) \
                    if coordinator and process_id != 0 else None
                if why is not None:
                    report(coordinator_watch.coordinator_line(coordinator, process_id,
                                                              num_processes, why))
                time.sleep(_PROBE_EVERY_S)
        libc.signal(signal.SIGABRT, signal.SIG_DFL)
        os.abort()

    _installed = _SIGNAL_HANDLER(held)
    libc.signal(signal.SIGABRT, ctypes.cast(_installed, ctypes.c_void_p))
    # The handler is Python: once the interpreter is finalized it cannot run, and an abort
    # from then on (a C++ destructor, a C atexit) jumped into freed code: exit 139, a segfault,
    # instead of the abort. Python's own atexit (still a live interpreter) hands SIGABRT back.
    atexit.register(uninstall)


def uninstall() -> None:
    """SIGABRT back to its default: an abort from here on ends the process at once."""
    _libc().signal(signal.SIGABRT, signal.SIG_DFL)
