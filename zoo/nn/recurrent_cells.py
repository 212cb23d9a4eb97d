"""Recurrent cells: Elman RNN, LSTM (plain, peephole, coupled) and GRU, the one-step maths
zoo.nn.recurrent scans over sequences (and decoders feed one token at a time).

Every cell splits its work in two, because the input half has no time dependence:

* `project(w, x)` multiplies *all* time steps by the input kernel in one einsum (a large,
  efficient matmul that runs before the recurrence), giving pre-activations `(T, B, G, H)`;
* `step(w, carry, xp_t)` is the only work left inside the recurrence: one `(B, H) @ (H, G, H)`
  matmul (`hp_t`, of `hidden(carry)`) plus element-wise gate maths, `gates(w, carry, xp_t, hp_t)`.

`weights(in_features)` is the cell's single parameter-owning method: it creates / fetches the
parameters once and casts the kernels to the compute dtype, so a scan closes over plain arrays.
(`nn.scan` with broadcast params would re-enter the cell each step, re-fetching and re-casting
the recurrent kernel inside the loop body; fetching outside keeps the loop body to the matmul
and gate maths.)

Parameters, per cell (G gates, D inputs, H hidden units):

    input_kernel      (D, G, H)  ('rnn_in', None, 'rnn_hidden')
    recurrent_kernel  (H, G, H)  ('rnn_in', None, 'rnn_hidden')
    bias              (G, H)     (None, 'rnn_hidden')
    recurrent_bias    (G, H)     GRU only: b_hn sits inside the reset product, so it cannot fold
    peephole_{input,forget,output}  (H,)  ('rnn_hidden',)  peephole LSTM only

Gate order follows PyTorch so importing `torch.nn.LSTM` / `GRU` / `RNN` weights is a reshape:

    LSTM  i, f, g, o   (coupled: f, g, o — the input gate is 1 - f and has no weights)
    GRU   r, z, n
    RNN   a single "gate"

    input_kernel     = weight_ih_l{k}.reshape(G, H, D).transpose(2, 0, 1)
    recurrent_kernel = weight_hh_l{k}.reshape(G, H, H).transpose(2, 0, 1)
    bias             = (bias_ih_l{k} + bias_hh_l{k}).reshape(G, H)   # LSTM, RNN: they only add
    bias, recurrent_bias = bias_ih_l{k}.reshape(3, H), bias_hh_l{k}.reshape(3, H)   # GRU
    (`..._reverse` tensors go to the backward direction of `Bidirectional`.)

Precision. Matmuls run in `dtype` (bf16 in big configs); the gate pre-activations, the carry
(c, h) and the state update are kept in float32 (`carry_dtype`), because the cell state is a
running accumulation over every step — the same reason softmax/normalisation statistics are
float32. Outputs are emitted in `dtype`.
"""

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from zoo.errors import ConfigError

Array = jax.Array
Dtype = Any
Initializer = Callable[..., Array]
Carry = Any  # Array (GRU, RNN) or (c, h) tuple (LSTM)

CELL_KINDS = ("lstm", "gru", "rnn")

_INPUT_KERNEL_AXES = ("rnn_in", None, "rnn_hidden")
# The recurrent kernel's input dim is also replicated: each step all-gathers the (B, H) state,
# which is tiny next to the (H, G, H) kernel that stays split over the hidden units.
_RECURRENT_KERNEL_AXES = ("rnn_in", None, "rnn_hidden")
_BIAS_AXES = (None, "rnn_hidden")


def _per_gate(init: Initializer) -> Initializer:
    """Applies a 2-D initialiser to each gate's (in, H) slice of an (in, G, H) kernel.

    Fan-in is then `in` (not G, which flax's variance-scaling would take from axis -2), and an
    orthogonal recurrent init is orthogonal per gate, as in Saxe et al. / Keras.
    """

    def init_fn(key, shape, dtype=jnp.float32):
        n_in, gates, hidden = shape
        keys = jax.random.split(key, gates)
        return jnp.stack([init(k, (n_in, hidden), dtype) for k in keys], axis=1)

    return init_fn


def _ones_at_gate(gate: int) -> Initializer:
    """(G, H) bias init: zeros, except ones for every unit of gate `gate`."""

    def init_fn(key, shape, dtype=jnp.float32):
        del key
        return jnp.zeros(shape, dtype).at[gate].set(1.0)

    return init_fn


