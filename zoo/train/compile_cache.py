"""JAX's persistent compilation cache, on by default: a restarted (preempted, resumed, relaunched)
run loads its compiled train / eval programs from disk instead of compiling them again.

The cache key covers the lowered program (shardings and donation included), the jax and XLA
versions, the devices and XLA_FLAGS, so an entry is only reused for the very same program on the
same kind of machine; a program compiled elsewhere (another mesh, another config) simply misses.
In a multi-process run only process 0 writes entries; every process reads them.
"""

import os

import jax
import ml_collections
from jax.experimental.compilation_cache import compilation_cache

from zoo import paths
from zoo.errors import ConfigError

OFF = "off"
SUBDIR = "compile_cache"


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
    if path is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    if not paths.is_remote(path):
        os.makedirs(path, exist_ok=True)
    changed = jax.config.jax_compilation_cache_dir != path
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", path)
    # JAX's default keeps only programs that took a second to compile; a restart pays for every
    # small one too (eval, predict, init), and they add up.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_secs))
    # -1: no size floor, and none chosen for us by the file system.
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    if changed:
        # JAX opens its cache once, at the first compile: another run in this process (a test,
        # a notebook) with another directory must reopen it there.
        compilation_cache.reset_cache()
    return path
