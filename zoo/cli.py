"""What train.py and eval.py share: the --config/--workdir flags and multi-host start-up."""

import re
import sys
from collections.abc import Callable

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from zoo.train import distributed

_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and metrics.")
config_flags.DEFINE_config_file(
    "config", None, "configs/<job>.py[:variant]; override keys with --config.a.b=value",
    lock_config=True,  # an unknown --config.key is an error naming it, never silently ignored
)
flags.mark_flags_as_required(["config", "workdir"])


def _parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, with an unknown --config.key reported in one line: ml_collections raises
    a bare AttributeError from deep inside the override, which absl would print as a traceback
    ending in an escaped message."""
    try:
        return flags.FLAGS(argv)
    except AttributeError as e:
        overrides = [a.split("=")[0].lstrip("-") for a in argv[1:] if a.startswith("--config.")]
        # ml_collections names the unknown last part of the key, and the nearest known one.
        unknown = re.search(r"'(\w+)'", str(e))
        key = next((k for k in overrides if unknown and k.endswith("." + unknown.group(1))),
                   overrides[0] if overrides else "?")
        guess = re.search(r'Did you mean "(\w+)"', str(e))
        hint = f"; did you mean {key.rsplit('.', 1)[0]}.{guess.group(1)}?" if guess else ""
        print(f"FATAL Flags parsing error: unknown config key {key}{hint} (the keys are those "
              "the --config file defines)", file=sys.stderr)
        sys.exit(1)


def run(job: Callable[[ml_collections.ConfigDict, str], object]) -> None:
    """Parses flags and calls job(config, workdir) on every process."""

    def main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {argv[1:]}")
        # Orbax and grain log every save at INFO through absl; progress is ours to print.
        logging.set_verbosity(logging.WARNING)
        distributed.initialize()
        job(flags.FLAGS.config, _WORKDIR.value)

    app.run(main, flags_parser=_parse_flags)
