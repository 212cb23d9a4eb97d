"""The fused CPU LSTM (zoo/nn/kernels/lstm_cpu.cc) as a backend of `zoo.nn.recurrent.RNN`.

`RNN(cell="lstm", backend="cpu_fused")` keeps our parameters (input_kernel (D, 4, H),
recurrent_kernel (H, 4, H), bias (4, H)) and semantics (outputs zero past each length, the final
carry taken at the last valid step, `reverse` reading each sequence backward within its
length), and splits one layer's work between XLA and the kernel:

    XLA     xp = x W for all T steps                            one (T B, D) @ (D, 4H) matmul
    kernel  the recurrence: per step xp_t + b + h U, the gates, c and h  (forward, custom call)
    kernel  the reverse recurrence: per step the gate cotangents dz and dh = dz U^T  (backward)
    XLA     dW = X^T dz, dU = H_prev^T dz, db = sum dz, dx = dz W^T        four large matmuls

The kernel is compiled for this machine on first use (zoo.nn.kernels.build) and registered as
an XLA FFI target for the CPU platform. Limits (a ConfigError names them): the plain LSTM in
float32 on a CPU. On a mesh of several devices each device runs the kernel on its own batch
rows (`jax.shard_map`), as the Pallas attention kernels do.
"""

import functools
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from zoo.errors import ConfigError
from zoo.nn.kernels import build

Array = jax.Array
_FORWARD, _BACKWARD = "zoo_lstm_forward", "zoo_lstm_backward"


def check_supported(cell: str, peephole: bool, coupled: bool, dtype) -> None:
    """Raises ConfigError unless the fused CPU kernel computes this layer."""
    if cell != "lstm" or peephole or coupled:
        raise ConfigError(
            f"RNN backend='cpu_fused' runs the plain LSTM only; got cell={cell!r}, "
            f"peephole={peephole}, coupled={coupled}. Use backend='scan'.")
    if jnp.dtype(dtype) != jnp.float32:
        raise ConfigError(
            f"RNN backend='cpu_fused' computes in float32 only; got dtype="
            f"{jnp.dtype(dtype).name}. Use dtype=float32 or backend='scan'.")


def check_platform() -> None:
    """Raises ConfigError when this process does not run JAX on its CPU."""
    if jax.default_backend() != "cpu":
        raise ConfigError(
            f"RNN backend='cpu_fused' is a CPU kernel, and this process runs JAX on "
            f"{jax.default_backend()!r}: use backend='cudnn' on a GPU, 'scan' elsewhere.")


@functools.cache
def _register() -> None:
    library = build.compiled("lstm_cpu.cc")
    for name, symbol in ((_FORWARD, library.ZooLstmForward), (_BACKWARD, library.ZooLstmBackward)):
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(symbol), platform="cpu")


def _threads() -> int:
    """Threads per kernel call: $ZOO_LSTM_THREADS, else 0: the kernel takes every thread of
    XLA's intra-op pool (one per core), fewer for small layers (one per 1 MFLOP of a step's
    matmul)."""
    text = os.environ.get("ZOO_LSTM_THREADS", "0")
    if not text.isdigit():
        raise ConfigError(f"ZOO_LSTM_THREADS={text!r} must be a whole number of threads "
                          "(0 or unset: the kernel chooses)")
    return int(text)


