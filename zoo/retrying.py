"""Bounded retries of transient storage errors (a 503, a dropped connection, a timeout), each
retry logged once. gcsfs already retries some HTTP errors inside one call; this is the outer
loop a long training run needs so that one bad minute of a bucket does not end it.

A missing object, a permission error or anything the caller raises on purpose is not transient:
it goes up at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)

# HTTP codes worth another try: timeout, too many requests, server errors.
_RETRY_CODES = {408, 429, 500, 502, 503, 504}


def is_transient(error: BaseException) -> bool:
    """True for errors a later try may not see (server busy, connection dropped)."""
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    code = getattr(error, "code", None) or getattr(error, "status", None)
    if isinstance(code, int):
        return code in _RETRY_CODES
    if isinstance(error, (ConnectionError, TimeoutError, asyncio.TimeoutError)):
        return True
    try:
        import aiohttp  # gcsfs's transport

        if isinstance(error, aiohttp.ClientError):
            return True
    except ImportError:  # pragma: no cover - gcsfs always brings aiohttp
        pass
    return False


def call(fn: Callable[[], T], what: str, attempts: int = 5, first_wait_s: float = 0.5,
         max_wait_s: float = 8.0, sleep: Callable[[float], None] = time.sleep) -> T:
    """fn(), tried up to `attempts` times while it raises transient errors, waiting
    first_wait_s, then twice as long each time (at most max_wait_s). `what` names the request
    in the log line of each retry; the last error goes up unchanged."""
    wait = first_wait_s
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - classified just below
            if attempt == attempts or not is_transient(e):
                raise
            log.warning("%s: %s: %s; retry %d of %d in %.1f s", what, type(e).__name__,
                        " ".join(str(e).split())[:200], attempt, attempts - 1, wait)
            sleep(wait)
            wait = min(2 * wait, max_wait_s)
    raise AssertionError("unreachable")
