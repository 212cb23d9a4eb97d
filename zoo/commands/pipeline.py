"""Moved to zoo.commands.stages (jobs of several stages; "pipeline" is the data's)."""
from zoo.deprecation import moved; moved(__name__, "zoo.commands.stages")  # noqa: E702
