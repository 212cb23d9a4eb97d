"""What train.py and eval.py share: the --config/--workdir flags and multi-host start-up."""

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


def run(job: Callable[[ml_collections.ConfigDict, str], object]) -> None:
    """Parses flags and calls job(config, workdir) on every process."""

    def main(argv):
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {argv[1:]}")
        # Orbax and grain log every save at INFO through absl; progress is ours to print.
        logging.set_verbosity(logging.WARNING)
        distributed.initialize()
        job(flags.FLAGS.config, _WORKDIR.value)

    app.run(main)
