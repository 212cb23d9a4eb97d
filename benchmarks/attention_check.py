"""`python -m benchmarks.attention_check`: every attention backend this device has, against the
einsum backend, in float32 and bfloat16, forward and gradients (the first stage of
benchmarks.smoke).

The reference is zoo's einsum backend in float32 at matmul precision 'highest'. Every case runs
one `MultiHeadAttention` layer (the parameters are shared: the backends differ only in how they
attend) at BERT-base's head shape, forward and `jax.grad` of a fixed projection of its output
with respect to the parameters and the input, under the platform's default matmul precision
(TF32 may be in play for float32 on a GPU; that is what training runs with). Errors are
max |x - ref| / max |ref| per array, the largest over the output (forward) and over the input
and every parameter gradient (backward).

Masks: padding (rows of different lengths), causal, packed causal documents with trailing
padding, a bidirectional local window, and a causal local window — each described by a
`MaskSpec`, which each backend evaluates or translates into its own form. A backend that cannot
express a mask says so with a ConfigError; that case is recorded as 'unsupported' with the
message, not as a failure. Any other exception is an 'error'.

On a CPU (`--allow-cpu`) the Pallas kernels run in interpret mode; cuDNN needs a GPU and is
skipped with the reason.

Writes attention_check.json and attention_check.md to benchmarks/results/<machine>/ (or
--out); exits 1 when any case is a mismatch or an error.
"""

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import machine
from zoo import errors
from zoo.errors import ConfigError
from zoo.nn.attention import MultiHeadAttention
from zoo.nn.masks import MaskSpec

# The backends each platform has, beside the einsum reference; on a CPU the Pallas kernels run in
# interpret mode (a check of the code, not of the hardware).
BACKENDS = {
    "gpu": ("einsum", "dot_product", "blockwise", "cudnn", "pallas_gpu"),
    "tpu": ("einsum", "dot_product", "blockwise", "splash"),
    "cpu": ("einsum", "dot_product", "blockwise", "pallas_gpu", "splash"),
}
MASKS = ("padding", "causal", "packed_causal", "window", "causal_window")
# Relative error bounds: float32 allows TF32 matmuls (10 mantissa bits, ~5e-4 per product, more
# after the softmax's exponent); bfloat16 has 8 mantissa bits. A wrong mask or a wrong block is
# an O(1) error, far above both.
TOLERANCE = {"float32": 1e-2, "bfloat16": 6e-2}
STATUSES = ("ok", "mismatch", "unsupported", "error")
FAILED = ("mismatch", "error")  # the statuses that make the check (and its stage) fail
SIZES = {
    # BERT-base's heads (12 x 64) at a length every kernel's blocks divide.
    "default": dict(batch=2, length=1024, heads=12, head_dim=64, block=512, window=128),
    # A test of the code on a CPU: a 2 x 2 block grid, so every kernel crosses a block edge.
    "tiny": dict(batch=2, length=256, heads=2, head_dim=64, block=128, window=32),
}


