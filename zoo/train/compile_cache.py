"""JAX's persistent compilation cache, on by default: a restarted (preempted, resumed, relaunched)
run loads its compiled train / eval programs from disk instead of compiling them again.

The cache key covers the lowered program (shardings and donation included), the jax and XLA
versions, the devices and XLA_FLAGS, so an entry is only reused for the very same program on the
same kind of machine; a program compiled elsewhere (another mesh, another config) simply misses.
In a multi-process run only process 0 writes entries; every process reads them.

Two things JAX leaves to its user, done here:
- A bound (config.train.compilation_cache_max_gb, default 10) on a local cache: JAX's own
  least-recently-used eviction (jax_compilation_cache_max_size). It keeps an access time
  beside each entry and reads it for every entry when it evicts; entries written while the
  cache was unbounded have none, so they are given the oldest one (evicted first) when the
  bound is set.
- Repair: JAX reads a damaged entry (a truncated write, a flipped bit), warns, compiles the
  program again, and then writes nothing, because the entry's name is taken: every later run
  warns and compiles again. Here an entry that fails to decompress or deserialize is deleted
  as it fails, so the fresh compile writes it anew. A read that fails for want of the storage
  (OSError: a dropped connection) deletes nothing.
"""

import os

import jax
import ml_collections
from jax.experimental.compilation_cache import compilation_cache

from zoo import paths
from zoo.errors import ConfigError

OFF = "off"
SUBDIR = "compile_cache"
DEFAULT_MAX_GB = 10.0
# The names JAX's LRU cache (jax._src.lru_cache) gives an entry and its access time.
_ENTRY, _ACCESS_TIME = "-cache", "-atime"


def directory(train_cfg: ml_collections.ConfigDict, workdir: str) -> str | None:
    """Where compiled programs are kept: config.train.compilation_cache_dir (local or gs://),
    else $JAX_COMPILATION_CACHE_DIR when set (one cache shared by every run on the machine),
    else <workdir>/compile_cache; None for 'off'."""
    value = train_cfg.get("compilation_cache_dir", "")
    if not isinstance(value, str):
        raise ConfigError(f"config.train.compilation_cache_dir={value!r} must be a path ('' = "
                          f"<workdir>/{SUBDIR}, '{OFF}' = no cache)")
    if value == OFF:
        return None
    if value:
        paths.check_remote(value, "config.train.compilation_cache_dir")
        return value
    return os.environ.get("JAX_COMPILATION_CACHE_DIR") or paths.join(workdir, SUBDIR)


def enable(train_cfg: ml_collections.ConfigDict, workdir: str) -> str | None:
    """Points JAX's persistent cache at `directory(...)`; must run before the first compile it
    should serve (a program compiled earlier in this process is not written). Returns the
    directory (None: the cache is off)."""
    path = directory(train_cfg, workdir)
    min_secs = train_cfg.get("compilation_cache_min_compile_secs", 0.0)
    if not isinstance(min_secs, (int, float)) or min_secs < 0:
        raise ConfigError(f"config.train.compilation_cache_min_compile_secs={min_secs!r} must be "
                          "a number of seconds >= 0 (0 = keep every compiled program)")
    max_gb = train_cfg.get("compilation_cache_max_gb", DEFAULT_MAX_GB)
    if isinstance(max_gb, bool) or not isinstance(max_gb, (int, float)) or max_gb < 0:
        raise ConfigError(f"config.train.compilation_cache_max_gb={max_gb!r} must be a size in "
                          f"GB >= 0 (0 = no bound; default {DEFAULT_MAX_GB:g})")
    if path is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    if not paths.is_remote(path):
        os.makedirs(path, exist_ok=True)
    # JAX's eviction locks the directory with a local lock file: on gs:// it would create a
    # local 'gs:/...' directory and lock nothing across hosts. A bucket bounds its cache with an
    # object lifecycle rule instead (docs/guides/cloud-storage.md).
    max_bytes = int(max_gb * 2**30) if max_gb > 0 and not paths.is_remote(path) else -1
    changed = (jax.config.jax_compilation_cache_dir != path
               or jax.config.jax_compilation_cache_max_size != max_bytes)
    if max_bytes > 0:
        _give_access_times(path)
    _repair_damaged_entries()
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_compilation_cache_max_size", max_bytes)
    # JAX's default keeps only programs that took a second to compile; a restart pays for every
    # small one too (eval, predict, init), and they add up.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_secs))
    # -1: no size floor, and none chosen for us by the file system.
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    if changed:
        # JAX opens its cache once, at the first compile: another run in this process (a test,
        # a notebook) with another directory or bound must reopen it there.
        compilation_cache.reset_cache()
    return path


def _give_access_times(path: str) -> None:
    """An access time for every entry without one (written while the cache was unbounded):
    the oldest, 0, so JAX's eviction, which reads one for every entry, takes them first."""
    names = set(paths.list_names(path))
    for name in names:
        key = name[:-len(_ENTRY)] if name.endswith(_ENTRY) else None
        if key and key + _ACCESS_TIME not in names:
            paths.as_path(paths.join(path, key + _ACCESS_TIME)).write_bytes(bytes(8))


def _repair_damaged_entries() -> None:
    """Wraps JAX's cache read (once per process) so that an entry which fails to decompress or
    deserialize is deleted as it fails (module docstring); JAX then warns, compiles and writes
    the entry again."""
    from jax._src import compilation_cache as jax_cache

    read = jax_cache.get_executable_and_time
    if getattr(read, "zoo_repairs", False):
        return

    def read_or_delete(cache_key, *args, **kwargs):
        try:
            return read(cache_key, *args, **kwargs)
        except OSError:
            raise  # the storage, not the entry
        except Exception:
            directory = jax.config.jax_compilation_cache_dir
            if directory and jax.process_index() == 0:  # the process that writes entries
                for suffix in (_ENTRY, _ACCESS_TIME):
                    entry = paths.as_path(paths.join(directory, cache_key + suffix))
                    if entry.exists():
                        entry.unlink()
            raise

    read_or_delete.zoo_repairs = True
    jax_cache.get_executable_and_time = read_or_delete
