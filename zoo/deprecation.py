"""Old spellings and old import paths that still work.

A renamed config value keeps the command lines users already have working: `notice` prints one
line on stderr the first time each is used, saying what to write instead (once per process, so
a loop reading the config every step does not flood the log). A module that moved keeps its old
import path: the old module is a shim of one call to `moved`, which warns once and makes the old
name the new module itself (same objects, so monkeypatching either path patches both, and
isinstance checks across them agree).
"""

import importlib
import runpy
import sys
import warnings

_noticed: set[str] = set()


def notice(message: str) -> None:
    """Prints `zoo: deprecated: <message>` to stderr, the first time this message is given."""
    if message in _noticed:
        return
    _noticed.add(message)
    print(f"zoo: deprecated: {message}", file=sys.stderr)


def moved(old: str, new: str) -> None:
    """Called as `moved(__name__, "zoo.new.path")` from the body of the module at the old path.

    Imported, the old name becomes an alias of `new` in sys.modules (importlib hands the importer
    whatever sys.modules holds once the module body ran). Run as `python -m old.path`, it runs
    `new` as __main__ instead, so an old command line keeps working.
    """
    if old == "__main__":
        # runpy: __spec__.name is the dotted path the user typed.
        name = getattr(sys.modules["__main__"].__spec__, "name", "the old path")
        warnings.warn(f"python -m {name} is deprecated: run python -m {new}",
                      DeprecationWarning, stacklevel=2)
        runpy.run_module(new, run_name="__main__", alter_sys=True)
        return
    # A module body runs once per process, so this warns once; stacklevel 3 names the importer's
    # frame as well as importlib's frames allow (the message names both paths anyway).
    warnings.warn(f"{old} moved to {new}; import {new} instead",
                  DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)
