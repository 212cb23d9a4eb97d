"""The persistent compilation cache (zoo.train.compilation.compile_cache): on by default under the
workdir, and a restarted run in a fresh process compiles nothing: every program (the donated,
sharded train step included) is a cache hit."""

import os
import re
import warnings

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache as jax_compilation_cache

from tests.train import multihost
from zoo import paths
from zoo.errors import ConfigError
from zoo.train.compilation import compile_cache


def _train_cfg(**values):
    return ml_collections.ConfigDict({"compilation_cache_dir": "",
                                      "compilation_cache_min_compile_secs": 0.0, **values})


def test_directory_defaults_to_the_environment_then_the_workdir(monkeypatch):
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/shared/cache")
    assert compile_cache.directory(_train_cfg(), "/w") == "/shared/cache"
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
    assert compile_cache.directory(_train_cfg(), "/w") == "/w/compile_cache"
    assert compile_cache.directory(_train_cfg(), "gs://b/run") == "gs://b/run/compile_cache"
    assert compile_cache.directory(_train_cfg(compilation_cache_dir="/c"), "/w") == "/c"
    assert compile_cache.directory(_train_cfg(compilation_cache_dir="off"), "/w") is None
    with pytest.raises(ConfigError, match="compilation_cache_dir"):
        compile_cache.directory(_train_cfg(compilation_cache_dir=3), "/w")


def _run(workdir, steps):
    env = multihost.base_env(1, fast_compile=True)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the suite's shared cache: not this test's
    env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)  # the config's 0 must do it
    env["JAX_DEBUG_LOG_MODULES"] = "jax._src.compiler"  # hits and misses, on stderr
    proc, = multihost.launch(multihost.command(workdir, steps, every=2, keep=2), [env])
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return out, err


@pytest.mark.slow
def test_a_restarted_run_compiles_nothing(tmp_path):
    workdir = str(tmp_path / "run")
    cache = os.path.join(workdir, "compile_cache")
    _, err = _run(workdir, 2)
    first = set(os.listdir(cache))
    assert any(name.startswith("jit_train_step-") for name in first), sorted(first)
    assert "PERSISTENT COMPILATION CACHE MISS for 'jit_train_step'" in err

    out, err = _run(workdir, 4)  # resumes at step 2: the same programs, in a fresh process
    assert "starting at step 2 of 4" in out
    assert set(os.listdir(cache)) == first  # nothing new written
    assert "PERSISTENT COMPILATION CACHE MISS" not in err
    hits = set(re.findall(r"Persistent compilation cache hit for '(\w+)'", err))
    assert {"jit_init_state", "jit_train_step", "jit_eval_step"} <= hits, hits


