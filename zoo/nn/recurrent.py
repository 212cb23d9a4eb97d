"""Recurrent layers over whole sequences: `RNN` (one direction), `Bidirectional` and
`StackedRNN`, over the cells of zoo.nn.recurrent_cells (Elman, LSTM plain / peephole /
coupled, GRU), padding-aware.

`RNN` runs a cell's input projection and its recurrence under one `jax.custom_vjp`
(`_layer`): the forward pass is one big matmul over all T steps, then a `lax.scan` of the
per-step `(B, H) @ (H, G, H)` matmul and gate maths; the backward pass is a reverse scan that
carries only the state's cotangent, and every weight gradient is one matmul over all T B rows
after the loop (autodiff of the scan adds an (H, B) @ (B, G, H) product into dU at every step).
The cells' one-step API (`weights` / `project` / `step`) stays for decoders that feed one token
at a time and for zoo.models.rnnlm's scan with state resets. On a GPU, backend="cudnn" runs
cuDNN's LSTM instead (zoo.nn.cudnn_lstm); on a CPU, backend="cpu_fused" runs zoo's own fused
LSTM kernel (zoo.nn.cpu_lstm: the recurrence in C++ through XLA's FFI, ~1.6x the scan's speed).
"""

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.errors import ConfigError
from zoo.nn import cpu_lstm, cudnn_lstm
from zoo.nn.recurrent_cells import Array, Carry, Cell, Dtype, make_cell

# "scan": lax.scan + our VJP, every cell, any platform; "cudnn": cuDNN's LSTM (zoo.nn.cudnn_lstm);
# "cpu_fused": our C++ LSTM kernel for CPUs (zoo.nn.cpu_lstm).
BACKENDS = ("scan", "cudnn", "cpu_fused")
_OUT_AXES = ("act_batch", "act_len", "act_rnn_hidden")


