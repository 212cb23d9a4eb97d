"""The matmul FLOPs a traced program executes, counted from its jaxpr: every dot_general (and
convolution) times the trip counts of the loops around it.

Why not `compiled.cost_analysis()['flops']`: XLA's cost analysis (XLA:CPU and the TPU
compiler alike, measured with jax 0.10.2) counts the body of a while loop once, so a model
whose layers run under `nn.scan` (BERT-base and GPT-2 here) is counted as if it had one
layer. The jaxpr of the train step still holds every loop's length, and after
`jax.value_and_grad` it holds the backward pass too, including the forward work that
rematerialisation repeats (a `checkpoint` recomputes its body in the backward pass) and what a
custom_vjp backward (blockwise attention) does. So this count is what the hardware is asked to
do (HFU's numerator); the models' analytic `flops_per_token` is the work the model needs (MFU's).
Elementwise ops are left out: matmuls are the FLOPs accelerators are rated in.
"""

import math

import jax
from jax.extend import core as jex_core


def _dot_flops(eqn) -> float:
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval
    out = eqn.outvars[0].aval
    return 2.0 * math.prod(out.shape) * math.prod(lhs.shape[d] for d in lhs_contract)


def _conv_flops(eqn) -> float:
    # Each output element sums input features x window positions: a kernel's size / its
    # output features.
    rhs = eqn.invars[1].aval
    out = eqn.outvars[0].aval
    out_features = rhs.shape[eqn.params["dimension_numbers"].rhs_spec[0]]
    return 2.0 * math.prod(out.shape) * math.prod(rhs.shape) / out_features


def _sub_jaxprs(eqn):
    """(jaxpr, times it runs per run of `eqn`) for each jaxpr an equation holds."""
    params = eqn.params
    if eqn.primitive.name == "scan":
        return [(params["jaxpr"], params["length"])]
    if eqn.primitive.name == "while":
        # A while's trip count is data: count the body once and say so (blockwise attention's
        # loops have static bounds and trace as scans; fori_loop with traced bounds lands here).
        return [(params["body_jaxpr"], 1), (params["cond_jaxpr"], 1)]
    if eqn.primitive.name == "cond":
        # The costliest branch (an upper bound: e.g. blockwise attention's skipped blocks).
        return [(max(params["branches"], key=count_jaxpr), 1)]
    found = []
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, jex_core.ClosedJaxpr):
                found.append((item, 1))
            elif isinstance(item, jex_core.Jaxpr):
                found.append((jex_core.ClosedJaxpr(item, ()), 1))
    return found


def count_jaxpr(closed) -> float:
    """Matmul FLOPs of one run of a (closed) jaxpr, loops included."""
    jaxpr = closed.jaxpr if hasattr(closed, "jaxpr") else closed
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            total += _dot_flops(eqn)
        elif name == "conv_general_dilated":
            total += _conv_flops(eqn)
        else:
            total += sum(times * count_jaxpr(sub) for sub, times in _sub_jaxprs(eqn))
    return total


def executed_flops(fn, *args) -> float:
    """Matmul FLOPs of one call fn(*args) over the whole (global) arrays; `args` may be
    ShapeDtypeStructs. Divide by the devices for a per-device figure."""
    return count_jaxpr(jax.make_jaxpr(fn)(*args))