class Cell(nn.Module):
    """Shared fields and the time-parallel input projection of every cell."""

    hidden_size: int
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()
    recurrent_kernel_init: Initializer = nn.initializers.orthogonal()

    num_gates = 1  # overridden per cell (class constant, not a dataclass field)

    @property
    def carry_dtype(self) -> Dtype:
        # float32 for bf16/f16/f32 compute; float64 stays float64 (x64 mode).
        return jnp.promote_types(self.dtype, jnp.float32)

    def _kernels(self, in_features: int, bias_init: Initializer) -> dict[str, Array]:
        """Creates the kernels (cast to `dtype`) and the bias (cast to `carry_dtype`)."""
        if self.hidden_size <= 0:
            raise ConfigError(
                f"{type(self).__name__}: hidden_size must be > 0, got {self.hidden_size}"
            )
        g, h = self.num_gates, self.hidden_size
        input_kernel = self.param(
            "input_kernel",
            nn.with_logical_partitioning(_per_gate(self.kernel_init), _INPUT_KERNEL_AXES),
            (in_features, g, h),
            self.param_dtype,
        )
        recurrent_kernel = self.param(
            "recurrent_kernel",
            nn.with_logical_partitioning(
                _per_gate(self.recurrent_kernel_init), _RECURRENT_KERNEL_AXES
            ),
            (h, g, h),
            self.param_dtype,
        )
        bias = self.param(
            "bias", nn.with_logical_partitioning(bias_init, _BIAS_AXES), (g, h), self.param_dtype
        )
        return {
            "input_kernel": input_kernel.astype(self.dtype),
            "recurrent_kernel": recurrent_kernel.astype(self.dtype),
            "bias": bias.astype(self.carry_dtype),
        }

    def _vector(self, name: str, shape: tuple[int, ...], axes) -> Array:
        """A zero-initialised parameter used element-wise, cast to the carry dtype."""
        init = nn.initializers.zeros_init()
        v = self.param(name, nn.with_logical_partitioning(init, axes), shape, self.param_dtype)
        return v.astype(self.carry_dtype)

    @nn.nowrap
    def project(self, w: dict[str, Array], x: Array, time_major: bool = False) -> Array:
        """Input half of every gate for all steps at once: x W + b.

        Args:
          w: the cell's `weights(...)`.
          x: (..., D) inputs; with `time_major=True`, (B, T, D) comes back as (T, B, G, H).

        Returns:
          (..., G, H) pre-activations in `dtype` (the largest activation of the layer).
        """
        x = x.astype(self.dtype)
        if time_major:
            # (B, T, D) x (D, G, H) -> (T, B, G, H): each scan step slices a contiguous (B, G, H).
            xp = jnp.einsum(
                "btd,dgh->tbgh", x, w["input_kernel"], preferred_element_type=self.carry_dtype
            )
        else:
            xp = jnp.einsum(
                "...d,dgh->...gh", x, w["input_kernel"], preferred_element_type=self.carry_dtype
            )
        return (xp + w["bias"]).astype(self.dtype)

    @nn.nowrap
    def recurrent_projection(self, w: dict[str, Array], h: Array) -> Array:
        """h (B, H) through the recurrent kernel: (B, G, H), accumulated in the carry dtype."""
        return jnp.einsum(
            "bh,hgk->bgk",
            h.astype(self.dtype),
            w["recurrent_kernel"],
            preferred_element_type=self.carry_dtype,
        )

    # Whether `gates` reads xp_t and hp_t only through their sum (LSTM, Elman; not GRU, whose
    # reset gate multiplies the recurrent half alone). The backward pass of `RNN` then keeps one
    # (T, B, G, H) residual and one gradient for both halves instead of two.
    additive = True

    @nn.nowrap
    def hidden(self, carry: Carry) -> Array:
        """The part of the carry the recurrent kernel reads: h (B, H)."""
        return carry

    @nn.nowrap
    def step(self, w: dict[str, Array], carry: Carry, xp_t: Array) -> tuple[Carry, Array]:
        """Recurrent half: (carry, xp_t (B, G, H)) -> (new carry, h_t (B, H) in `carry_dtype`)."""
        return self.gates(w, carry, xp_t, self.recurrent_projection(w, self.hidden(carry)))

    def __call__(self, carry: Carry, x_t: Array) -> tuple[Carry, Array]:
        """One time step from raw inputs: x_t (B, D) -> (new carry, h_t (B, H) in `dtype`).

        For decoders that feed one token at a time. Whole sequences should go through `RNN`,
        which projects every step at once and fetches the weights once.
        """
        w = self.weights(x_t.shape[-1])
        carry, h = self.step(w, carry, self.project(w, x_t))
        return carry, h.astype(self.dtype)


