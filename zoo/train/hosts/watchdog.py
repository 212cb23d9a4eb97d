"""The hang watchdog: a step, an eval or a checkpoint save that takes far longer than its recent
ones (a wedged collective, a filesystem that stopped answering, a deadlock) writes every
thread's stack to stderr and exits with status 1, so the scheduler restarts the job instead of
paying for a silent pod.

config.train.watchdog (configs/common.py):
  factor   fire when the phase in progress has run factor x the median of the last WINDOW
           finished phases of its kind (and at least min_s); only once MIN_SAMPLES of that kind
           have finished, so the first step's compile is never judged by it. 0 = off.
  min_s    the factor rule never fires below this many seconds (tiny steps jitter).
  limit_s  fire when any phase runs this long, the first step's compile included. 0 = off.
The timer is a daemon thread: it fires while the main thread is blocked inside XLA or a
collective, where a Python signal handler would never run. A Python thread still needs the GIL,
which a thread stuck in native code may hold (a C extension that never releases it): then the
backstop speaks, faulthandler's watchdog, a C thread armed for each phase at the moment the
rules above would fire plus BACKSTOP_GRACE_S. It needs no GIL: it writes `Timeout (h:mm:ss)!`
and every thread's stack to stderr and exits the process with status 1.
"""

import collections
import contextlib
import faulthandler
import os
import statistics
import sys
import threading
import time

from zoo.errors import ConfigError
from zoo.train.hosts import lost_hosts

WINDOW, MIN_SAMPLES = 50, 5
HANG_EXIT_CODE = 1  # faulthandler's backstop exits with 1 too
# How long the backstop lets the Python thread (which says why in words) go first.
BACKSTOP_GRACE_S = 5.0


def validate(cfg) -> tuple[float, float, float]:
    """(factor, min_s, limit_s) of config.train.watchdog, or ConfigError naming the key."""
    values = {}
    for key in ("factor", "min_s", "limit_s"):
        value = cfg.get(key) if cfg is not None else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"config.train.watchdog.{key}={value!r} must be a number >= 0 "
                              "(0 turns its rule off; see configs/common.py)")
        values[key] = float(value)
    if 0 < values["factor"] <= 1:
        raise ConfigError(f"config.train.watchdog.factor={values['factor']:g} must be > 1 (a "
                          "multiple of the median phase time), or 0 for off")
    return values["factor"], values["min_s"], values["limit_s"]


class Watchdog:
    """`with watchdog.phase("step", 57): ...` around each step, eval and save, and around each
    phase before the loop (`with watchdog.phase("restore"): ...`)."""

    def __init__(self, cfg, poll_s: float = 0.5, clock=time.monotonic, on_hang=None):
        self.factor, self.min_s, self.limit_s = validate(cfg)
        self._clock, self._poll_s = clock, poll_s
        self._history = collections.defaultdict(lambda: collections.deque(maxlen=WINDOW))
        self._current = None  # (kind, step, started)
        self._lock = threading.Lock()
        self._on_hang = on_hang or _dump_and_exit
        self._stop = threading.Event()
        self._thread = None
        # Only the real reaction gets the backstop: a test's on_hang must not be outrun by an exit.
        self._backstop = on_hang is None
        if self.factor or self.limit_s:
            self._thread = threading.Thread(target=self._watch, name="zoo-hang-watchdog",
                                            daemon=True)
            self._thread.start()

    @property
    def active(self) -> bool:
        return self._thread is not None

    def phase(self, kind: str, step: int | None = None):
        """A phase of `kind` (its own median) at `step`; None for one before the loop (building
        the task, restore, init_from), which limit_s alone judges."""
        return _Phase(self, kind, step)

    def _begin(self, kind, step):
        with self._lock:
            self._current = (kind, step, self._clock())
            allowed = self._allowed_s(kind)
        if allowed is not None and self._backstop and not self._stop.is_set():
            # fd 2, not sys.stderr: a stand-in (pytest's capsys, a notebook) may have no fd.
            faulthandler.dump_traceback_later(allowed + BACKSTOP_GRACE_S, exit=True, file=2)

    def _end(self):
        if self._backstop:
            faulthandler.cancel_dump_traceback_later()
        with self._lock:
            if self._current is not None:
                kind, _, started = self._current
                self._history[kind].append(self._clock() - started)
                self._current = None

    def _factor_bound_s(self, history) -> float | None:
        """The factor rule's bound for a phase whose kind took `history` (None: off, or too
        few samples yet): the one threshold both the Python thread and the backstop use."""
        if not self.factor or len(history) < MIN_SAMPLES:
            return None
        return max(self.factor * statistics.median(history), self.min_s)

    def _allowed_s(self, kind: str) -> float | None:
        """How long a phase of `kind` may run before a rule fires (None: no rule applies yet).
        Call with the lock held."""
        bounds = [b for b in (self.limit_s or None, self._factor_bound_s(self._history[kind]))
                  if b is not None]
        return min(bounds) if bounds else None

    def overdue(self) -> str | None:
        """Why the phase in progress is a hang, or None."""
        with self._lock:
            if self._current is None:
                return None
            kind, step, started = self._current
            elapsed = self._clock() - started
            history = list(self._history[kind])
        what = f"{kind}{'' if step is None else f' {step}'} has run {elapsed:.1f} s"
        if self.limit_s and elapsed > self.limit_s:
            return f"{what}, past config.train.watchdog.limit_s={self.limit_s:g}"
        bound = self._factor_bound_s(history)
        if bound is not None and elapsed > bound:
            median = statistics.median(history)
            return (f"{what}, {elapsed / median:.0f} x the median {median:.3g} s of the last "
                    f"{len(history)} {kind}s (config.train.watchdog.factor="
                    f"{self.factor:g}, min_s={self.min_s:g})")
        return None

    def _watch(self):
        while not self._stop.wait(self._poll_s):
            reason = self.overdue()
            if reason:
                self._on_hang(reason)
                return

    @contextlib.contextmanager
    def closed_on_error(self):
        """Closes the watchdog if the block raises (its caller closes it otherwise)."""
        try:
            yield
        except BaseException:
            self.close()
            raise

    def close(self):
        self._stop.set()
        if self._backstop:
            faulthandler.cancel_dump_traceback_later()


class _Phase:
    def __init__(self, watchdog, kind, step):
        self._watchdog, self._kind, self._step = watchdog, kind, step

    def __enter__(self):
        self._watchdog._begin(self._kind, self._step)

    def __exit__(self, *exc):
        self._watchdog._end()


def _dump_and_exit(reason: str) -> None:
    faulthandler.cancel_dump_traceback_later()  # this thread says it, in words
    sys.stdout.flush()
    print(f"error: hang: {reason}; every thread's stack follows, then this process exits "
          "(status 1) so that the job is restarted; rerun the same command to resume from "
          "the last complete checkpoint", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    # The line above says why; process 0 may be gone too by the time this one is, which its
    # companion would otherwise report as a lost coordinator.
    lost_hosts.tell_companion_exiting()
    os._exit(HANG_EXIT_CODE)
