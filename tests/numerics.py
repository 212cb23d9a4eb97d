"""Float comparisons that hold on any machine: every tensor is compared against its own largest
value, not entry by entry.

Two float32 computations of the same function (blockwise against einsum, sharded against one
device, jit against eager, ours against torch or float64) differ by their order of operations
and their math functions' rounding, and both change with the CPU (vector width), the thread
split, XLA's code generator and its version. The error that leaves is a few units of float32
rounding *of the largest values the sums went through*, so an
entry near zero can be off by ~1e-6 of the tensor's largest entry while being relatively far off
itself. A bare `atol` on entries of arbitrary magnitude, or an `rtol` per entry, is then a
tolerance tuned to one machine (issue 27: a gradient leaf with values up to ~40 failed
atol=rtol=2e-5 on an entry of 0.056, on another CPU). Here the bound is

    |actual - desired| <= tol * max(|desired|)     for each tensor (each leaf of a pytree)

so `tol` says how many of the tensor's own largest units of rounding a test allows.
"""

from __future__ import annotations

import jax
import numpy as np


def _scaled_error(actual, desired, scale):
    actual = np.asarray(actual, np.float64)
    desired = np.asarray(desired, np.float64)
    if actual.shape != desired.shape:
        return f"shapes differ: {actual.shape} (actual) vs {desired.shape} (desired)"
    # Non-finite entries (masked logits at -inf, say) must match exactly and are then left out.
    finite = np.isfinite(desired)
    same_nonfinite = (actual == desired) | (np.isnan(actual) & np.isnan(desired))
    if not np.all(finite | same_nonfinite) or not np.all(np.isfinite(actual[finite])):
        bad = np.argwhere(~(finite & np.isfinite(actual)) & ~same_nonfinite)[0]
        return (f"non-finite entries differ, first at {tuple(bad)}: "
                f"{actual[tuple(bad)]} (actual), {desired[tuple(bad)]} (desired)")
    if not np.any(finite):
        return None
    if scale is None:
        scale = float(np.max(np.abs(desired[finite])))
    error = np.zeros(desired.shape)
    error[finite] = np.abs(actual[finite] - desired[finite])
    return scale, error


def assert_close(actual, desired, tol, *, scale=None, err_msg=""):
    """Asserts |actual - desired| <= tol * scale for every entry of every leaf.

    Args:
      actual: an array, a scalar or a pytree of them.
      desired: the same structure (the reference: float64, or the other backend's float32).
      tol: the allowed error as a fraction of the scale.
      scale: the scale of every leaf; by default each leaf's own largest |desired| entry. Pass
        one to compare a tensor against a documented scale of the test (say the inputs' size),
        e.g. when the reference is all zeros.
      err_msg: said first in the failure message.
    """
    # An array against a list of numbers (or the reverse) is one tensor, not a pytree.
    if isinstance(actual, (np.ndarray, jax.Array)) or isinstance(desired, (np.ndarray, jax.Array)):
        actual, desired = np.asarray(actual), np.asarray(desired)
    leaves_a, tree_a = jax.tree_util.tree_flatten_with_path(actual)
    leaves_d, tree_d = jax.tree_util.tree_flatten_with_path(desired)
    if tree_a != tree_d:
        raise AssertionError(f"{err_msg}: the trees differ:\n{tree_a}\n{tree_d}")
    for (path, a), (_, d) in zip(leaves_a, leaves_d):
        where = " ".join(s for s in (err_msg, jax.tree_util.keystr(path)) if s)
        result = _scaled_error(a, d, scale)
        if result is None:
            continue
        if isinstance(result, str):
            raise AssertionError(f"{where}: {result}")
        leaf_scale, error = result
        bound = tol * leaf_scale
        if np.all(error <= bound):
            continue
        worst = np.unravel_index(np.argmax(error), error.shape)
        a, d = np.asarray(a, np.float64), np.asarray(d, np.float64)
        raise AssertionError(
            f"{where}: {int(np.sum(error > bound))} of {error.size} entries differ by more "
            f"than tol {tol:g} x scale {leaf_scale:.6g} = {bound:.3g}; the largest, at "
            f"{tuple(int(i) for i in worst)}: {a[worst]:.9g} (actual) vs {d[worst]:.9g} "
            f"(desired), {error[worst] / max(leaf_scale, 1e-300):.3g} of the scale")


def assert_params_close(actual, desired, tol, *, err_msg=""):
    """assert_close of a model's parameters or gradients (pytrees), each leaf against its own
    largest value, except the attention key projection's bias (a `['key']['bias']` leaf): its
    gradient is 0 in exact arithmetic (the softmax ignores a shift shared by all of a query's
    logits), so its gradient, and the parameter it moves from its zero init, is rounding noise
    of the sums behind the other gradients; that leaf is measured against the largest value of
    the whole tree (also when boxed, as `['key']['bias'].value`)."""
    actual, desired = jax.device_get(actual), jax.device_get(desired)
    largest = max((float(np.max(np.abs(d))) for d in jax.tree.leaves(desired) if np.size(d)),
                  default=0.0)
    if jax.tree.structure(actual) != jax.tree.structure(desired):
        assert_close(actual, desired, tol, err_msg=err_msg)  # raises, naming both trees
    for (path, a), d in zip(jax.tree_util.tree_leaves_with_path(actual), jax.tree.leaves(desired)):
        # The dict keys alone: a boxed parameter (nn.Partitioned) adds `.value` after them.
        keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        where = " ".join(s for s in (err_msg, jax.tree_util.keystr(path)) if s)
        assert_close(a, d, tol, scale=largest if keys[-2:] == ["key", "bias"] else None,
                     err_msg=where)