class SimpleRNNCell(Cell):
    """Elman RNN: h_t = activation(x_t W + h_{t-1} U + b).

    Carry: h (B, H). Gate axis G = 1 (kept so every cell shares one kernel layout).
    """

    activation: Callable[[Array], Array] = jnp.tanh

    num_gates = 1

    @nn.compact
    def weights(self, in_features: int) -> dict[str, Array]:
        """Creates or fetches the parameters, kernels cast to `dtype`."""
        return self._kernels(in_features, nn.initializers.zeros_init())

    @nn.nowrap
    def gates(self, w: dict[str, Array], carry: Array, xp_t: Array, hp_t: Array):
        """Element-wise half: (h_{t-1}, xp_t, hp_t = h_{t-1} U, each (B, 1, H)) -> (h_t, h_t)."""
        del w, carry
        h = self.activation(xp_t[:, 0].astype(self.carry_dtype) + hp_t[:, 0])
        return h, h

    @nn.nowrap
    def initialize_carry(self, batch_size: int) -> Array:
        """Zero state h (B, H) in `carry_dtype`."""
        return jnp.zeros((batch_size, self.hidden_size), self.carry_dtype)


class LSTMCell(Cell):
    """LSTM (Hochreiter & Schmidhuber), with optional peephole and coupled-gate variants.

        i = σ(W_i x + U_i h_{t-1} [+ p_i ⊙ c_{t-1}] + b_i)      (coupled: i = 1 - f)
        f = σ(W_f x + U_f h_{t-1} [+ p_f ⊙ c_{t-1}] + b_f)
        g = tanh(W_g x + U_g h_{t-1} + b_g)                        (candidate c~_t)
        c_t = f ⊙ c_{t-1} + i ⊙ g
        o = σ(W_o x + U_o h_{t-1} [+ p_o ⊙ c_t] + b_o)            (output peephole sees c_t)
        h_t = o ⊙ tanh(c_t)

    Peephole weights p are diagonal (vectors), as in Gers & Schmidhuber (2000). Gate order on
    the G axis: (i, f, g, o), or (f, g, o) when coupled. Carry: (c, h), each (B, H).

    Attributes:
      peephole: gates also read the cell state (f, i: c_{t-1}; o: c_t).
      coupled: one forget gate decides both: c_t = f ⊙ c_{t-1} + (1 - f) ⊙ g.
    """

    peephole: bool = False
    coupled: bool = False

    @property
    def num_gates(self) -> int:  # type: ignore[override]
        return 3 if self.coupled else 4

    @property
    def _gate(self) -> dict[str, int]:
        return {"f": 0, "g": 1, "o": 2} if self.coupled else {"i": 0, "f": 1, "g": 2, "o": 3}

    @nn.compact
    def weights(self, in_features: int) -> dict[str, Array]:
        """Creates or fetches the parameters, kernels cast to `dtype`."""
        # Forget-gate bias starts at 1 (Gers et al. 2000; Jozefowicz et al. 2015): σ(1) ≈ 0.73,
        # so a fresh cell keeps most of its state and gradients reach far-back steps through c;
        # with 0 the state halves every step and early training cannot learn long dependencies.
        w = self._kernels(in_features, _ones_at_gate(self._gate["f"]))
        if self.peephole:
            # Zero init: the cell starts as a plain LSTM and learns how much to peek.
            names = ("forget", "output") if self.coupled else ("input", "forget", "output")
            for name in names:
                w[f"peephole_{name}"] = self._vector(
                    f"peephole_{name}", (self.hidden_size,), ("rnn_hidden",)
                )
        return w

    @nn.nowrap
    def hidden(self, carry: tuple[Array, Array]) -> Array:
        """h of the (c, h) carry: what the recurrent kernel reads."""
        return carry[1]

    @nn.nowrap
    def gates(self, w: dict[str, Array], carry: tuple[Array, Array], xp_t: Array, hp_t: Array):
        """Element-wise half: ((c, h), xp_t, hp_t = h U, each (B, G, H)) -> ((c_t, h_t), h_t)."""
        c, _ = carry
        z = xp_t.astype(self.carry_dtype) + hp_t  # (B, G, H) pre-activations
        g_idx, n = self._gate["g"], self.num_gates
        # o is the last gate in both layouts; with peepholes it reads c_t, so it waits for c_t.
        first = n - 1 if self.peephole else n
        pre = z[:, :first]
        if self.peephole:
            # i, f lead the layout (coupled: f alone); their peepholes read c_{t-1}.
            names = ("forget",) if self.coupled else ("input", "forget")
            peep = jnp.stack([w[f"peephole_{name}"] for name in names])  # (k, H)
            k = len(names)
            pre = jnp.concatenate([pre[:, :k] + peep * c[:, None], pre[:, k:]], axis=1)
        # One sigmoid over all gates at once, the candidate included through
        # tanh(x) = 2 sigmoid(2x) - 1. Why: XLA:CPU vectorises a fused loop that calls one
        # transcendental function, but falls back to scalar calls when the same function is
        # called at several sites of one fusion; three sigmoids + a tanh in one fusion measured
        # 5-10x slower per element than this (benchmarks.step, LSTM n 128 d 256).
        scale = jnp.ones((first, 1), z.dtype).at[g_idx].set(2.0)
        acts = [a[:, 0] for a in jnp.split(jax.nn.sigmoid(pre * scale), first, axis=1)]
        f = acts[self._gate["f"]]
        i = 1.0 - f if self.coupled else acts[self._gate["i"]]
        c_new = f * c + i * (2.0 * acts[g_idx] - 1.0)
        if self.peephole:
            o = jax.nn.sigmoid(z[:, -1] + w["peephole_output"] * c_new)
        else:
            o = acts[-1]
        h_new = o * jnp.tanh(c_new)
        return (c_new, h_new), h_new

    @nn.nowrap
    def initialize_carry(self, batch_size: int) -> tuple[Array, Array]:
        """Zero state (c, h), each (B, H) in `carry_dtype`."""
        zeros = jnp.zeros((batch_size, self.hidden_size), self.carry_dtype)
        return zeros, zeros


