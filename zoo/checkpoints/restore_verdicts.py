"""What a failed read of a saved checkpoint proves, and one decision for every process.

A restore reads files another process (or another run) wrote; a read can fail because those
files are damaged (evidence: a missing file, metadata that does not parse, tensorstore's
data-loss codes), because storage is passing through a bad minute (retried by zoo.retry), or for any
other reason (out of memory, a sharding bug), which must surface as it is. With several processes,
each one's verdict is gathered and all apply the same decision (zoo.checkpoints.checkpoint uses
both).
"""

import json
import zlib
from collections.abc import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils

from zoo import retry
from zoo.checkpoints.checkpoint_failures import first_line
from zoo.errors import UserError


class CheckpointRestoreError(RuntimeError):
    """Another process could not restore the checkpoint (its own log has the traceback), or
    the processes list different checkpoints; this process stops with it, so every process
    makes the same decision."""


class StepsDisagreeError(UserError, CheckpointRestoreError):
    """The processes list different saved steps (agreed_steps)."""


class Unreadable(Exception):
    """Evidence that one step's files are damaged (the restore falls back to an older step)."""


# Tensorstore raises ValueError('<absl status code>: ...'). These codes, on a read of a
# committed checkpoint, are what damaged files produce (measured on orbax 0.12.8, OCDBT):
# a deleted chunk file 'FAILED_PRECONDITION: Error reading "params.w/0.0" ...: Truncated
# Zstd-compressed stream', a truncated one 'OUT_OF_RANGE: Error reading ...: Requested byte
# range [0, 2350) is not valid for value of size 1377', a garbled manifest 'DATA_LOSS: ...
# Error decoding manifest', a deleted manifest 'NOT_FOUND: ... Metadata at "step/.zarray" ...
# does not exist'. FAILED_PRECONDITION also means other things, so only with a read or decode
# in its text.
_DAMAGE_STATUS = ("DATA_LOSS:", "NOT_FOUND:", "OUT_OF_RANGE:")
_READ_FAILED = ("Error reading", "Error decoding", "Invalid JSON", "Truncated")
# ... and these pass (tensorstore's own HTTP retries ran out on a 5xx, 429 or a timeout).
_TRANSIENT_STATUS = ("UNAVAILABLE:", "DEADLINE_EXCEEDED:", "ABORTED:")


def _chain(error: BaseException | None):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def damage_evidence(error: BaseException) -> str | None:
    """Why `error`, raised reading a committed checkpoint, proves its files damaged (a file
    missing, metadata that does not parse, tensorstore's data-loss codes), or None when it
    proves nothing (out of memory, a sharding bug, a storage outage: not the files' fault)."""
    for e in _chain(error):
        if isinstance(e, FileNotFoundError):
            return f"a file is missing ({first_line(e)})"
        if isinstance(e, (json.JSONDecodeError, UnicodeDecodeError)):
            return f"its metadata does not parse ({first_line(e)})"
        if isinstance(e, ValueError):
            text = str(e)
            if text.startswith(_DAMAGE_STATUS) or (
                    text.startswith("FAILED_PRECONDITION:") and any(
                        marker in text for marker in _READ_FAILED)):
                return first_line(e)
    return None


def read(fn: Callable, what: str):
    """`fn()` (a read of checkpoint files), retried by zoo.retry while it fails with an error
    that passes; damage evidence raises Unreadable; anything else is raised untouched."""

    def attempt():
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 -- sorted into evidence, passing, the rest
            evidence = damage_evidence(e)
            if evidence is not None:
                raise Unreadable(evidence) from e
            if any(str(x).startswith(_TRANSIENT_STATUS) for x in _chain(e)
                   if isinstance(x, ValueError)):
                # Tensorstore's passing errors are ValueErrors: name them for zoo.retry.
                raise ConnectionError(first_line(e)) from e
            raise

    return retry.retrying(attempt, what=what)


# A verdict gathered from every process: a code, then the reason in UTF-8 (cut to fit).
OK, CORRUPT, ERROR = 0, 1, 2
_REASON_BYTES = 512


def agree(code: int, reason: str) -> tuple[int, int, str]:
    """(code, process, reason) that every process decides from all processes' (code, reason):
    an error anywhere wins over damage anywhere, which wins over ok; the first process with
    the winning code gives its reason. Every process calls this once per decision, whatever
    happened to it before, so none waits for one that took another path."""
    if jax.process_count() == 1:
        return code, 0, reason
    local = np.zeros(1 + _REASON_BYTES, np.uint8)
    local[0] = code
    encoded = reason.encode()[:_REASON_BYTES]
    local[1:1 + len(encoded)] = np.frombuffer(encoded, np.uint8)
    every = np.asarray(multihost_utils.process_allgather(local))  # (processes, 1 + bytes)
    worst = int(every[:, 0].max())
    process = int(np.argmax(every[:, 0] == worst))
    text = every[process, 1:].tobytes().rstrip(b"\0").decode(errors="replace")
    return worst, process, text


def agreed_steps(steps: list[int], directory: str) -> list[int]:
    """`steps` (this process's listing of `directory`, newest first) when every process lists
    the same, else StepsDisagreeError naming two that differ (a workdir on a disk not
    shared by every host, a listing taken as a save was committed): each would otherwise
    restore (or start from) another step, and the run would go on mixing their shards."""
    if jax.process_count() == 1:
        return steps
    listed = np.array([len(steps), steps[0] if steps else -1,
                       zlib.crc32(repr(steps).encode()) & 0x7FFFFFFF], np.int32)
    every = np.asarray(multihost_utils.process_allgather(listed))
    other = next((p for p in range(len(every)) if (every[p] != every[0]).any()), None)
    if other is None:
        return steps

    def sees(p):
        count, newest, _ = every[p]
        return f"process {p} lists {count} step(s), the newest {newest}" if count else \
            f"process {p} lists none"

    raise StepsDisagreeError(
        f"the processes see different checkpoints in {directory}: {sees(0)}; {sees(other)}. "
        "Every process must restore the same step: keep the workdir where every host sees the "
        "same files (a bucket or a shared file system) and run again")
