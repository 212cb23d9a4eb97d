"""Moved to zoo.models.encoder_decoder (a file named for what it holds)."""
from zoo.deprecation import moved; moved(__name__, "zoo.models.encoder_decoder")  # noqa: E702
