"""Retrying an operation on a gs:// path that failed for a passing reason.

What gcsfs (2026.10, gcsfs/retry.py `retry_request`) already does, for every HTTP request:
up to 6 tries, sleeping min(2**(k-1) + U(0, 1), 32) s before try k+1 (about 31-36 s in all),
when the answer is HTTP 408, 429 or 500-504 (502 arrives as requests' ProxyError), or aiohttp
fails (connection refused, reset or dropped mid-body: fewer bytes than Content-Length), or a
google-auth token refresh or a checksum fails; 404 and the other 4xx are raised at once. The
body is read inside the retried call, so a dropped download is fetched again. Those retries
are logged at DEBUG only (a struggling bucket is silent for half a minute) and their number
and sleeps are fixed when gcsfs is imported.

What `retrying` adds, around one operation (a file read or written, a listing: one to three
requests), so it does not multiply gcsfs's retries at gcsfs's pace:
- a second, slower layer for an outage longer than gcsfs's half minute (a regional blip, a
  burst of 429s while a pod's hosts all poll): `Policy.attempts` tries of the whole
  operation (3: at most 3 x 6 = 18 HTTP requests), 4 s then 16 s apart (x4, at most 60 s),
  each with jitter (x0.5..1) so a pod's hosts do not retry in step;
- the errors gcsfs lets through that are just as passing: timeouts (asyncio's and fsspec's
  FSTimeoutError, socket timeouts) and connection errors raised outside its retried call;
- one WARNING line per retry, naming the operation and object, the attempt and the error;
- a budget (`Policy.budget_s`, 3 minutes; a job's config.train.storage.operation_budget_s):
  no attempt is started that would end past it, judged by the last one's duration, so a
  bucket that never answers (each request then waits out zoo.paths' request timeout) is given
  up on in about 2.5 minutes, not 3 x 2.5;
- after the last attempt, one StorageUnavailableError (a UserError: the command line prints it
  without a traceback) naming the object, the attempts and the time spent, the last error
  chained. Anything not passing (a missing object, no permission, bad JSON) is raised at once,
  untouched.

Operations must be idempotent (a read, a whole-object write, a listing): a retried write may
follow one that reached the bucket before its answer was lost.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from zoo import errors

T = TypeVar("T")
_log = logging.getLogger(__name__)
_jitter = random.Random()  # seeded by the OS: every host of a pod waits differently


@dataclasses.dataclass(frozen=True)
class Policy:
    """How `retrying` retries: `attempts` tries in all, the k-th retry after
    first_delay_s * multiplier**(k-1) seconds (at most max_delay_s), times a jitter in
    [0.5, 1]."""

    attempts: int = 3
    first_delay_s: float = 4.0
    multiplier: float = 4.0
    max_delay_s: float = 60.0
    # No attempt is started that would end past this many seconds from the first one's start,
    # judged by how long the last one took (a silent bucket: each attempt is gcsfs's 6 requests
    # of zoo.paths' request timeout and its ~31 s of backoff, ~2.5 min at the default 20 s).
    budget_s: float = 180.0

    def delay(self, retry: int) -> float:
        base = min(self.max_delay_s, self.first_delay_s * self.multiplier ** (retry - 1))
        return base * _jitter.uniform(0.5, 1.0)


DEFAULT = Policy()


def configure(budget_s: float) -> None:
    """The budget of every operation retried with the default policy from now on (a job's
    config.train.storage.operation_budget_s, through zoo.paths.configure)."""
    global DEFAULT
    DEFAULT = dataclasses.replace(DEFAULT, budget_s=budget_s)


def is_transient(error: BaseException) -> bool:
    """Whether `error` (or an error it was raised from) is one that passes: HTTP 408, 429,
    5xx, a connection refused, reset or dropped, a timeout."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, (ConnectionError, TimeoutError)):
            return True  # builtins; asyncio's and fsspec's timeouts are TimeoutError
        if _gcsfs_retriable(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def is_access_denied(error: BaseException) -> bool:
    """Whether `error` (or one it was raised from) is storage refusing these credentials: a
    local PermissionError, gcsfs's 403 (an OSError 'Forbidden: ...') or an HTTP 401/403."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, PermissionError) or getattr(error, "code", None) in (401, 403):
            return True
        if type(error) is OSError and errors.message(error).startswith("Forbidden"):
            return True
        error = error.__cause__ or error.__context__
    return False


def _gcsfs_retriable(error: BaseException) -> bool:
    # gcsfs's own classification (its HTTP codes, aiohttp and requests errors), so the two
    # layers agree on what passes. Only once gcsfs is loaded (a gs:// path was used): before,
    # no error can be one of its, and importing it here would fix its settings, which it
    # reads from the environment at import, too early.
    gcsfs_retry = sys.modules.get("gcsfs.retry")
    return gcsfs_retry is not None and gcsfs_retry.is_retriable(error)


def retrying(fn: Callable[[], T], *, what: str, policy: Policy | None = None) -> T:
    """`fn()`, tried again after transient errors (see the module docstring).

    Args:
      fn: the operation, idempotent (a read, a whole-object write, a listing).
      what: the operation and its object, for messages: "reading gs://b/d/manifest.json".
      policy: how often and how long to retry; DEFAULT when None.

    Raises:
      StorageUnavailableError: every attempt failed with a transient error.
      Anything else `fn` raises, at once.
    """
    policy = policy or DEFAULT
    start = time.monotonic()
    for attempt in range(1, policy.attempts + 1):
        began = time.monotonic()
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - classified just below
            if not is_transient(e):
                raise
            said = " ".join(errors.message(e).split())[:200]
            if not said and isinstance(e, TimeoutError):  # fsspec's and asyncio's say nothing
                said = ("no answer within the request timeout (per connect or read: "
                        "config.train.storage.request_timeout_s, or "
                        "$ZOO_GCS_REQUEST_TIMEOUT_S outside a job)")
            error = f"{type(e).__name__}: {said}"
            now = time.monotonic()
            delay = policy.delay(attempt)
            over_budget = now + delay + (now - began) - start > policy.budget_s
            if attempt == policy.attempts or over_budget:
                why = (f"another attempt would end past the {policy.budget_s:.0f} s budget"
                       if attempt < policy.attempts else "")
                raise errors.StorageUnavailableError(
                    f"{what}: failed {f'{attempt} times' if attempt > 1 else 'once'} over "
                    f"{now - start:.0f} s with errors "
                    f"that usually pass (last: {error}){'; ' + why if why else ''}; the "
                    "storage service or the network is failing: check them and run again"
                ) from e
            _log.warning("%s: attempt %d of %d failed (%s); retrying in %.1f s", what,
                         attempt, policy.attempts, error, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")
