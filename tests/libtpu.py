"""Tests that run the real TPU compiler need libtpu, an optional install (~700 MB: the `tpu`
extra). Without it they skip with the reason; `.ci/run` installs it in a step of its own and
runs them there (`-m tpu_compiler`)."""

import importlib.util

import pytest

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None


def needs_libtpu(test):
    """Marks `test` tpu_compiler and skips it where libtpu is not installed."""
    skip = pytest.mark.skipif(not HAS_LIBTPU, reason="needs libtpu: pip install -e '.[tpu]' "
                              "(docs/guides/dry-run-and-compile.md)")
    return pytest.mark.tpu_compiler(skip(test))
