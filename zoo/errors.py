"""Errors the user can fix, and how the command line reports them.

A `UserError` says what was wrong, where (the file, the record, the config key) and what to do;
train.py, eval.py and every `python -m zoo....` command print its message alone on stderr and
exit with status 1 (`reported`). Anything else is a bug and keeps its traceback. `ZOO_DEBUG=1`
in the environment shows the traceback of a UserError too.

The subclasses also derive from the builtin type the code raised before the family existed,
so `except ValueError` / `except FileNotFoundError` around zoo calls keeps working.
"""

import contextlib
import os
import sys
import traceback
from collections.abc import Callable, Iterator


class UserError(Exception):
    """The user can fix this: the message says what was wrong, where and what to do."""


class ConfigError(UserError, ValueError):
    """A config key or value (including a library argument a config value reaches: a model
    size, heads that must divide the width), a command-line argument, or a mesh that does not
    fit the devices."""


class DataError(UserError, ValueError):
    """A file the user gave (a dataset, a tokenizer, a pretrained checkpoint) or a record in it
    that cannot be used as it is."""


class MissingFileError(UserError, FileNotFoundError):
    """A file or directory the user named (or one that should be in it) is not there."""


class StorageUnavailableError(UserError, OSError):
    """Cloud storage kept failing with errors that usually pass (zoo.retry gave up): the
    message names the object and the last error; running again later is the fix."""


class AccessDeniedError(UserError, PermissionError):
    """Storage refused these credentials (HTTP 401/403, a local permission): the data may be
    whole; the message names the object and asks for access, never to delete anything."""


class LaunchError(UserError, RuntimeError):
    """The launcher's environment (SLURM_*, OMPI_COMM_WORLD_*, CUDA_VISIBLE_DEVICES, JAX_*)
    describes a process layout zoo cannot run: the message names the variables and the fix."""


def message(error: BaseException) -> str:
    """The error's text: str(error), except a lone string argument is shown as written (a
    KeyError would quote it)."""
    if len(error.args) == 1 and isinstance(error.args[0], str):
        return error.args[0]
    return str(error)


def debugging() -> bool:
    """ZOO_DEBUG is set to something other than '', '0' or 'false': show every traceback."""
    return os.environ.get("ZOO_DEBUG", "").strip().lower() not in ("", "0", "false")


def find(error: BaseException | None) -> UserError | None:
    """The first UserError raised in `error`'s chain (its causes and contexts), or None: what
    a library that wraps errors in its own (absl and ml_collections around a config file,
    which even paste the traceback into the message) was handed."""
    found, seen = None, set()
    while error is not None and id(error) not in seen:
        if isinstance(error, UserError):
            found = error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return found


# Called with this process's failure, one line, when a command's entry point ends with it; a hook
# may return a line to print last instead (zoo.train.hosts.lost_hosts: in a multi-process run it
# publishes the failure to the others, and names a peer's failure that came first and caused
# this one).
failure_hooks: list[Callable[[str], str | None]] = []


def _tell_failure(line: str) -> str | None:
    last = None
    for hook in failure_hooks:
        try:
            last = hook(line) or last
        except Exception:  # noqa: BLE001 - a hook must never hide the failure itself
            pass
    return last


@contextlib.contextmanager
def reported(prefix: str = "error") -> Iterator[None]:
    """Around a command-line entry point: a UserError raised inside prints `<prefix>: <message>`
    on stderr, with no traceback, and exits with status 1; with ZOO_DEBUG=1 it propagates with
    its traceback. Every other exception propagates untouched (a bug keeps its traceback),
    unless another process's failure is known to have come first: then its traceback is
    printed, the line naming that process last, and the exit status is 1 (failure_hooks)."""
    try:
        yield
    except UserError as e:
        cause = _tell_failure(" ".join(message(e).split()))
        if debugging():
            raise
        sys.stdout.flush()  # what the job printed comes first
        print(f"{prefix}: {message(e)}", file=sys.stderr, flush=True)
        if cause:
            print(cause, file=sys.stderr, flush=True)
        sys.exit(1)
    except Exception as e:
        cause = _tell_failure(f"{type(e).__name__}: {' '.join(message(e).split())[:500]}")
        if cause is None or debugging():
            raise
        sys.stdout.flush()
        traceback.print_exc()
        print(cause, file=sys.stderr, flush=True)
        sys.exit(1)