@pytest.fixture
def restores_jax_cache():
    before = {name: getattr(jax.config, name) for name in (
        "jax_compilation_cache_dir", "jax_enable_compilation_cache",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes", "jax_compilation_cache_max_size")}
    yield
    for name, value in before.items():
        jax.config.update(name, value)
    jax_compilation_cache.reset_cache()


def test_a_cache_in_a_bucket_is_written_and_read(gcs, restores_jax_cache):
    cache = f"gs://{gcs.bucket()}/run/compile_cache"
    assert compile_cache.enable(_train_cfg(compilation_cache_dir=cache), "/unused") == cache

    def program(x):
        return jnp.sin(x) * 3.25 + 0.5  # a program no other test compiles

    expected = program(np.arange(7.0))
    np.testing.assert_allclose(jax.jit(program)(jnp.arange(7.0)), expected, rtol=1e-6)
    names = paths.list_names(cache)
    assert any(n.startswith("jit_program-") for n in names), names
    # Read back: with this process's in-memory caches emptied, the program comes from the bucket.
    jax.clear_caches()
    jax_compilation_cache.reset_cache()
    hits = []

    def listen(event, **kwargs):
        if event == "/jax/compilation_cache/cache_hits":
            hits.append(event)

    jax.monitoring.register_event_listener(listen)
    try:
        np.testing.assert_allclose(jax.jit(program)(jnp.arange(7.0)), expected, rtol=1e-6)
    finally:
        jax.monitoring.unregister_event_listener(listen)
    assert hits, "the bucket's entry was not read"


@pytest.fixture
def fresh_cache(tmp_path, restores_jax_cache):
    """zoo's cache in a new directory, with this process's in-memory programs forgotten."""
    jax.config.update("jax_compilation_cache_max_size", -1)

    def enable(**values):
        path = compile_cache.enable(_train_cfg(compilation_cache_dir=str(tmp_path / "cc"),
                                               **values), "/unused")
        jax.clear_caches()
        return path

    yield enable
    jax.config.update("jax_compilation_cache_max_size", -1)


def _entries(path):
    return {n: os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)
            if n.endswith("-cache")}


def test_a_damaged_entry_is_compiled_and_written_again(fresh_cache):
    path = fresh_cache()

    def program(x):
        return jnp.cos(x) * 1.75 - 0.25  # a program no other test compiles

    expected = np.cos(np.arange(5.0)) * 1.75 - 0.25
    jax.jit(program)(jnp.arange(5.0))
    (name, size), = ((n, s) for n, s in _entries(path).items() if n.startswith("jit_program-"))
    with open(os.path.join(path, name), "r+b") as f:
        f.truncate(size // 2)  # a write cut short
    for attempt in range(2):
        jax.clear_caches()
        jax_compilation_cache.reset_cache()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            np.testing.assert_allclose(jax.jit(program)(jnp.arange(5.0)), expected, rtol=1e-6)
        damaged = [w for w in caught if "Error reading persistent compilation cache" in
                   str(w.message)]
        # The first read finds the damage (JAX warns and compiles); the entry is written anew,
        # so the second read is clean. Before, every run warned and compiled again.
        assert len(damaged) == (1 if attempt == 0 else 0), [str(w.message) for w in caught]
    assert _entries(path)[name] > size // 2  # whole again (its compile time may differ)


def _recompile(fn, x):
    """fn compiled in this process as a new run would: from the persistent cache, if there."""
    jax.clear_caches()
    jax_compilation_cache.reset_cache()
    return jax.jit(fn)(x)


def test_the_cache_is_trimmed_least_recently_used_first_as_a_run_starts(fresh_cache):
    path = fresh_cache(compilation_cache_max_gb=0)  # unbounded
    programs = [lambda x, i=i: jnp.tanh(x) * (i + 2.5) for i in range(3)]
    names = []
    for i, program in enumerate(programs):
        before = set(_entries(path))
        jax.jit(program)(np.arange(3.0 + i))  # numpy: no iota program
        names.append(*(set(_entries(path)) - before))
        os.utime(os.path.join(path, names[-1]), (1000.0 * (i + 1),) * 2)  # written long ago
    _recompile(programs[0], np.arange(3.0))  # a later run reads the oldest: now it is in use
    sizes = _entries(path)
    # Room for two of the three: the one unused longest (the second) goes.
    fresh_cache(compilation_cache_max_gb=(sum(sizes.values()) - 1) / 2**30)
    assert set(_entries(path)) == {names[0], names[2]}


def test_a_bounded_cache_keeps_writing_beside_entries_of_unbounded_processes(fresh_cache):
    path = fresh_cache(compilation_cache_max_gb=1)
    # Another process on the same cache ($JAX_COMPILATION_CACHE_DIR) with no bound writes its
    # entries without the access-time files of JAX's eviction. Under that eviction every later
    # write here failed (FileNotFoundError, a warning) and its program was compiled every run.
    with open(os.path.join(path, "jit_elsewhere-0123-cache"), "wb") as f:
        f.write(bytes(64))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jax.jit(lambda x: jnp.cosh(x) * 0.375)(jnp.arange(6.0))
    assert not [w for w in caught if "compilation cache" in str(w.message)]
    assert any(n.startswith("jit__lambda") for n in _entries(path))


@pytest.mark.parametrize("value", [-1, "10", True])
def test_a_bad_bound_names_the_key(value, tmp_path):
    with pytest.raises(ConfigError, match="compilation_cache_max_gb"):
        compile_cache.enable(_train_cfg(compilation_cache_max_gb=value), str(tmp_path))


def test_a_bucket_cache_is_left_to_its_lifecycle_rule(gcs, restores_jax_cache, tmp_path,
                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)  # JAX's eviction would make a local 'gs:' lock directory here
    cache = f"gs://{gcs.bucket()}/run/compile_cache"
    compile_cache.enable(_train_cfg(compilation_cache_dir=cache), "/unused")
    assert jax.config.jax_compilation_cache_max_size == -1
    jax.jit(lambda x: jnp.sinh(x) * 0.625)(jnp.arange(4.0))
    assert os.listdir(tmp_path) == []
