"""JAX's persistent compilation cache, on by default: a restarted (preempted, resumed, relaunched)
run loads its compiled train / eval programs from disk instead of compiling them again.

The cache key covers the lowered program (shardings and donation included), the jax and XLA
versions, the devices and XLA_FLAGS, so an entry is only reused for the very same program on the
same kind of machine; a program compiled elsewhere (another mesh, another config) simply misses.
In a multi-process run only process 0 writes entries; every process reads them.

Two things JAX leaves to its user, done here:
- A bound (config.train.compilation_cache_max_gb, default 10) on a local cache, least recently
  used first, applied once as each run starts: a read that hits marks its entry used (its
  modification time), and `enable` deletes the longest-unused entries until the rest fit. A
  run's own new programs may take the cache past the bound until the next start. Not JAX's
  eviction (jax_compilation_cache_max_size): it scans and reads every entry's access-time file
  under a lock on every write, and a write fails outright on an entry another, unbounded
  process wrote (it has no access-time file): on a shared cache of thousands of entries that
  cost a tenth of a second per compile and lost entries (CI's numerics tier ran 48 minutes).
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
# The names JAX gives an entry and, under its own eviction, the entry's access time.
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
    # A bucket bounds its cache with an object lifecycle rule (docs/guides/cloud-storage.md).
    if max_gb > 0 and not paths.is_remote(path):
        _trim(path, int(max_gb * 2**30))
    changed = (jax.config.jax_compilation_cache_dir != path
               or jax.config.jax_compilation_cache_max_size != -1)
    _wrap_reads()
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_compilation_cache_max_size", -1)  # no per-write scan (docstring)
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


def _trim(path: str, max_bytes: int) -> None:
    """Deletes the entries used longest ago (oldest modification time) until the rest fit in
    max_bytes. Another process may be trimming or writing too: a file already gone is skipped."""
    entries, total = [], 0
    with os.scandir(path) as found:
        for entry in found:
            if entry.name.endswith(_ENTRY):
                try:
                    stat = entry.stat()
                except FileNotFoundError:
                    continue
                entries.append((stat.st_mtime, entry.name, stat.st_size))
                total += stat.st_size
    for _, name, size in sorted(entries):
        if total <= max_bytes:
            break
        # The access-time file, if JAX's own eviction ever ran on this directory, goes with it.
        for doomed in (name, name[:-len(_ENTRY)] + _ACCESS_TIME):
            try:
                os.unlink(os.path.join(path, doomed))
            except FileNotFoundError:
                pass
        total -= size


def _wrap_reads() -> None:
    """Wraps JAX's cache read (once per process): a hit on a local cache marks its entry used
    (for `_trim`), and an entry which fails to decompress or deserialize is deleted as it fails
    (module docstring); JAX then warns, compiles and writes the entry again."""
    from jax._src import compilation_cache as jax_cache

    read = jax_cache.get_executable_and_time
    if getattr(read, "zoo_repairs", False):
        return

    def read_or_delete(cache_key, *args, **kwargs):
        try:
            found = read(cache_key, *args, **kwargs)
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
        directory = jax.config.jax_compilation_cache_dir
        if found[0] is not None and directory and not paths.is_remote(directory):
            try:
                os.utime(os.path.join(directory, cache_key + _ENTRY))
            except OSError:  # trimmed by another process meanwhile; the program is read
                pass
        return found

    read_or_delete.zoo_repairs = True
    jax_cache.get_executable_and_time = read_or_delete
