"""The fused CPU LSTM (RNN backend='cpu_fused', zoo/nn/kernels/lstm_cpu.cc through XLA's FFI):
outputs, carries and every gradient against float64 references, on shapes that exercise the
kernel's tiling (hidden sizes off its 16-lane blocks, batches off its 6-row tiles), padding,
both directions, initial carries, thread counts, a mesh of 8 devices, and its build."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.nn.recurrent_cases import (bidirectional_loss, random_params,
                                      sharded_bidirectional_lstm)
from tests.numerics import assert_close
from zoo.errors import ConfigError
from zoo.nn import cpu_lstm
from zoo.nn.kernels import build
from zoo.nn.recurrent import RNN, Bidirectional, StackedRNN


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def reference_lstm(p, x, lengths, carry0, reverse):
    """Float64 numpy LSTM: ((c, h) final, outputs (B, T, H)), a padded step keeping the carry
    and giving 0, `reverse` reading each row from its last valid step."""
    w, u, b = (np.asarray(p[k], np.float64) for k in ("input_kernel", "recurrent_kernel", "bias"))
    x = np.asarray(x, np.float64)
    batch, steps, _ = x.shape
    c, h = (np.asarray(v, np.float64).copy() for v in carry0)
    out = np.zeros((batch, steps, u.shape[0]))
    for t in (reversed(range(steps)) if reverse else range(steps)):
        z = np.einsum("bd,dgh->bgh", x[:, t], w) + np.einsum("bk,kgh->bgh", h, u) + b
        i, f, o = _sigmoid(z[:, 0]), _sigmoid(z[:, 1]), _sigmoid(z[:, 3])
        c_new = f * c + i * np.tanh(z[:, 2])
        h_new = o * np.tanh(c_new)
        keep = (t < np.asarray(lengths))[:, None]
        c, h = np.where(keep, c_new, c), np.where(keep, h_new, h)
        out[:, t] = np.where(keep, h_new, 0.0)
    return (c, h), out


CASES = [  # (batch, steps, features, hidden, lengths or None, reverse)
    (2, 5, 6, 8, None, False),             # one partial block of 16 units
    (3, 7, 5, 20, [7, 0, 3], True),        # a full block + a partial one; a length-0 row
    (13, 4, 9, 48, None, True),            # 13 rows: tiles of 6, 6 and 1; three whole blocks
    (7, 9, 16, 37, [9, 1, 5, 9, 2, 8, 4], False),
    (1, 1, 3, 16, None, False),            # one step, one row
]


def _inputs(batch, steps, features, hidden, seed=0):
    rng = np.random.default_rng(seed)
    params = {"input_kernel": rng.normal(scale=0.5, size=(features, 4, hidden)),
              "recurrent_kernel": rng.normal(scale=0.5, size=(hidden, 4, hidden)),
              "bias": rng.normal(scale=0.5, size=(4, hidden))}
    x = rng.normal(size=(batch, steps, features))
    carry0 = (rng.normal(size=(batch, hidden)), rng.normal(size=(batch, hidden)))
    out_weights = rng.normal(size=(batch, steps, hidden))
    return params, x, carry0, out_weights


def _grads(backend, reverse, lengths, params, x, carry0, out_weights, dtype):
    """Gradients w.r.t. params, x and the initial carry of a loss reading every output and the
    final carry nonlinearly, through RNN with `backend` in `dtype`; and the outputs/carry."""
    model = RNN(hidden_size=params["bias"].shape[1], reverse=reverse, backend=backend,
                dtype=dtype)
    cast = lambda tree: jax.tree.map(lambda a: jnp.asarray(a, dtype), tree)
    lengths = None if lengths is None else jnp.asarray(lengths)

    def loss(p, x, c0):
        out, carry = model.apply({"params": {"cell": p}}, x, lengths, c0)
        final = sum(jnp.sum(jnp.sin(c)) for c in carry)
        return jnp.sum(out * cast(out_weights)) + final, (out, carry)

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(
        cast(params), cast(x), cast(carry0))


@pytest.mark.slow
@pytest.mark.parametrize("batch,steps,features,hidden,lengths,reverse", CASES)
def test_outputs_and_gradients_equal_float64_references(batch, steps, features, hidden, lengths,
                                                        reverse):
    params, x, carry0, out_weights = _inputs(batch, steps, features, hidden)
    grads, (out, carry) = _grads("cpu_fused", reverse, lengths, params, x, carry0, out_weights,
                                 jnp.float32)
    full = [steps] * batch if lengths is None else lengths
    ref_carry, ref_out = reference_lstm(params, x, full, carry0, reverse)
    assert_close((out, carry), (ref_out, ref_carry), 1e-5)
    # Gradients: the scan backend in float64 (itself proven against float64 numpy and finite
    # differences in test_recurrent*.py) on the same values.
    with jax.enable_x64(True):
        ref_grads, (ref_out64, _) = _grads("scan", reverse, lengths, params, x, carry0,
                                           out_weights, jnp.float64)
        ref_grads, ref_out64 = jax.tree.map(np.asarray, (ref_grads, ref_out64))
    assert_close(ref_out64, ref_out, 1e-12)
    assert_close(grads, ref_grads, 1e-5)


def test_padded_rows_equal_each_sequence_alone_and_get_no_gradient():
    params, x, carry0, _ = _inputs(3, 6, 4, 24, seed=3)
    lengths = jnp.array([6, 2, 4])
    model = RNN(hidden_size=24, backend="cpu_fused")
    variables = {"params": {"cell": jax.tree.map(jnp.asarray, params)}}
    x = jnp.asarray(x, jnp.float32)
    out, _ = jax.jit(model.apply)(variables, x, lengths)
    for b, n in enumerate([6, 2, 4]):
        alone, _ = jax.jit(model.apply)(variables, x[b:b + 1, :n])
        assert_close(out[b, :n], alone[0], 1e-6, err_msg=f"row {b}")
        assert not np.any(np.asarray(out[b, n:]))
    grad_x = jax.grad(lambda x: jnp.sum(model.apply(variables, x, lengths)[0] ** 2))(x)
    for b, n in enumerate([6, 2, 4]):
        assert not np.any(np.asarray(grad_x[b, n:]))


def test_any_thread_count_gives_the_same_bits(monkeypatch):
    # Each hidden unit is computed by one thread with the same instructions, whatever the split.
    params, x, carry0, out_weights = _inputs(5, 6, 7, 80, seed=1)
    results = []
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("ZOO_LSTM_THREADS", threads)  # read when the kernel call is traced
        results.append(_grads("cpu_fused", True, [6, 3, 0, 5, 6], params, x, carry0,
                              out_weights, jnp.float32))
    for other in results[1:]:
        jax.tree.map(np.testing.assert_array_equal, other, results[0])


def test_a_bad_thread_count_names_the_variable(monkeypatch):
    monkeypatch.setenv("ZOO_LSTM_THREADS", "two")
    x = jnp.zeros((2, 3, 4))
    with pytest.raises(ConfigError, match="ZOO_LSTM_THREADS='two' must be a whole number"):
        RNN(hidden_size=8, backend="cpu_fused").init(jax.random.key(0), x)


def test_jit_equals_no_jit_and_stacks_equal_the_scan():
    x = jnp.asarray(np.random.default_rng(2).normal(size=(4, 5, 6)), jnp.float32)
    lengths = jnp.array([5, 0, 3, 2])
    for make in (lambda b: Bidirectional(hidden_size=18, backend=b),
                 lambda b: StackedRNN(num_layers=2, hidden_size=12, backend=b)):
        fused, scan = make("cpu_fused"), make("scan")
        params = {"params": random_params(scan, x, lengths=lengths)}
        eager = fused.apply(params, x, lengths)
        jitted = jax.jit(fused.apply)(params, x, lengths)
        assert_close(eager, jitted, 1e-6)
        expected = jax.jit(scan.apply)(params, x, lengths)
        assert_close(jitted, expected, 1e-5)


def test_sharded_over_8_devices_equals_one_device():
    model, x, lengths, host, params, mesh, rules = sharded_bidirectional_lstm()
    fused = Bidirectional(hidden_size=model.hidden_size, cell="lstm", backend="cpu_fused")

    step = jax.jit(jax.value_and_grad(bidirectional_loss(fused, lengths), argnums=(0, 1)))
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        sharded = step(params, x)
        hlo = step.lower(params, x).as_text()
    single = step(host, x)
    assert hlo.count("zoo_lstm_forward") == 2  # one kernel call per direction, under shard_map
    assert_close(sharded, single, 1e-5)


@pytest.mark.parametrize("kw,match", [
    ({"cell": "gru"}, "plain LSTM only"),
    ({"cell": "lstm", "peephole": True}, "plain LSTM only"),
    ({"cell": "lstm", "dtype": jnp.bfloat16}, "float32 only"),
])
def test_what_the_kernel_cannot_compute_is_a_config_error(kw, match):
    x = jnp.zeros((2, 3, 4))
    with pytest.raises(ConfigError, match=match):
        RNN(hidden_size=8, backend="cpu_fused", **kw).init(jax.random.key(0), x)


@pytest.fixture
def kernel_cache(monkeypatch, tmp_path):
    """An empty kernel cache directory, and build.compiled's in-process cache cleared before
    and after (each test then sees a fresh process's first call)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ZOO_KERNEL_CACHE", str(cache))
    build.compiled.cache_clear()
    yield cache
    build.compiled.cache_clear()


def test_a_missing_compiler_is_one_error_saying_what_to_do(monkeypatch, kernel_cache):
    monkeypatch.setenv("CXX", "/no/such/c++")
    with pytest.raises(ConfigError) as error:
        build.compiled("lstm_cpu.cc")
    text = str(error.value)
    assert "lstm_cpu.cc" in text and "/no/such/c++" in text
    assert "C++20 compiler" in text and "backend='scan'" in text
    assert not kernel_cache.exists()  # nothing half-written left behind


def test_a_compile_error_shows_the_compilers_message(monkeypatch, tmp_path, kernel_cache):
    sources = tmp_path / "sources"
    sources.mkdir()
    (sources / "broken.cc").write_text("int broken( {\n")
    monkeypatch.setattr(build, "SOURCES", sources)
    with pytest.raises(ConfigError) as error:
        build.compiled("broken.cc")
    assert "broken.cc" in str(error.value) and "error" in str(error.value)
    assert list(kernel_cache.iterdir()) == []  # the failed build left nothing behind


def test_an_unwritable_cache_says_which_variable_to_set(monkeypatch, tmp_path, kernel_cache):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("ZOO_KERNEL_CACHE", str(blocked / "kernels"))
    with pytest.raises(ConfigError, match="cannot be cached in .*a-file.*ZOO_KERNEL_CACHE"):
        build.compiled("lstm_cpu.cc")


@pytest.mark.slow
def test_the_library_is_built_once_per_source_and_cpu(monkeypatch, kernel_cache):
    build.compiled("lstm_cpu.cc")
    (library,) = kernel_cache.iterdir()
    built = library.stat().st_mtime_ns
    build.compiled.cache_clear()
    build.compiled("lstm_cpu.cc")  # a new process: found in the cache, not rebuilt
    assert list(kernel_cache.iterdir()) == [library]
    assert library.stat().st_mtime_ns == built
    monkeypatch.setattr(build, "_cpu_features", lambda: "flags : another cpu")
    build.compiled.cache_clear()
    build.compiled("lstm_cpu.cc")  # another CPU: its own library
    assert len(list(kernel_cache.iterdir())) == 2


def test_an_empty_sequence_returns_the_initial_carry_and_passes_its_gradient():
    model = RNN(hidden_size=20, backend="cpu_fused")
    x = jnp.zeros((2, 0, 3))
    params = random_params(RNN(hidden_size=20), jnp.zeros((2, 1, 3)))
    carry0 = (jnp.ones((2, 20)), jnp.full((2, 20), 2.0))
    out, carry = model.apply({"params": params}, x, None, carry0)
    assert out.shape == (2, 0, 20)
    jax.tree.map(np.testing.assert_array_equal, carry, carry0)
    grad = jax.grad(lambda c: jnp.sum(model.apply({"params": params}, x, None, c)[1][1] * 3.0))(
        carry0)
    np.testing.assert_array_equal(grad[0], 0.0)
    np.testing.assert_array_equal(grad[1], 3.0)


def test_the_kernel_is_refused_off_the_cpu(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    with pytest.raises(ConfigError, match="backend='cudnn' on a GPU"):
        cpu_lstm.check_platform()