class GRUCell(Cell):
    """GRU (Cho et al. 2014) in the PyTorch / cuDNN form, reset applied after the matmul:

        r = σ(W_r x + b_ir + U_r h_{t-1} + b_hr)
        z = σ(W_z x + b_iz + U_z h_{t-1} + b_hz)
        n = tanh(W_n x + b_in + r ⊙ (U_n h_{t-1} + b_hn))
        h_t = (1 - z) ⊙ n + z ⊙ h_{t-1}

    Applying r after U_n (not to h before it) lets all three recurrent matmuls run as one
    (B, H) @ (H, 3, H) product per step. Gate order (r, z, n). Carry: h (B, H).
    """

    num_gates = 3
    additive = False  # r multiplies the recurrent half of n alone

    @nn.compact
    def weights(self, in_features: int) -> dict[str, Array]:
        """Creates or fetches the parameters, kernels cast to `dtype`."""
        w = self._kernels(in_features, nn.initializers.zeros_init())
        # b_h* is separate from b_i* because b_hn is multiplied by r; keeping all three (like
        # cuDNN) makes PyTorch's bias_hh a reshape.
        w["recurrent_bias"] = self._vector(
            "recurrent_bias", (self.num_gates, self.hidden_size), _BIAS_AXES
        )
        return w

    @nn.nowrap
    def gates(self, w: dict[str, Array], carry: Array, xp_t: Array, hp_t: Array):
        """Element-wise half: (h_{t-1}, xp_t, hp_t = h_{t-1} U, each (B, 3, H)) -> (h_t, h_t)."""
        h = carry
        xp = xp_t.astype(self.carry_dtype)
        hp = hp_t + w["recurrent_bias"]  # (B, 3, H)
        # r and z in one sigmoid (see LSTMCell.gates for why one call per fusion).
        r, z = (a[:, 0] for a in jnp.split(jax.nn.sigmoid(xp[:, :2] + hp[:, :2]), 2, axis=1))
        n = jnp.tanh(xp[:, 2] + r * hp[:, 2])
        h_new = (1.0 - z) * n + z * h
        return h_new, h_new

    @nn.nowrap
    def initialize_carry(self, batch_size: int) -> Array:
        """Zero state h (B, H) in `carry_dtype`."""
        return jnp.zeros((batch_size, self.hidden_size), self.carry_dtype)


def make_cell(
    cell: str,
    hidden_size: int,
    *,
    peephole: bool = False,
    coupled: bool = False,
    activation: Callable[[Array], Array] = jnp.tanh,
    dtype: Dtype = jnp.float32,
    param_dtype: Dtype = jnp.float32,
    name: str | None = None,
) -> Cell:
    """Builds the cell named by `cell` ('lstm', 'gru' or 'rnn'), checking the variant flags."""
    if cell not in CELL_KINDS:
        raise ConfigError(f"cell must be one of {CELL_KINDS}, got {cell!r}")
    if cell != "lstm" and (peephole or coupled):
        raise ConfigError(
            f"peephole/coupled are LSTM variants; got cell={cell!r} with peephole={peephole}, "
            f"coupled={coupled}. Use cell='lstm' or leave both False."
        )
    common = {"hidden_size": hidden_size, "dtype": dtype, "param_dtype": param_dtype, "name": name}
    if cell == "lstm":
        return LSTMCell(peephole=peephole, coupled=coupled, **common)
    if cell == "gru":
        return GRUCell(**common)
    return SimpleRNNCell(activation=activation, **common)
