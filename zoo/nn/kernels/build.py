"""Compiles a C++ kernel of this folder into a shared library, once per machine, and loads it.

Why on first use and not at `pip install`: the library is built with `-march=native` for the
CPU it will run on (the LSTM kernel is written for 512-bit vectors and needs the machine's FMA
units to be fast), and the install stays pure Python. The library is cached under
`$ZOO_KERNEL_CACHE` (default `~/.cache/zoo/kernels`), keyed by the source, the compiler, its
flags, XLA's FFI headers and the CPU's features, so a home directory shared by machines of
different CPUs never loads a library built for another one. Concurrent builds (test workers,
the processes of one host) each write a temporary file and rename it into place.
"""

import ctypes
import functools
import hashlib
import os
import pathlib
import platform
import shlex
import subprocess
import tempfile

import jax

from zoo.errors import ConfigError

SOURCES = pathlib.Path(__file__).parent
FLAGS = ("-O3", "-march=native", "-std=c++20", "-shared", "-fPIC", "-pthread")


def cache_dir() -> pathlib.Path:
    """Where compiled kernels are kept: $ZOO_KERNEL_CACHE or ~/.cache/zoo/kernels."""
    default = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
    return pathlib.Path(os.environ.get("ZOO_KERNEL_CACHE", default / "zoo" / "kernels"))


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CXX", "c++"))


def _cpu_features() -> str:
    """The CPU's feature flags (what -march=native compiles for), or the processor's name."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.machine() + platform.processor()


_RNN_HINT = "or choose the portable backend (RNN backend='scan')"


def _fail(source: pathlib.Path, what: str, hint: str) -> ConfigError:
    root = pathlib.Path(__file__).parents[3]  # above zoo/
    where = source.relative_to(root) if source.is_relative_to(root) else source
    return ConfigError(
        f"{where} could not be built: {what}. It needs a C++20 compiler (g++ or clang++; "
        f"`apt-get install g++`, or set CXX to one); {hint}.")


@functools.cache
def compiled(name: str, directory: pathlib.Path | None = None, hint: str = _RNN_HINT
             ) -> ctypes.CDLL:
    """The shared library built from <directory>/<name> (zoo/nn/kernels/ by default), compiled
    here if not cached; `hint`: the way out when it cannot be, for the error."""
    source = (directory or SOURCES) / name
    include = jax.ffi.include_dir()
    compiler = _compiler()
    try:
        version = subprocess.run(compiler + ["--version"], capture_output=True, text=True,
                                 check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise _fail(source, f"no working C++ compiler {shlex.join(compiler)!r} ({e})",
                    hint) from None
    header = pathlib.Path(include, "xla", "ffi", "api", "ffi.h")
    key = hashlib.sha256()
    for part in (source.read_bytes(), header.read_bytes(), version.encode(),
                 " ".join(FLAGS).encode(), _cpu_features().encode()):
        key.update(part)
    target = cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                built = pathlib.Path(tmp, target.name)
                command = compiler + list(FLAGS) + ["-I", include, str(source), "-o", str(built)]
                result = subprocess.run(command, capture_output=True, text=True)
                if result.returncode != 0:
                    raise _fail(source, f"{shlex.join(command)} failed:\n"
                                        f"{result.stderr[-2000:]}", hint)
                os.replace(built, target)
        except OSError as e:
            raise ConfigError(
                f"{source.name} (built from {source.parent}) cannot be cached in {target.parent} "
                f"({e}); set ZOO_KERNEL_CACHE to a writable directory") from None
    return ctypes.cdll.LoadLibrary(str(target))
