"""When a checkpoint cannot be written: the error a user gets (what failed, which step, that
the previous checkpoint is intact, what to do), decoded from the OS error under orbax and
tensorstore, with the noise of orbax's abandoned writes kept from burying it."""

import errno
import logging
import os
import re
import sys
import warnings

from zoo.errors import UserError

# OS errors that mean the disk (or the quota, or the file-size limit) is full: what, and what to
# do about it. Any other write error is reported with its own text.
NO_SPACE = {
    errno.ENOSPC: ("no space left on device", "Free space on that disk"),
    errno.EDQUOT: ("disk quota exceeded", "Free space within your quota (or raise it)"),
    errno.EFBIG: ("a file grew past the file-size limit",
                  "Raise the file-size limit (ulimit -f) or use a filesystem without one"),
}
# Tensorstore, which writes the arrays, raises ValueError with the OS error in its text:
# '... Failed to write 319950 bytes to file 4: File too large [os_error_code='27']'.
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")


class CheckpointWriteError(UserError, OSError):
    """A checkpoint step could not be written (disk full, quota, I/O error): that step is not
    committed, and `previous_step` (None when there is none) is intact. `errno` is the OS error
    behind it when one is known."""

    def __init__(self, message: str, *, directory: str, step: int, previous_step: int | None,
                 code: int | None = None):
        super().__init__(message)
        self.directory, self.step, self.previous_step = directory, step, previous_step
        self.errno = code


def os_errno(error: BaseException | None) -> int | None:
    """The OS error code behind `error` or its causes, or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno is not None:
            return error.errno
        if match := _OS_ERROR_CODE.search(str(error)):
            return int(match.group(1))
        error = error.__cause__ or error.__context__
    return None


class _AbandonedWrites(logging.Filter):
    """Drops asyncio's "<Task/Future> exception was never retrieved" reports about writes into
    the temporary directory of a save that already failed (and was reported)."""

    def __init__(self):
        super().__init__()
        self.failed_dirs: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "exception was never retrieved" not in message:
            return True
        text = message + (str(record.exc_info[1]) if record.exc_info else "")
        return not any(path in text for path in self.failed_dirs)


_ABANDONED_WRITES = _AbandonedWrites()


def drop_abandoned_write_reports(failed_dir: str) -> None:
    """After a failed write, orbax 0.12.8 leaves that save's other array writes behind as
    coroutines, tasks and futures of its closed event loop, and as they are collected (mostly at
    exit) Python reports each one ("Exception ignored in: <coroutine ... write_fragment>",
    asyncio's "Task exception was never retrieved", ...): hundreds of lines after, and burying,
    the error that says what happened. Only those reports are dropped; any other is shown."""
    _ABANDONED_WRITES.failed_dirs.add(failed_dir)
    # Coroutines created for the abandoned writes and never started warn as they are collected.
    warnings.filterwarnings("ignore", message=r"coroutine '.*write_fragment' was never awaited",
                            category=RuntimeWarning)
    asyncio_logger = logging.getLogger("asyncio")
    if _ABANDONED_WRITES not in asyncio_logger.filters:
        asyncio_logger.addFilter(_ABANDONED_WRITES)
    previous = sys.unraisablehook
    if getattr(previous, "drops_abandoned_writes", False):
        return

    def hook(unraisable):
        # Builtins only: this also runs while the interpreter tears modules down.
        code = getattr(unraisable.object, "cr_code", None)
        if "orbax" not in getattr(code, "co_filename", ""):
            previous(unraisable)

    hook.drops_abandoned_writes = True
    sys.unraisablehook = hook


def size_text(n: float) -> str:
    if n < 1024:
        return f"{n:,.0f} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:,.1f} {unit}"


def first_line(error: BaseException) -> str:
    """'Type: the first line of the message' (orbax's and tensorstore's run to pages)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300] if text else ''}"


def write_error(directory: str, step: int, previous: int | None,
                error: BaseException) -> CheckpointWriteError:
    """The error for a save of `step` into `directory` that failed with `error` (from orbax,
    tensorstore or the OS); `previous` is the last complete step, if any."""
    code = os_errno(error)
    # Tensorstore's text is long (the OCDBT key and file); the chained traceback has it.
    cause = first_line(error) if code is None else f"[Errno {code}] {os.strerror(code)}"
    what = NO_SPACE[code][0] if code in NO_SPACE else "the write failed"
    return _error(directory, step, previous, code,
                  f"could not write checkpoint step {step} to {directory}: {what} ({cause})")


def no_room_error(directory: str, step: int, previous: int | None, needed: int,
                  free: int) -> CheckpointWriteError:
    """The error for a save refused before writing: it needs `needed` bytes, `free` are free."""
    return _error(directory, step, previous, errno.ENOSPC,
                  f"not enough free space to save checkpoint step {step} in {directory}: it "
                  f"needs about {size_text(needed)} and {size_text(free)} are free")


def _error(directory: str, step: int, previous: int | None, code: int | None,
           what: str) -> CheckpointWriteError:
    intact = ("No earlier checkpoint exists there." if previous is None else
              f"The previous checkpoint, step {previous}, is intact.")
    fix = (NO_SPACE[code][1] if code in NO_SPACE else
           "Fix the cause above (permissions, a full or failing disk)")
    workdir = os.path.dirname(directory)
    return CheckpointWriteError(
        f"{what}. {intact} {fix}, or move {workdir} to a disk with room and pass its new path as "
        "--workdir; then rerun the same command: it resumes from the last complete checkpoint.",
        directory=directory, step=step, previous_step=previous, code=code)
