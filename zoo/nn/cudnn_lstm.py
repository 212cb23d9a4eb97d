"""cuDNN's LSTM (through `jax.experimental.rnn`) as a backend of `zoo.nn.recurrent.RNN`.

`RNN(cell="lstm", backend="cudnn")` keeps our parameters (input_kernel (D, 4, H),
recurrent_kernel (H, 4, H), bias (4, H); gate order i, f, g, o as cuDNN's) and packs them, on
every call and differentiably, into the one flat float32 vector cuDNN reads. Layout, from
jax.experimental.rnn's module docstring (one layer, one direction):

    [ W_ih (4H, D) | W_hh (4H, H) | b_ih (4H,) | b_hh (4H,) ]      rows gate-major: i, f, g, o

    W_ih = input_kernel.transpose(1, 2, 0).reshape(4H, D)      (torch's weight_ih_l0)
    W_hh = recurrent_kernel.transpose(1, 2, 0).reshape(4H, H)  (torch's weight_hh_l0)
    b_ih = bias.reshape(4H), b_hh = 0                           (ours is their sum)

Semantics kept equal to the scan backend: float32 matmuls without TF32 (precision=HIGHEST: with
the default precision jax.experimental.rnn lets cuDNN use TF32); outputs zero past each length;
the final carry taken at each sequence's last valid step and equal to the initial carry for a
length-0 sequence (cuDNN runs it for one step, which is then discarded); `reverse=True` reads
each sequence backward within its own length, by reversing the valid prefix of every row before
and after the call.

Limits (a ConfigError names them): plain LSTM only (no peephole / coupled gates, no GRU or
Elman: cuDNN's GRU is not exposed by jax.experimental.rnn), float32 compute only, a GPU. The
cuDNN call is one opaque custom call: it cannot be sharded over a mesh.

`jax.experimental.rnn.lstm` cannot even be traced without the CUDA plugin, so on CPU the
packing is tested through `reference=True`, which feeds the same packed vector to
`jax.experimental.rnn.unpack_lstm_weights` + `lstm_ref`, the module's plain-XLA reference.
"""

import jax
import jax.numpy as jnp
from jax.experimental import rnn as jax_rnn

from zoo.errors import ConfigError

Array = jax.Array


def check_supported(cell: str, peephole: bool, coupled: bool, dtype) -> None:
    """Raises ConfigError unless cuDNN (via jax.experimental.rnn) can run this layer."""
    if cell != "lstm" or peephole or coupled:
        raise ConfigError(
            f"RNN backend='cudnn' runs the plain LSTM only (jax.experimental.rnn exposes no other "
            f"cuDNN cell); got cell={cell!r}, peephole={peephole}, coupled={coupled}. "
            "Use backend='scan'.")
    if jnp.dtype(dtype) != jnp.float32:
        raise ConfigError(
            f"RNN backend='cudnn' computes in float32 only (jax.experimental.rnn); got "
            f"dtype={jnp.dtype(dtype).name}. Use dtype=float32 or backend='scan'.")


def check_platform() -> None:
    """Raises ConfigError when this process has no GPU for cuDNN."""
    platform = jax.default_backend()
    if platform not in ("gpu", "cuda", "rocm"):
        raise ConfigError(
            f"cudnn RNN needs a GPU: RNN backend='cudnn' calls cuDNN through "
            f"jax.experimental.rnn, and this process runs JAX on {platform!r}. "
            "Use backend='scan' (the default) here.")


def pack_weights(input_kernel: Array, recurrent_kernel: Array, bias: Array) -> Array:
    """Our (D, 4, H), (H, 4, H), (4, H) LSTM parameters as cuDNN's flat float32 vector."""
    d, gates, h = input_kernel.shape
    w_ih = input_kernel.transpose(1, 2, 0).reshape(gates * h, d)  # (4H, D), rows i|f|g|o
    w_hh = recurrent_kernel.transpose(1, 2, 0).reshape(gates * h, h)  # (4H, H)
    b_ih = bias.reshape(gates * h)
    parts = [w_ih.ravel(), w_hh.ravel(), b_ih, jnp.zeros_like(b_ih)]
    return jnp.concatenate([p.astype(jnp.float32) for p in parts])


def flip_within_lengths(x: Array, lengths: Array) -> Array:
    """Reverses the first lengths[b] steps of every row of x (B, T, ...); padding stays put."""
    steps = jnp.arange(x.shape[1])[None, :]  # (1, T)
    n = lengths[:, None]  # (B, 1)
    index = jnp.where(steps < n, n - 1 - steps, steps)  # (B, T), an involution
    index = index.reshape(index.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, index, axis=1)


def lstm(w: dict[str, Array], x: Array, carry: tuple[Array, Array], lengths: Array | None, *,
         reverse: bool = False, reference: bool = False) -> tuple[tuple[Array, Array], Array]:
    """One LSTM layer through cuDNN: x (B, T, D) -> ((c, h) final, outputs (B, T, H) float32).

    Args:
      w: the LSTMCell's `weights(D)` (input_kernel, recurrent_kernel, bias).
      carry: (c, h), each (B, H) float32.
      lengths: (B,) valid lengths, or None for all T.
      reverse: read each sequence from its last valid step to its first.
      reference: run jax.experimental.rnn.lstm_ref (plain XLA, any platform) on the same packed
        weights instead of cuDNN; for tests.
    """
    if not reference:
        check_platform()
    batch, steps, features = x.shape
    hidden = w["recurrent_kernel"].shape[0]
    lengths = (jnp.full((batch,), steps, jnp.int32) if lengths is None
               else jnp.asarray(lengths, jnp.int32))
    x = x.astype(jnp.float32)
    if reverse:
        x = flip_within_lengths(x, lengths)
    flat = pack_weights(w["input_kernel"], w["recurrent_kernel"], w["bias"])
    c0, h0 = carry
    seq_lengths = jnp.maximum(lengths, 1)  # a length-0 row runs one step, undone below
    layer = dict(input_size=features, hidden_size=hidden, num_layers=1, dropout=0.0,
                 bidirectional=False)
    if reference:
        w_ih, w_hh, b_ih, b_hh = jax_rnn.unpack_lstm_weights(
            flat, features, hidden, num_layers=1, bidirectional=False)
        y, h_n, c_n = jax_rnn.lstm_ref(x, h0[None], c0[None], w_ih, w_hh, b_ih, b_hh,
                                       seq_lengths, features, hidden, 1, 0.0, False)
    else:
        y, h_n, c_n = jax_rnn.lstm(x, h0[None], c0[None], flat, seq_lengths, **layer,
                                   precision=jax.lax.Precision.HIGHEST)
    valid = jnp.arange(steps)[None, :] < lengths[:, None]  # (B, T)
    y = jnp.where(valid[..., None], y, 0.0)
    if reverse:
        y = flip_within_lengths(y, lengths)
    empty = (lengths == 0)[:, None]
    return (jnp.where(empty, c0, c_n[0]), jnp.where(empty, h0, h_n[0])), y