def _per_shard(kernel, args, specs, out_specs):
    """kernel(*args) on each device's batch rows (shard_map) on a mesh of several devices.
    A spec names each axis of an array by one character: 'B' the batch (placed as act_batch
    is), '.' an axis every device holds whole."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return kernel(*args)
    (batch,) = nn.logical_to_mesh_axes(("act_batch",))
    resolve = lambda spec: PartitionSpec(*(batch if a == "B" else None for a in spec))
    return jax.shard_map(kernel, mesh=mesh, in_specs=tuple(resolve(s) for s in specs),
                         out_specs=tuple(resolve(s) for s in out_specs),
                         check_vma=False)(*args)


def _forward_call(xp, bias, u, c0, h0, valid, *, reverse):
    hidden = u.shape[0]

    def kernel(xp, bias, u, c0, h0, valid):
        b, t = valid.shape
        out = (jax.ShapeDtypeStruct((b, t, 4, hidden), jnp.float32),
               jax.ShapeDtypeStruct((b, t, hidden), jnp.float32),
               jax.ShapeDtypeStruct((b, t, hidden), jnp.float32))
        call = jax.ffi.ffi_call(_FORWARD, out, vmap_method="sequential")
        return call(xp, bias, u, c0, h0, valid, reverse=int(reverse), threads=_threads())

    return _per_shard(kernel, (xp, bias, u, c0, h0, valid),
                      ("B...", "..", "...", "B.", "B.", "B."), ("B...", "B..", "B.."))


def _backward_call(d_h_seq, d_c, d_h, acts, c_seq, c0, u, valid, *, reverse):
    hidden = u.shape[0]

    def kernel(d_h_seq, d_c, d_h, acts, c_seq, c0, u, valid):
        b, t = valid.shape
        out = (jax.ShapeDtypeStruct((b, t, 4, hidden), jnp.float32),
               jax.ShapeDtypeStruct((b, hidden), jnp.float32),
               jax.ShapeDtypeStruct((b, hidden), jnp.float32))
        call = jax.ffi.ffi_call(_BACKWARD, out, vmap_method="sequential")
        return call(d_h_seq, d_c, d_h, acts, c_seq, c0, u, valid, reverse=int(reverse),
                    threads=_threads())

    return _per_shard(kernel, (d_h_seq, d_c, d_h, acts, c_seq, c0, u, valid),
                      ("B..", "B.", "B.", "B...", "B..", "B.", "...", "B."),
                      ("B...", "B.", "B."))


def layer(reverse: bool):
    """One LSTM layer as f(weights, x (B, T, D), (c0, h0), valid (T, B) | None) ->
    ((c, h) final, outputs (B, T, H)), float32, with the kernel's hand-written VJP."""
    check_platform()
    _register()

    def final(seq, initial):
        if seq.shape[1] == 0:
            return initial
        return seq[:, 0] if reverse else seq[:, -1]  # the carry after the last step read

    @jax.custom_vjp
    def lstm(w, x, carry0, valid):
        return lstm_fwd(w, x, carry0, valid)[0]

    def lstm_fwd(w, x, carry0, valid):
        c0, h0 = carry0
        batch, steps = x.shape[:2]
        xp = jnp.einsum("btd,dgh->btgh", x, w["input_kernel"])  # (B, T, 4, H); + b in the kernel
        v8 = (jnp.ones((batch, steps), jnp.uint8) if valid is None
              else valid.T.astype(jnp.uint8))  # (B, T)
        acts, c_seq, h_seq = _forward_call(xp, w["bias"], w["recurrent_kernel"], c0, h0, v8,
                                           reverse=reverse)
        outputs = h_seq if valid is None else jnp.where(valid.T[:, :, None], h_seq, 0.0)
        carry = (final(c_seq, c0), final(h_seq, h0))
        return (carry, outputs), (w, x, acts, c_seq, h_seq, c0, h0, v8)

    def lstm_bwd(res, cotangents):
        w, x, acts, c_seq, h_seq, c0, h0, v8 = res
        (d_c, d_h), d_out = cotangents
        dz, d_c0, d_h0 = _backward_call(d_out.astype(jnp.float32), d_c, d_h, acts, c_seq, c0,
                                        w["recurrent_kernel"], v8, reverse=reverse)
        # The h each step read: the carries shifted one step against the reading order.
        if reverse:
            h_prev = jnp.concatenate([h_seq[:, 1:], h0[:, None]], axis=1)
        else:
            h_prev = jnp.concatenate([h0[:, None], h_seq[:, :-1]], axis=1)
        d_w = {  # float32, as `run` made every weight
            "input_kernel": jnp.einsum("btd,btgh->dgh", x, dz),
            "recurrent_kernel": jnp.einsum("btk,btgh->kgh", h_prev, dz),
            "bias": dz.sum((0, 1)),
        }
        d_x = jnp.einsum("btgh,dgh->btd", dz, w["input_kernel"])
        return d_w, d_x, (d_c0, d_h0), None

    lstm.defvjp(lstm_fwd, lstm_bwd)

    def run(w, x, carry0, valid):
        # float32 in (cast outside the custom VJP, whose cotangents must match its inputs).
        w = {k: w[k].astype(jnp.float32) for k in ("input_kernel", "recurrent_kernel", "bias")}
        carry0 = tuple(c.astype(jnp.float32) for c in carry0)
        return lstm(w, x.astype(jnp.float32), carry0, valid)

    return run
