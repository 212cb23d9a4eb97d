"""benchmarks.attention_check, the first stage of the accelerator suite, on this CPU: the masks it
describes are the masks meant, every backend passes at tiny sizes (the Pallas kernels
interpreted), a backend that computes something else is caught, and a kernel that cannot
express a mask is recorded as unsupported, not failed."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import attention_check


def _dense(kind: str, length: int = 16, window: int = 3) -> np.ndarray:
    return np.asarray(attention_check.mask_spec(kind, 2, length, window).dense(length, length))


def test_the_mask_kinds_are_the_masks_they_name():
    n, w = 16, 3
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    padding = _dense("padding")
    assert padding[0, 0].all()  # row 0 full length
    assert padding[1, 0, :12, :12].all() and not padding[1, 0, :, 12:].any()  # row 1: 12 of 16
    np.testing.assert_array_equal(_dense("causal")[0, 0], j <= i)
    np.testing.assert_array_equal(_dense("window")[0, 0], abs(i - j) <= w)
    np.testing.assert_array_equal(_dense("causal_window")[0, 0], (j <= i) & (i - j <= w))
    packed = _dense("packed_causal")[0, 0]
    segments = np.array([1] * 8 + [2] * 4 + [3] * 2 + [0] * 2)
    same = (segments[:, None] == segments[None, :]) & (segments[:, None] > 0)
    np.testing.assert_array_equal(packed, same & (j <= i))


def test_every_cpu_backend_matches_einsum_and_a_window_on_pallas_gpu_is_unsupported():
    result = attention_check.run_checks(
        "tiny", backends=("einsum", "blockwise", "pallas_gpu", "cudnn"), dtypes=("float32",),
        masks=("causal_window",))
    by_backend = {c["backend"]: c for c in result["cases"]}
    for backend in ("einsum", "blockwise"):
        case = by_backend[backend]
        assert case["status"] == "ok", case
        assert case["forward_error"] < 1e-5 and case["backward_error"] < 1e-5, case
    assert by_backend["pallas_gpu"]["status"] == "unsupported"
    assert "local windows" in by_backend["pallas_gpu"]["message"]
    assert by_backend["cudnn"] == {**by_backend["cudnn"], "status": "unsupported",
                                   "message": "cuDNN needs an NVIDIA GPU"}
    assert result["interpret"] is True and result["platform"] == "cpu"


def test_a_backend_that_computes_another_function_is_a_mismatch_and_exit_1(
        tmp_path, monkeypatch):
    real = attention_check.make_case

    def wrong_mask_for_blockwise(backend, dtype, spec, size, interpret):
        if backend == "blockwise":  # drops the mask, as a kernel with a mask bug would
            spec = attention_check.mask_spec("window", size["batch"], size["length"], 1)
        return real(backend, dtype, spec, size, interpret)

    monkeypatch.setattr(attention_check, "make_case", wrong_mask_for_blockwise)
    code = attention_check.main(["--allow-cpu", "--size", "tiny", "--backends", "blockwise",
                                 "einsum", "--masks", "padding", "--out", str(tmp_path)])
    assert code == 1
    saved = json.loads((tmp_path / "attention_check.json").read_text())
    status = {(c["backend"], c["dtype"]): c["status"] for c in saved["cases"]}
    assert status == {("blockwise", "float32"): "mismatch", ("blockwise", "bfloat16"): "mismatch",
                      ("einsum", "float32"): "ok", ("einsum", "bfloat16"): "ok"}
    assert saved["counts"] == {"ok": 2, "mismatch": 2, "unsupported": 0, "error": 0}
    assert saved["failures"] == ["blockwise float32 padding: mismatch",
                                 "blockwise bfloat16 padding: mismatch"]
    table = (tmp_path / "attention_check.md").read_text()
    assert "| blockwise | float32 | padding | mismatch |" in table


def test_a_key_bias_gradient_of_rounding_noise_is_measured_against_the_largest_gradient():
    ref = {"key_bias": jnp.array([1e-9, -1e-9]), "kernel": jnp.array([10.0, -20.0])}
    noisy = {"key_bias": jnp.array([1e-3, 0.0]), "kernel": jnp.array([10.0, -20.0])}
    forward, backward = attention_check.compare(jnp.ones(2), noisy, jnp.ones(2), ref)
    assert forward == 0.0 and backward == pytest.approx(1e-3 / 20.0)
    wrong = {"key_bias": ref["key_bias"], "kernel": jnp.array([10.0, -10.0])}
    assert attention_check.compare(jnp.ones(2), wrong, jnp.ones(2), ref)[1] == pytest.approx(0.5)


def test_on_a_cpu_without_allow_cpu_it_skips_with_one_line(tmp_path, capsys):
    assert attention_check.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "skipped: the jax backend is cpu" in out[0]
    assert not list(tmp_path.iterdir())
