"""RNN's custom VJP against JAX's autodiff of the plain scan (float64, finite differences, bf16,
sharded), and the cuDNN LSTM backend's weight packing against jax's reference LSTM."""

import flax.linen as nn
import jax
import jax.experimental.rnn
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from tests.nn.recurrent_cases import (D, H, T, VARIANTS, bidirectional_loss,
                                      random_inputs, random_params,
                                      sharded_bidirectional_lstm)
from tests.numerics import assert_close
from zoo.errors import ConfigError
from zoo.nn import cudnn_lstm, recurrent_cells
from zoo.nn.recurrent import RNN

# ---------------------------------------------------------------- the custom VJP of RNN


class _AutodiffRNN(nn.Module):
    """What `RNN` computed before its custom VJP: the cell API under a plain `lax.scan`, left to
    JAX's autodiff. Same parameter tree as `RNN`, so the two share parameters."""

    hidden_size: int
    cell: str = "lstm"
    reverse: bool = False
    peephole: bool = False
    coupled: bool = False
    dtype: object = jnp.float32

    @nn.compact
    def __call__(self, x, lengths=None, initial_carry=None):
        cell = recurrent_cells.make_cell(self.cell, self.hidden_size, peephole=self.peephole,
                                   coupled=self.coupled, dtype=self.dtype, name="cell")
        w = cell.weights(x.shape[-1])
        xp = cell.project(w, x, time_major=True)  # (T, B, G, H)
        carry = cell.initialize_carry(x.shape[0]) if initial_carry is None else initial_carry
        steps = jnp.arange(x.shape[1])[:, None]
        valid = steps >= 0 if lengths is None else steps < lengths[None, :]  # (T, B)

        def body(carry, inputs):
            xp_t, valid_t = inputs
            new, h = cell.step(w, carry, xp_t)
            new = jax.tree.map(lambda n, o: jnp.where(valid_t[:, None], n, o), new, carry)
            return new, jnp.where(valid_t[:, None], h, 0).astype(self.dtype)

        carry, out = jax.lax.scan(body, carry, (xp, valid), reverse=self.reverse)
        return jnp.swapaxes(out, 0, 1), carry


def _grads_both_ways(kw, reverse, lengths, dtype, seed=0):
    """Gradients of one loss w.r.t. params, inputs and the initial carry, through `RNN` (custom
    VJP) and through `_AutodiffRNN`, on the same random values."""
    rng = np.random.default_rng(seed)
    carry_dtype = jnp.promote_types(dtype, jnp.float32)
    x = jnp.asarray(rng.normal(size=(3, T, D)), dtype)
    model = RNN(hidden_size=H, reverse=reverse, dtype=dtype, **kw)
    ref = _AutodiffRNN(hidden_size=H, reverse=reverse, dtype=dtype, **kw)
    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), x))["params"]
    params = jax.tree.map(
        lambda a: jnp.asarray(rng.normal(scale=0.5, size=a.shape), carry_dtype), shapes)
    h0 = jnp.asarray(rng.normal(size=(3, H)), carry_dtype)
    carry0 = (0.5 * h0, h0) if kw["cell"] == "lstm" else h0
    lengths = None if lengths is None else jnp.asarray(lengths)
    # A weighted sum of outputs and a nonlinear function of the final carry: every cotangent
    # the VJP receives is nonzero and differs per position.
    out_weights = jnp.asarray(rng.normal(size=(3, T, H)), carry_dtype)

    def loss(module):
        def f(p, x, c0):
            out, carry = module.apply({"params": p}, x, lengths, c0)
            final = sum(jnp.sum(jnp.sin(c)) for c in jax.tree.leaves(carry))
            return jnp.sum(out.astype(carry_dtype) * out_weights) + final

        return jax.jit(jax.grad(f, argnums=(0, 1, 2)))

    return loss(model)(params, x, carry0), loss(ref)(params, x, carry0)


GRAD_CASES = [  # (variant, reverse, lengths): every cell, both directions, padding
    ("lstm", False, None),
    ("lstm", True, [5, 2, 0]),
    ("lstm_peephole", False, [5, 3, 1]),
    ("lstm_coupled", True, None),
    ("lstm_coupled_peephole", True, [5, 2, 0]),
    ("gru", False, [5, 2, 0]),
    ("gru", True, None),
    ("rnn", True, [4, 5, 1]),
]


@pytest.mark.slow
@pytest.mark.parametrize("variant,reverse,lengths", GRAD_CASES)
def test_custom_vjp_equals_autodiff_of_the_plain_scan_in_float64(variant, reverse, lengths):
    with jax.enable_x64(True):
        ours, ref = _grads_both_ways(VARIANTS[variant], reverse, lengths, jnp.float64)
        ours, ref = jax.tree.map(np.asarray, (ours, ref))  # float64 kept outside x64 mode
    # Same maths in another order (one matmul over all steps instead of a sum of per-step
    # products): equal to float64 rounding, for params, inputs and the initial carry.
    assert_close(ours, ref, 1e-10)
    assert all(np.any(g != 0) for g in jax.tree.leaves(ours))
    if lengths is not None:  # padded positions of x get exactly zero gradient
        for i, n in enumerate(lengths):
            np.testing.assert_array_equal(ours[1][i, n:], 0.0)