class RNN(nn.Module):
    """Runs a cell over a padded batch: x (B, T, D) -> (outputs (B, T, H), final carry).

    Padding-aware: a sequence's carry stops changing after its length, so the final carry is the
    state at its last valid step, and its outputs past the length are exactly zero. With
    `reverse=True` each sequence is read backward *within its own length* (position
    lengths-1 first; padding never enters the state), outputs aligned with the input positions.

    Attributes:
      hidden_size: H.
      cell: 'lstm', 'gru' or 'rnn' (Elman).
      reverse: read each sequence from its last valid position to its first.
      peephole, coupled: LSTM variants (see `LSTMCell`).
      activation: the Elman cell's nonlinearity.
      unroll: steps per `lax.scan` iteration, forward and backward (results are equal). 1 by
        default: on XLA:CPU 2 and 4 measured no faster (benchmarks.step, LSTM n 128 d 256).
      backend: 'scan' (default; every cell, every platform, shardable), 'cudnn' (a GPU, plain
        float32 LSTM: cuDNN through jax.experimental.rnn, same parameters and outputs; see
        zoo.nn.cudnn_lstm) or 'cpu_fused' (a CPU, plain float32 LSTM: zoo's fused C++ kernel,
        same parameters and outputs, compiled on first use; see zoo.nn.cpu_lstm).
    """

    hidden_size: int
    cell: str = "lstm"
    reverse: bool = False
    peephole: bool = False
    coupled: bool = False
    activation: Callable[[Array], Array] = jnp.tanh
    unroll: int = 1
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    backend: str = "scan"

    @nn.compact
    def __call__(
        self, x: Array, lengths: Array | None = None, initial_carry: Carry | None = None
    ) -> tuple[Array, Carry]:
        """Runs the cell over every sequence of the batch.

        Args:
          x: (B, T, D) inputs.
          lengths: (B,) valid lengths, or None when every sequence fills all T steps.
          initial_carry: a cell carry for batch B (e.g. an encoder's final state), or None for
            zeros.

        Returns:
          outputs (B, T, H) in `dtype`, zero past each length; the final carry (float32), taken
          at each sequence's last valid step.
        """
        if x.ndim != 3:
            raise ValueError(f"RNN: x must be (batch, time, features), got shape {x.shape}")
        batch, steps, features = x.shape
        if lengths is not None and jnp.shape(lengths) != (batch,):
            raise ValueError(f"RNN: lengths must have shape ({batch},), got {jnp.shape(lengths)}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"RNN: backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.backend == "cudnn":
            cudnn_lstm.check_supported(self.cell, self.peephole, self.coupled, self.dtype)
        if self.backend == "cpu_fused":
            cpu_lstm.check_supported(self.cell, self.peephole, self.coupled, self.dtype)
        cell = make_cell(
            self.cell,
            self.hidden_size,
            peephole=self.peephole,
            coupled=self.coupled,
            activation=self.activation,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            name="cell",
        )
        w = cell.weights(features)  # fetched and cast once, outside the loop
        if initial_carry is None:
            carry = cell.initialize_carry(batch)
        else:
            carry = jax.tree.map(lambda c: jnp.asarray(c, cell.carry_dtype), initial_carry)
        if self.backend == "cudnn":
            carry, outputs = cudnn_lstm.lstm(w, x, carry, lengths, reverse=self.reverse)
            return nn.with_logical_constraint(outputs.astype(self.dtype), _OUT_AXES), carry
        # (T, B): step t is real for sequence b iff t < lengths[b].
        valid = None if lengths is None else (
            jnp.arange(steps)[:, None] < jnp.asarray(lengths)[None, :])
        if self.backend == "cpu_fused":
            layer = cpu_lstm.layer(self.reverse)
        else:
            layer = _layer(cell, self.reverse, self.unroll, x.dtype)
        carry, outputs = layer(w, x, carry, valid)
        return nn.with_logical_constraint(outputs, _OUT_AXES), carry


def _masked_gates(cell: Cell, valid_t: Array | None):
    """`cell.gates` where a padded step (valid_t False) keeps its carry and outputs zeros."""

    def gates(w, carry, xp_t, hp_t):
        new, h = cell.gates(w, carry, xp_t, hp_t)
        if valid_t is None:
            return new, h
        keep = valid_t[:, None]  # (B, 1)
        new = jax.tree.map(lambda n, o: jnp.where(keep, n, o), new, carry)
        return new, jnp.where(keep, h, 0)

    return gates


def _split_weights(w: dict[str, Array]):
    """(input kernel, recurrent kernel, bias, the element-wise rest: peepholes, GRU's b_h)."""
    rest = {k: v for k, v in w.items() if k not in ("input_kernel", "recurrent_kernel", "bias")}
    return w["input_kernel"], w["recurrent_kernel"], w["bias"], rest


def _project(cell: Cell, kernel: Array, x: Array) -> tuple[Array, Array]:
    """x (B, T, D) -> (x time-major (T, B, D) in `dtype`, x W (T, B, G, H), bias not added).

    Time-major first (a (B, T, D) copy, D-wide) so the projection, and in the backward pass dW
    and dx, are plain (T B, D) matmuls with no (T, B, G, H) transpose around them.
    """
    xt = jnp.swapaxes(x, 0, 1).astype(cell.dtype)
    xp = jnp.einsum("tbd,dgh->tbgh", xt, kernel, preferred_element_type=cell.carry_dtype)
    xp = nn.with_logical_constraint(
        xp.astype(cell.dtype), ("act_len", "act_batch", None, "act_rnn_hidden"))
    return xt, xp


def _layer(cell: Cell, reverse: bool, unroll: int, x_dtype: Dtype):
    """The whole layer as one function of (weights, x (B, T, D), carry0, valid (T, B) | None)
    -> (final carry, outputs (B, T, H) in `dtype`), with a hand-written VJP.

    Forward: the input projection for all steps, then a `lax.scan` whose body is the one
    (B, H) @ (H, G, H) matmul plus the cell's element-wise gates (the bias is added there,
    fused, instead of in a separate pass over (T, B, G, H)).

    Backward: autodiff of that scan (its compiled loop body, read off XLA:CPU's HLO) does, at
    every reverse step, an (H, B) @ (B, G H) matmul for that step's share of dU, adds it into
    the (H, G, H) accumulator (1 MB read and written per step at H = 256) and re-copies U^T for
    dh. Here the reverse scan only carries the state's
    cotangent (one (B, G H) @ (G H, H) matmul and the gates' VJP per step) and stacks the gate
    pre-activation gradients dZ (T, B, G, H); every weight gradient is then ONE large matmul
    over all T B rows after the loop: dU = H_prev^T dZ, dW = X^T dZ, dx = dZ W^T, db = sum dZ.

    Residuals: the carries after every step (their shift is the carry entering each step) and
    the gate pre-activations z = x W + b + h U (additive cells) or x W and h U separately (GRU).
    """

    def forward_scan(w, xp, carry0, valid, keep_residuals):
        _, kernel_hh, bias, rest = _split_weights(w)

        def body(carry, inputs):
            xp_t, valid_t = inputs
            xb = xp_t.astype(cell.carry_dtype) + bias  # (B, G, H)
            hp = cell.recurrent_projection({"recurrent_kernel": kernel_hh}, cell.hidden(carry))
            new, h = _masked_gates(cell, valid_t)(rest, carry, xb, hp)
            if not keep_residuals:
                return new, h.astype(cell.dtype)
            return new, (new, xb + hp if cell.additive else hp)

        return jax.lax.scan(body, carry0, (xp, valid), reverse=reverse, unroll=unroll)

    def outputs_of(carries, valid):
        h = cell.hidden(carries)  # (T, B, H): a padded step holds the carry, its output is 0
        if valid is not None:
            h = jnp.where(valid[:, :, None], h, 0)
        return h.astype(cell.dtype)

    @jax.custom_vjp
    def layer(w, x, carry0, valid):
        _, xp = _project(cell, w["input_kernel"], x)
        carry, outputs = forward_scan(w, xp, carry0, valid, keep_residuals=False)
        return carry, jnp.swapaxes(outputs, 0, 1)  # (T, B, H) -> (B, T, H)

    def layer_fwd(w, x, carry0, valid):
        xt, xp = _project(cell, w["input_kernel"], x)
        carry, (carries, pre) = forward_scan(w, xp, carry0, valid, keep_residuals=True)
        outputs = jnp.swapaxes(outputs_of(carries, valid), 0, 1)
        # The carry entering each step: the carries shifted one step against the reading order.
        if reverse:
            prev = jax.tree.map(lambda s, c: jnp.concatenate([s, c[None]])[1:], carries, carry0)
        else:
            prev = jax.tree.map(lambda s, c: jnp.concatenate([c[None], s])[:-1], carries, carry0)
        pre = pre if cell.additive else (xp, pre)
        return (carry, outputs), (w, xt, pre, prev, valid)

    def layer_bwd(res, cotangents):
        w, xt, pre, prev, valid = res
        d_carry, d_out = cotangents
        kernel_ih, kernel_hh, bias, rest = _split_weights(w)
        d_out = jnp.swapaxes(d_out, 0, 1).astype(cell.carry_dtype)  # (T, B, H)
        steps, batch = d_out.shape[:2]
        hidden = kernel_hh.shape[0]
        # (G H, H), transposed once here: left to XLA, the transpose was redone every step.
        kernel_hh_t = kernel_hh.reshape(hidden, -1).T

        def body(state, inputs):
            d_carry, d_rest = state
            d_out_t, prev_t, pre_t, valid_t = inputs
            gates = _masked_gates(cell, valid_t)
            if cell.additive:  # pre_t = z = xb + hp: one cotangent serves both halves
                _, vjp = jax.vjp(lambda r, c, z: gates(r, c, z, jnp.zeros_like(z)),
                                 rest, prev_t, pre_t)
                d_rest_t, d_prev, d_z = vjp((d_carry, d_out_t))
                d_xb = d_hp = d_z
            else:
                xp_t, hp_t = pre_t
                xb = xp_t.astype(cell.carry_dtype) + bias
                _, vjp = jax.vjp(gates, rest, prev_t, xb, hp_t)
                d_rest_t, d_prev, d_xb, d_hp = vjp((d_carry, d_out_t))
            # dh_{t-1} from h_{t-1} U: (B, G H) @ (G H, H), in the matmul dtype as autodiff would.
            d_h = jnp.dot(d_hp.reshape(batch, -1).astype(cell.dtype), kernel_hh_t,
                          preferred_element_type=cell.carry_dtype)
            _, hidden_vjp = jax.vjp(cell.hidden, prev_t)
            d_prev = jax.tree.map(jnp.add, d_prev, hidden_vjp(d_h)[0])
            d_rest = jax.tree.map(jnp.add, d_rest, d_rest_t)
            return (d_prev, d_rest), (d_xb if cell.additive else (d_xb, d_hp))

        state = (d_carry, jax.tree.map(jnp.zeros_like, rest))
        (d_carry0, d_rest), d_pre = jax.lax.scan(
            body, state, (d_out, prev, pre, valid), reverse=not reverse, unroll=unroll)
        d_xb, d_hp = (d_pre, d_pre) if cell.additive else d_pre

        # Every weight gradient as one matmul over all T B rows, in the matmul dtype.
        rows = steps * batch
        d_xb2 = d_xb.reshape(rows, -1).astype(cell.dtype)  # (T B, G H)
        d_hp2 = d_hp.reshape(rows, -1).astype(cell.dtype)
        h_prev = cell.hidden(prev).reshape(rows, hidden).astype(cell.dtype)  # (T B, H)

        def matmul(a, b):
            return jnp.dot(a, b, preferred_element_type=cell.carry_dtype)

        d_w = dict(jax.tree.map(lambda g, p: g.astype(p.dtype), d_rest, rest))
        d_w["input_kernel"] = matmul(xt.reshape(rows, -1).T, d_xb2).reshape(
            kernel_ih.shape).astype(kernel_ih.dtype)
        d_w["recurrent_kernel"] = matmul(h_prev.T, d_hp2).reshape(
            kernel_hh.shape).astype(kernel_hh.dtype)
        d_w["bias"] = d_xb.reshape(rows, -1).sum(0).reshape(bias.shape).astype(bias.dtype)
        d_x = matmul(d_xb2, kernel_ih.reshape(kernel_ih.shape[0], -1).T)  # (T B, D)
        d_x = jnp.swapaxes(d_x.reshape(steps, batch, -1), 0, 1).astype(x_dtype)
        return d_w, d_x, d_carry0, None

    layer.defvjp(layer_fwd, layer_bwd)
    return layer


class Bidirectional(nn.Module):
    """A forward and a reverse `RNN` over the same inputs, features concatenated.

    Returns outputs (B, T, 2H) = [forward, backward] and final carries (forward, backward). The
    backward carry is the state after reading position 0, i.e. a summary of the whole sequence
    read right to left. Children are named `forward` and `backward`.
    """

    hidden_size: int
    cell: str = "lstm"
    peephole: bool = False
    coupled: bool = False
    activation: Callable[[Array], Array] = jnp.tanh
    unroll: int = 1
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    backend: str = "scan"

    @nn.compact
    def __call__(
        self,
        x: Array,
        lengths: Array | None = None,
        initial_carry: tuple[Carry, Carry] | None = None,
    ) -> tuple[Array, tuple[Carry, Carry]]:
        """Runs both directions; arguments as `RNN`, `initial_carry` a (forward, backward) pair."""
        fwd_init, bwd_init = (None, None) if initial_carry is None else initial_carry
        kwargs = {
            "hidden_size": self.hidden_size,
            "cell": self.cell,
            "peephole": self.peephole,
            "coupled": self.coupled,
            "activation": self.activation,
            "unroll": self.unroll,
            "dtype": self.dtype,
            "param_dtype": self.param_dtype,
            "backend": self.backend,
        }
        fwd_out, fwd_carry = RNN(reverse=False, name="forward", **kwargs)(x, lengths, fwd_init)
        bwd_out, bwd_carry = RNN(reverse=True, name="backward", **kwargs)(x, lengths, bwd_init)
        outputs = jnp.concatenate([fwd_out, bwd_out], axis=-1)  # (B, T, 2H)
        return nn.with_logical_constraint(outputs, _OUT_AXES), (fwd_carry, bwd_carry)


class StackedRNN(nn.Module):
    """`num_layers` RNN (or Bidirectional) layers, each reading the previous one's outputs.

    Dropout (PyTorch's `dropout=`) is applied to the outputs of every layer but the last.
    Layers are named layer_0, layer_1, ...

    Returns (last layer's outputs (B, T, H or 2H), tuple of each layer's final carry).
    """

    num_layers: int
    hidden_size: int
    cell: str = "lstm"
    bidirectional: bool = False
    dropout_rate: float = 0.0
    peephole: bool = False
    coupled: bool = False
    activation: Callable[[Array], Array] = jnp.tanh
    unroll: int = 1
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    backend: str = "scan"

    @nn.compact
    def __call__(
        self,
        x: Array,
        lengths: Array | None = None,
        initial_carries: tuple | None = None,
        *,
        deterministic: bool = True,
    ) -> tuple[Array, tuple]:
        """Runs the layers bottom-up.

        Args:
          x: (B, T, D) inputs; lengths: (B,) valid lengths or None.
          initial_carries: one initial carry per layer (a pair for bidirectional), or None.
          deterministic: disable dropout; when False, needs a 'dropout' rng.
        """
        if self.num_layers < 1:
            raise ConfigError(f"StackedRNN: num_layers must be >= 1, got {self.num_layers}")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ConfigError(f"StackedRNN: dropout_rate must be in [0, 1), got "
                              f"{self.dropout_rate}")
        if initial_carries is not None and len(initial_carries) != self.num_layers:
            raise ValueError(
                f"StackedRNN: initial_carries needs one entry per layer ({self.num_layers}), "
                f"got {len(initial_carries)}"
            )
        kwargs = {
            "hidden_size": self.hidden_size,
            "cell": self.cell,
            "peephole": self.peephole,
            "coupled": self.coupled,
            "activation": self.activation,
            "unroll": self.unroll,
            "dtype": self.dtype,
            "param_dtype": self.param_dtype,
            "backend": self.backend,
        }
        layer_cls = Bidirectional if self.bidirectional else RNN
        carries = []
        for i in range(self.num_layers):
            init = None if initial_carries is None else initial_carries[i]
            x, carry = layer_cls(name=f"layer_{i}", **kwargs)(x, lengths, init)
            carries.append(carry)
            if i < self.num_layers - 1 and self.dropout_rate > 0.0:
                # Padded positions are 0 and stay 0 under dropout.
                x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
        return x, tuple(carries)
