"""What train.py and eval.py share: the --config/--workdir flags, multi-host start-up, and the
command line's errors in one line (parse_flags; zoo.errors.reported around the job)."""

import os
import re
import sys
import textwrap
from collections.abc import Callable, Sequence

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from zoo import errors
from zoo.train.hosts import distributed

_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and metrics.")
config_flags.DEFINE_config_file(
    "config", None, "configs/<job>.py[:variant]; override keys with --config.a.b=value",
    lock_config=True,  # an unknown --config.key is an error naming it, never silently ignored
)
flags.mark_flags_as_required(["config", "workdir"])


def _unknown_config_key(error: AttributeError, argv: Sequence[str]) -> str:
    """ml_collections raises a bare AttributeError from deep inside an override of a key the
    config does not have; this names the --config key, and its suggestion, in one line."""
    overrides = [a.split("=")[0].lstrip("-") for a in argv[1:] if a.startswith("--config.")]
    # ml_collections names the unknown last part of the key, and the nearest known one.
    unknown = re.search(r"'(\w+)'", str(error))
    key = next((k for k in overrides if unknown and k.endswith("." + unknown.group(1))),
               overrides[0] if overrides else "?")
    guess = re.search(r'Did you mean "(\w+)"', str(error))
    hint = f"; did you mean {key.rsplit('.', 1)[0]}.{guess.group(1)}?" if guess else ""
    return f"unknown config key {key}{hint} (the keys are those the --config file defines)"


def _config_spec(argv: Sequence[str]) -> str:
    """The --config argument as given (configs/<job>.py[:variant])."""
    spec = ""
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            spec = arg.split("=", 1)[1]
        elif arg == "--config" and i + 1 < len(argv):
            spec = argv[i + 1]
    return spec


def _config_load_error(failure: BaseException, argv: Sequence[str]) -> errors.UserError:
    """What went wrong loading the --config file: the UserError the file raised, or a path
    that is not there (ml_collections reports that only once the config is first read)."""
    user = errors.find(failure)
    if user is not None:
        return user
    spec = _config_spec(argv)
    path = spec.split(":", 1)[0]
    if not os.path.exists(path):
        return errors.MissingFileError(
            f"--config={spec}: [Errno 2] No such file or directory: {path!r} (relative to "
            f"{os.getcwd()}); give a config file such as configs/gpt.py")
    return errors.ConfigError(f"--config={spec}: {' '.join(str(failure).split())}")


def _put_config_package_on_path(argv: Sequence[str]) -> None:
    """Makes the --config file's own package importable before ml_collections loads the file.

    configs/<job>.py imports its siblings as `from configs import common`; ml_collections loads
    the file by path, not as part of a package, so that import finds `configs` only if the
    checkout happens to be on sys.path (the current directory under `python -m`, train.py's
    directory). Run from anywhere else, `--config=/abs/path/configs/gpt.py` would fail with
    "No module named 'configs'". The directory above the file's outermost package (the one
    holding configs/) goes first on sys.path, so the file's own siblings are the ones imported,
    even where an installed zoo also ships a `configs` package.
    """
    path = _config_spec(argv).split(":", 1)[0]
    if not path or not os.path.isfile(path):
        return  # nothing to load: _config_load_error reports a missing file
    root = os.path.dirname(os.path.abspath(path))
    if not os.path.isfile(os.path.join(root, "__init__.py")):
        return  # a lone config file: its imports are its own business
    while os.path.isfile(os.path.join(os.path.dirname(root), "__init__.py")):
        root = os.path.dirname(root)  # a config in a sub-package: the outermost package
    parent = os.path.dirname(root)
    if parent not in sys.path:
        sys.path.insert(0, parent)


def parse_flags(fv: flags.FlagValues, argv: Sequence[str]) -> list[str]:
    """fv(argv), every mistake on the command line raised as one zoo.errors.UserError (no
    traceback of absl's or ml_collections' own): an unknown flag or a bad value, an unknown
    --config key, a --config file that is not there or that rejects its variant. The --config
    file's package is importable wherever the command runs (_put_config_package_on_path)."""
    _put_config_package_on_path(argv)
    try:
        remaining = fv(list(argv))
    except AttributeError as e:
        raise errors.ConfigError(_unknown_config_key(e, argv)) from None
    except flags.Error as e:
        # A UserError of the config file (an unknown variant) arrives wrapped twice, its
        # traceback pasted into the message: the error itself is what the user needs.
        user = errors.find(e)
        if user is not None:
            raise user from None
        raise errors.ConfigError(str(e)) from e
    except OSError as e:  # an override of a config whose file could not be loaded
        raise _config_load_error(e.__cause__ or e, argv) from None
    config = fv["config"].value if "config" in fv else None
    if config is not None and not isinstance(config, ml_collections.ConfigDict):
        try:  # ml_collections' stand-in for a config that failed to load re-raises on access
            config.lock()
        except OSError as e:
            raise _config_load_error(e.__cause__ or e, argv) from None
    return remaining


_HELP = ("-h", "-?", "-help", "--help", "-helpshort", "--helpshort", "-helpfull", "--helpfull")


def exit_if_help(fv: flags.FlagValues, argv: Sequence[str], usage: str) -> None:
    """For a command with flags of its own (app.run gives only absl's FLAGS a --help): --help
    (-h, --helpshort, --helpfull) prints `usage` and the flags on stdout, then exits 0."""
    if any(arg in _HELP for arg in argv[1:]):
        print(f"{usage.strip()}\n\nflags:{fv.get_help(include_special_flags=False)}",
              flush=True)
        sys.exit(0)


def _parse_global_flags(argv: Sequence[str]) -> list[str]:
    """parse_flags on absl's FLAGS, reported as absl reports a flag error (and exit 1)."""
    try:
        return parse_flags(flags.FLAGS, argv)
    except errors.UserError as e:
        if errors.debugging():
            raise
        message = errors.message(e)
        if "\n" in message:
            sys.stderr.write(f"FATAL Flags parsing error:\n{textwrap.indent(message, '  ')}\n")
        else:
            sys.stderr.write(f"FATAL Flags parsing error: {message}\n")
        sys.stderr.write("Pass --helpshort or --helpfull to see help on flags.\n")
        sys.exit(1)


def run(job: Callable[[ml_collections.ConfigDict, str], object]) -> None:
    """Parses flags and calls job(config, workdir) on every process; a zoo.errors.UserError
    prints its message alone (`error: ...`) and exits 1 (ZOO_DEBUG=1: with its traceback)."""

    def main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {argv[1:]}")
        # Orbax and grain log every save at INFO through absl; progress is ours to print.
        logging.set_verbosity(logging.WARNING)
        with errors.reported():
            distributed.initialize(flags.FLAGS.config)
            job(flags.FLAGS.config, _WORKDIR.value)

    app.run(main, flags_parser=_parse_global_flags)