def test_custom_vjp_passes_a_numerical_gradient_check():
    # Independent of any autodiff: central differences in float64, reverse + padding + peepholes
    # (the most branches of the VJP at once).
    from jax.test_util import check_grads

    lengths = jnp.array([5, 3])
    with jax.enable_x64(True):
        x = jnp.asarray(np.random.default_rng(4).normal(size=(2, T, D)))
        model = RNN(hidden_size=H, peephole=True, reverse=True, dtype=jnp.float64)
        params = jax.tree.map(
            lambda a: jnp.asarray(a, jnp.float64), random_params(model, x, lengths=lengths))

        def f(p, x):
            out, (c, h) = model.apply({"params": p}, x, lengths)
            return jnp.sum(jnp.tanh(out)) + jnp.sum(c * h)

        check_grads(f, (params, x), order=1, modes=("rev",), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_custom_vjp_in_bfloat16_tracks_autodiff(cell):
    ours, ref = _grads_both_ways({"cell": cell}, False, [5, 2, 0], jnp.bfloat16)
    # Parameter gradients stay float32 (param dtype) and x's gradient takes x's dtype.
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(ours[0]))
    assert ours[1].dtype == jnp.bfloat16
    # bf16 matmul inputs either way; only the accumulation order differs.
    assert_close(ours, ref, 3e-2)



def test_custom_vjp_sharded_gradients_equal_single_device():
    # The hand-written backward under the default rules on a (data 4, tensor 2) mesh: batch
    # split over data, the hidden units of every kernel over tensor.
    model, x, lengths, params, sharded, mesh, rules = sharded_bidirectional_lstm()

    grad = jax.jit(jax.grad(bidirectional_loss(model, lengths), argnums=(0, 1)))
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        got = grad(sharded, x)
    expected = grad(jax.tree.map(np.asarray, params), x)
    assert_close(got, expected, 1e-5)


# ---------------------------------------------------------------- the cuDNN backend


@pytest.mark.parametrize("reverse", [False, True])
def test_cudnn_packing_runs_jax_reference_lstm_equal_to_the_scan(reverse):
    # No GPU here: the packed vector goes through jax.experimental.rnn's own unpacking and its
    # plain-XLA reference LSTM (`reference=True`), which must reproduce the scan backend:
    # outputs, final carries (a length-0 row included), and gradients back to our parameters.
    lengths = jnp.array([5, 2, 0])
    rng = np.random.default_rng(6)
    x = jnp.asarray(rng.normal(size=(3, T, D)), jnp.float32)
    model = RNN(hidden_size=H, cell="lstm", reverse=reverse)
    params = random_params(model, x, lengths=lengths)
    init = tuple(jnp.asarray(rng.normal(size=(3, H)), jnp.float32) for _ in range(2))
    out_weights = jnp.asarray(rng.normal(size=(3, T, H)), jnp.float32)

    def loss_scan(p):
        out, (c, h) = model.apply({"params": p}, x, lengths, init)
        return jnp.sum(out * out_weights) + jnp.sum(jnp.sin(c)) + jnp.sum(h**3), (out, (c, h))

    def loss_cudnn_reference(p):
        (c, h), out = cudnn_lstm.lstm(p["cell"], x, init, lengths, reverse=reverse,
                                      reference=True)
        return jnp.sum(out * out_weights) + jnp.sum(jnp.sin(c)) + jnp.sum(h**3), (out, (c, h))

    g_scan, (out, carry) = jax.jit(jax.grad(loss_scan, has_aux=True))(params)
    g_ref, (ref_out, ref_carry) = jax.jit(jax.grad(loss_cudnn_reference, has_aux=True))(params)
    assert_close(out, ref_out, 1e-5)
    assert_close(carry, jax.tree.map(np.asarray, ref_carry), 1e-5)
    assert_close(g_scan, g_ref, 1e-4)
    jax.tree.map(lambda c, c0: np.testing.assert_array_equal(c[2], c0[2]), carry, init)  # length 0


def test_cudnn_weight_layout_is_torch_lstm_flat():
    # jax.experimental.rnn documents cuDNN's vector as torch.nn.LSTM's tensors, flattened in
    # order with the double bias: [weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0].
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    ref = torch.nn.LSTM(D, H, batch_first=True)
    sd = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    ours = {
        "input_kernel": sd["weight_ih_l0"].reshape(4, H, D).transpose(2, 0, 1),
        "recurrent_kernel": sd["weight_hh_l0"].reshape(4, H, H).transpose(2, 0, 1),
        "bias": (sd["bias_ih_l0"] + sd["bias_hh_l0"]).reshape(4, H),
    }
    flat = cudnn_lstm.pack_weights(**{k: jnp.asarray(v) for k, v in ours.items()})
    expected = np.concatenate([sd["weight_ih_l0"].ravel(), sd["weight_hh_l0"].ravel(),
                               sd["bias_ih_l0"] + sd["bias_hh_l0"], np.zeros(4 * H)])
    assert flat.shape == (jax.experimental.rnn.get_num_params_in_lstm(D, H, 1, False),)
    assert_close(flat, expected, 1e-6)


def test_cudnn_backend_says_what_it_cannot_run():
    x = random_inputs()
    key = jax.random.key(0)
    assert jax.default_backend() == "cpu"
    with pytest.raises(ConfigError, match="cudnn RNN needs a GPU"):
        jax.eval_shape(RNN(hidden_size=H, backend="cudnn").init, key, x)
    with pytest.raises(ConfigError, match="plain LSTM only"):
        jax.eval_shape(RNN(hidden_size=H, cell="gru", backend="cudnn").init, key, x)
    with pytest.raises(ConfigError, match="plain LSTM only"):
        jax.eval_shape(RNN(hidden_size=H, peephole=True, backend="cudnn").init, key, x)
    with pytest.raises(ConfigError, match="float32 only"):
        jax.eval_shape(RNN(hidden_size=H, dtype=jnp.bfloat16, backend="cudnn").init, key, x)
    with pytest.raises(ConfigError, match="backend must be one of"):
        jax.eval_shape(RNN(hidden_size=H, backend="cuda").init, key, x)