def mask_spec(kind: str, batch: int, length: int, window: int) -> MaskSpec:
    """The MaskSpec of a mask kind at [batch, length]."""
    positions = np.arange(length)[None, :]
    if kind == "padding":
        lengths = np.array([length - length // 4 * (b % 2) for b in range(batch)])[:, None]
        return MaskSpec.self_attention(jnp.asarray(positions < lengths, jnp.int32))
    if kind == "causal":
        return MaskSpec.self_attention(causal=True)
    if kind == "packed_causal":
        # Documents of 1/2, 1/4 and 1/8 of the row, then padding.
        bounds = np.cumsum([length // 2, length // 4, length // 8])
        segments = 1 + np.searchsorted(bounds, positions, side="right")
        segments = np.where(positions < bounds[-1], segments, 0).repeat(batch, axis=0)
        return MaskSpec.self_attention(jnp.asarray(segments, jnp.int32), causal=True,
                                       packed=True)
    if kind == "window":
        return MaskSpec.self_attention(window=(window, window))
    if kind == "causal_window":
        return MaskSpec.self_attention(causal=True, window=(window, 0))
    raise ValueError(f"unknown mask kind {kind!r}; known: {MASKS}")


def relative_error(got, ref, scale: float | None = None) -> float:
    """max |got - ref| / scale, the scale max |ref| unless given."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    scale = float(np.max(np.abs(ref))) if scale is None else scale
    return float(np.max(np.abs(got - ref))) / (scale if scale > 0 else 1.0)


def make_case(backend: str, dtype, spec: MaskSpec, size: dict, interpret: bool):
    """A jitted (params, x, cotangent) -> (output, (d params, d x)) for one backend."""
    layer = MultiHeadAttention(num_heads=size["heads"], head_dim=size["head_dim"],
                               backend=backend, block_q=size["block"], block_k=size["block"],
                               interpret=interpret, dtype=dtype)

    def loss(params, x, cotangent):
        out = layer.apply({"params": params}, x.astype(dtype), mask=spec)
        return jnp.sum(out.astype(jnp.float32) * cotangent), out

    def run(params, x, cotangent):
        (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
            params, x, cotangent)
        return out, grads

    return layer, jax.jit(run)


def compare(out, grads, ref_out, ref_grads) -> tuple[float, float]:
    """(forward error, backward error). A gradient whose reference is below 1e-4 of the largest
    is zero in exact arithmetic — the key projection's bias: softmax ignores a shift common to
    a query's logits — so its rounding noise is measured against the largest gradient."""
    forward = relative_error(out, ref_out)
    largest = max(float(np.max(np.abs(r))) for r in jax.tree.leaves(ref_grads))
    backward = 0.0
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        own = float(np.max(np.abs(r)))
        backward = max(backward, relative_error(g, r, own if own >= 1e-4 * largest else largest))
    return forward, backward


def run_checks(size_name: str = "default", backends: Sequence[str] | None = None,
               dtypes: Sequence[str] = ("float32", "bfloat16"),
               masks: Sequence[str] = MASKS) -> dict:
    """Runs every (backend, dtype, mask) case; returns {platform, device_kind, size, tolerance,
    cases: [{backend, dtype, mask, status, forward_error, backward_error, seconds, message}]}."""
    size = SIZES[size_name]
    device = jax.devices()[0]
    platform = device.platform
    backends = tuple(backends or BACKENDS.get(platform, ("einsum", "dot_product", "blockwise")))
    interpret = platform == "cpu"
    width = size["heads"] * size["head_dim"]
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((size["batch"], size["length"], width)), jnp.float32)
    cotangent = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)
    cases = []
    for mask in masks:
        spec = mask_spec(mask, size["batch"], size["length"], size["window"])
        ref_layer, ref_run = make_case("einsum", jnp.float32, spec, size, interpret=False)
        params = ref_layer.init(jax.random.key(0), x, mask=spec)["params"]
        with jax.default_matmul_precision("highest"):
            ref_out, ref_grads = jax.block_until_ready(ref_run(params, x, cotangent))
        for backend in backends:
            for dtype_name in dtypes:
                case = {"backend": backend, "dtype": dtype_name, "mask": mask}
                start = time.perf_counter()
                if backend == "cudnn" and platform != "gpu":
                    case.update(status="unsupported", message="cuDNN needs an NVIDIA GPU")
                else:
                    try:
                        _, run = make_case(backend, jnp.dtype(dtype_name), spec, size, interpret)
                        out, grads = jax.block_until_ready(run(params, x, cotangent))
                        forward, backward = compare(out, grads, ref_out, ref_grads)
                        tol = TOLERANCE[dtype_name]
                        ok = np.isfinite(forward) and np.isfinite(backward)
                        ok = ok and forward <= tol and backward <= tol
                        case.update(status="ok" if ok else "mismatch", forward_error=forward,
                                    backward_error=backward, tolerance=tol)
                    except ConfigError as e:  # the backend cannot express this mask
                        case.update(status="unsupported", message=str(e))
                    except Exception as e:  # noqa: BLE001 — a first contact records every failure
                        case.update(status="error", message=f"{type(e).__name__}: {e}"[:2000])
                case["seconds"] = time.perf_counter() - start
                print(case_line(case), flush=True)
                cases.append(case)
    return {"platform": platform, "device_kind": device.device_kind, "jax": jax.__version__,
            "size": dict(size, name=size_name), "tolerance": TOLERANCE,
            "interpret": interpret, "cases": cases,
            "counts": {s: sum(c["status"] == s for c in cases) for s in STATUSES},
            "failures": [f"{c['backend']} {c['dtype']} {c['mask']}: {c['status']}"
                         for c in cases if c["status"] in FAILED]}


def case_line(case: dict) -> str:
    errs = ""
    if "forward_error" in case:
        errs = f"forward {case['forward_error']:.2e} backward {case['backward_error']:.2e}"
    note = case.get("message", "").splitlines()[0][:100] if case.get("message") else ""
    return (f"{case['backend']:12s} {case['dtype']:9s} {case['mask']:14s} {case['status']:11s} "
            f"{errs}{note}")


def markdown(result: dict) -> str:
    size = result["size"]
    lines = [f"# Attention backends against einsum ({result['platform']} "
             f"{result['device_kind']}, jax {result['jax']})", "",
             f"batch {size['batch']}, length {size['length']}, {size['heads']} heads x "
             f"{size['head_dim']}, blocks {size['block']}, window {size['window']}; error = "
             f"max|x - ref| / max|ref| against einsum float32 at precision 'highest'; "
             f"tolerance {result['tolerance']}"
             + ("; Pallas kernels in interpret mode" if result["interpret"] else ""), "",
             "| backend | dtype | mask | status | forward | backward | s |",
             "|---|---|---|---|---|---|---|"]
    for c in result["cases"]:
        fwd = f"{c['forward_error']:.2e}" if "forward_error" in c else c.get("message", "")[:80]
        bwd = f"{c['backward_error']:.2e}" if "backward_error" in c else ""
        lines.append(f"| {c['backend']} | {c['dtype']} | {c['mask']} | {c['status']} | {fwd} | "
                     f"{bwd} | {c['seconds']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.attention_check",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="default")
    parser.add_argument("--backends", nargs="+", help="default: every backend of the platform")
    parser.add_argument("--masks", nargs="+", choices=MASKS, default=list(MASKS))
    parser.add_argument("--allow-cpu", action="store_true",
                        help="run on a CPU too (the Pallas kernels in interpret mode)")
    parser.add_argument("--out", help="output directory (default benchmarks/results/<machine>)")
    args = parser.parse_args(argv)
    platform = jax.devices()[0].platform
    if platform == "cpu" and not args.allow_cpu:
        print("attention_check: skipped: the jax backend is cpu; this checks a GPU's or TPU's "
              "kernels (--allow-cpu runs it here, the Pallas kernels interpreted)", flush=True)
        return 0
    known = sorted({b for bs in BACKENDS.values() for b in bs})
    unknown = [b for b in args.backends or () if b not in known]
    if unknown:
        raise ConfigError(f"--backends: unknown {unknown}; known: {known}")
    result = run_checks(args.size, args.backends, masks=args.masks)
    out = machine.results_dir(args.out)
    with open(os.path.join(out, "attention_check.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(out, "attention_check.md"), "w", encoding="utf-8") as f:
        f.write(markdown(result))
    print(f"attention_check: {result['counts']}; wrote attention_check.json and .md to {out}",
          flush=True)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    with errors.reported("benchmarks.attention_check"):
        sys.exit(main())
