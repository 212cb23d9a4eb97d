"""config.data.source, one vocabulary for every job: 'synthetic' (the seeded offline world,
the default), 'files' (your own files) or 'tfds' (a TFDS dataset prepared in a local data_dir).

Each reader's `load_split(data, split, cache_dir)` dispatches through `load_split` here, and a
synthetic split goes through `synthetic_file`: written once into the cache in the format a
user's file would have, then read back by the same reader, so the synthetic path tests the
loader users run.
"""

import os
from collections.abc import Callable, Sequence
from typing import TypeVar

import ml_collections

from zoo import paths
from zoo.errors import ConfigError

SYNTHETIC, FILES, TFDS = "synthetic", "files", "tfds"
SOURCES = (SYNTHETIC, FILES, TFDS)

T = TypeVar("T")


def _listed(names: Sequence[str]) -> str:
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def source_of(data: ml_collections.ConfigDict, accepted: Sequence[str] = SOURCES,
              key: str = "config.data.source") -> str:
    """config.data.source; a ConfigError naming the key and the values this job takes for
    anything else."""
    if data.source not in accepted:
        raise ConfigError(f"{key} must be {_listed(accepted)}, got {data.source!r}")
    return data.source


def split_file(data: ml_collections.ConfigDict, split: str, what: str) -> str:
    """The file config.data.train_file ('train') or eval_file (any other split) names; a
    ConfigError saying to give `what` when it is empty."""
    key = "train_file" if split == "train" else "eval_file"
    if not data[key]:
        raise ConfigError(f"config.data.{key} is empty; give {what} (config.data.source='files')")
    return data[key]


def synthetic_file(cache_dir: str, stem: str, split: str, extension: str,
                   splits: Callable[[], dict], write: Callable[[str, object], None]) -> str:
    """`<cache_dir>/<stem>-<split><extension>`, written once by write(path, splits()[split]).

    The stem holds every setting that shapes the data (seed, sizes, task), so another setting
    is another file and the same ones reuse it; `splits` is only called when the file is made.
    """
    return paths.write_once(os.path.join(cache_dir, f"{stem}-{split}{extension}"),
                            lambda tmp: write(tmp, splits()[split]))


def load_split(data: ml_collections.ConfigDict, *, synthetic: Callable[[], T],
               files: Callable[[], T], tfds: Callable[[], T] | None = None) -> T:
    """The result of the loader for config.data.source; a job without a TFDS loader takes
    'synthetic' or 'files' only, and its error says so."""
    loaders = {SYNTHETIC: synthetic, FILES: files, TFDS: tfds}
    return loaders[source_of(data, [s for s in SOURCES if loaders[s] is not None])]()
