"""The recurrent cells and layers: float64 numpy references per cell, padding, direction and
stacking, gradients, jit, bf16, the loop body, sharding, errors and torch parity."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tests.nn.recurrent_cases import (B, D, H, T, VARIANTS, jit_apply,
                                      random_inputs, random_params,
                                      sharded_bidirectional_lstm)
from tests.numerics import assert_close
from zoo.nn import recurrent_cells
from zoo.nn.recurrent import RNN, Bidirectional, StackedRNN

# ---------------------------------------------------------------- float64 numpy references


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _f64(tree):
    return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def _gates(p, names):
    """Per-gate (W (D, H), U (H, H), b (H,)) in the documented gate order."""
    return {
        n: (p["input_kernel"][:, k], p["recurrent_kernel"][:, k], p["bias"][k])
        for k, n in enumerate(names)
    }


def ref_elman(p, x):
    p, x = _f64(p), np.asarray(x, np.float64)
    ((W, U, b),) = _gates(p, "a").values()
    h = np.zeros((x.shape[0], U.shape[0]))
    outs = []
    for t in range(x.shape[1]):
        h = np.tanh(x[:, t] @ W + h @ U + b)
        outs.append(h)
    return np.stack(outs, 1), h


def ref_lstm(p, x, peephole=False, coupled=False):
    p, x = _f64(p), np.asarray(x, np.float64)
    g = _gates(p, "fgo" if coupled else "ifgo")
    c = h = np.zeros((x.shape[0], p["recurrent_kernel"].shape[0]))
    outs = []
    for t in range(x.shape[1]):
        pre = {n: x[:, t] @ W + h @ U + b for n, (W, U, b) in g.items()}
        f = _sigmoid(pre["f"] + (p["peephole_forget"] * c if peephole else 0.0))
        if coupled:
            i = 1.0 - f
        else:
            i = _sigmoid(pre["i"] + (p["peephole_input"] * c if peephole else 0.0))
        c = f * c + i * np.tanh(pre["g"])
        o = _sigmoid(pre["o"] + (p["peephole_output"] * c if peephole else 0.0))  # sees c_t
        h = o * np.tanh(c)
        outs.append(h)
    return np.stack(outs, 1), (c, h)


def ref_gru(p, x):
    p, x = _f64(p), np.asarray(x, np.float64)
    g = _gates(p, "rzn")
    bh = dict(zip("rzn", p["recurrent_bias"]))
    h = np.zeros((x.shape[0], p["recurrent_kernel"].shape[0]))
    outs = []
    for t in range(x.shape[1]):
        xt = x[:, t]
        r = _sigmoid(xt @ g["r"][0] + g["r"][2] + h @ g["r"][1] + bh["r"])
        z = _sigmoid(xt @ g["z"][0] + g["z"][2] + h @ g["z"][1] + bh["z"])
        n = np.tanh(xt @ g["n"][0] + g["n"][2] + r * (h @ g["n"][1] + bh["n"]))
        h = (1.0 - z) * n + z * h
        outs.append(h)
    return np.stack(outs, 1), h


def _reference(kw, p, x):
    if kw["cell"] == "rnn":
        return ref_elman(p, x)
    if kw["cell"] == "gru":
        return ref_gru(p, x)
    return ref_lstm(p, x, kw.get("peephole", False), kw.get("coupled", False))


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("variant", VARIANTS)
def test_cells_match_float64_numpy_over_several_steps(variant):
    kw = VARIANTS[variant]
    x = random_inputs()
    model = RNN(hidden_size=H, **kw)
    params = random_params(model, x)
    ref_out, ref_carry = _reference(kw, params["cell"], x)

    # The scan path: fused projection + lax.scan.
    out, carry = jit_apply(model, params, x)
    assert out.shape == (B, T, H)
    assert_close(out, ref_out, 1e-5)
    assert_close(carry, ref_carry, 1e-5)

    # The cell's own one-step __call__, chained by hand for the first 3 steps.
    cell = recurrent_cells.make_cell(hidden_size=H, **kw)
    step = jax.jit(cell.apply)
    cell_carry = cell.initialize_carry(B)
    for t in range(3):
        cell_carry, h = step({"params": params["cell"]}, cell_carry, x[:, t])
        assert_close(h, ref_out[:, t], 1e-5, err_msg=f"step {t}")


def test_init_layout_axes_and_forget_bias():
    x = random_inputs()
    boxed = jax.eval_shape(
        RNN(hidden_size=H, cell="lstm", peephole=True).init, jax.random.key(0), x
    )
    specs = nn.get_partition_spec(boxed)["params"]["cell"]
    assert specs["input_kernel"] == P("rnn_in", None, "rnn_hidden")
    assert specs["recurrent_kernel"] == P("rnn_in", None, "rnn_hidden")
    assert specs["bias"] == P(None, "rnn_hidden")
    assert specs["peephole_output"] == P("rnn_hidden")

    p = nn.unbox(jax.jit(RNN(hidden_size=H, cell="lstm").init)(jax.random.key(0), x))
    p = p["params"]["cell"]
    assert p["input_kernel"].shape == (D, 4, H) and p["recurrent_kernel"].shape == (H, 4, H)
    np.testing.assert_array_equal(p["bias"], np.repeat([[0.0], [1.0], [0.0], [0.0]], H, 1))  # ifgo
    # Orthogonal recurrent init per gate: each (H, H) block has U^T U = I.
    for g in range(4):
        u = np.asarray(p["recurrent_kernel"][:, g], np.float64)
        assert_close(u.T @ u, np.eye(H), 1e-5, err_msg=f"gate {g}")
    # (zeros recurrent init: only the bias matters here, and a QR init costs a compile)
    coupled = recurrent_cells.LSTMCell(H, coupled=True, recurrent_kernel_init=nn.initializers.zeros)
    p = nn.unbox(coupled.init(jax.random.key(0), D, method=coupled.weights))["params"]
    assert p["input_kernel"].shape == (D, 3, H)
    np.testing.assert_array_equal(p["bias"], np.repeat([[1.0], [0.0], [0.0]], H, 1))  # f, g, o
    gru = jax.eval_shape(RNN(hidden_size=H, cell="gru").init, jax.random.key(0), x)
    gru = nn.unbox(gru)["params"]["cell"]
    assert gru["input_kernel"].shape == (D, 3, H) and gru["recurrent_bias"].shape == (3, H)


@pytest.mark.parametrize("reverse", [False, True])
def test_padded_batch_equals_each_sequence_alone(reverse):
    lengths = np.array([5, 2, 0])
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, T, D))
    for i, n in enumerate(lengths):
        x[i, n:] = 100.0 * rng.normal(size=(T - n, D))  # loud padding: any leak shows
    x = jnp.asarray(x, jnp.float32)
    model = RNN(hidden_size=H, cell="lstm", reverse=reverse)
    params = random_params(model, x, lengths=jnp.asarray(lengths))
    # A nonzero initial carry: a length-0 sequence (and, reading backward, the padding steps
    # visited first) must leave exactly this state.
    init = tuple(jnp.asarray(rng.normal(size=(3, H)), jnp.float32) for _ in range(2))

    out, carry = jit_apply(model, params, x, jnp.asarray(lengths), init)
    forward = RNN(hidden_size=H, cell="lstm")
    for i, n in enumerate(lengths):
        init_i = tuple(a[i : i + 1] for a in init)  # (c, h), each (1, H)
        carry_i = tuple(a[i] for a in carry)
        np.testing.assert_array_equal(out[i, n:], 0.0)
        if n == 0:
            jax.tree.map(lambda c, c0: np.testing.assert_array_equal(c, c0[0]), carry_i, init_i)
            continue
        alone_out, alone_carry = jit_apply(model, params, x[i : i + 1, :n], None, init_i)
        assert_close(out[i, :n], alone_out[0], 1e-5, err_msg=f"row {i}")
        assert_close(carry_i, jax.tree.map(lambda a: np.asarray(a[0]), alone_carry), 1e-5)
        if reverse:
            # Backward within its length == forward over the reversed unpadded sequence.
            rev_out, rev_carry = jit_apply(forward, params, x[i : i + 1, :n][:, ::-1], None, init_i)
            assert_close(out[i, :n], rev_out[0, ::-1], 1e-5, err_msg=f"row {i}")
            assert_close(carry_i, jax.tree.map(lambda a: np.asarray(a[0]), rev_carry), 1e-5)


def test_padding_gets_no_gradient():
    lengths = jnp.array([5, 3])
    x = random_inputs()
    model = Bidirectional(hidden_size=H, cell="lstm")
    params = random_params(model, x, lengths=lengths)

    def loss(x):
        out, carries = model.apply({"params": params}, x, lengths)
        return jnp.sum(out**2) + sum(jnp.sum(c**2) for c in jax.tree.leaves(carries))

    g = jax.jit(jax.grad(loss))(x)
    np.testing.assert_array_equal(g[1, 3:], 0.0)
    assert np.all(np.abs(g[1, :3]).sum(-1) > 0) and np.all(np.abs(g[0]).sum(-1) > 0)


def test_bidirectional_is_concat_of_forward_and_reverse_rnns():
    lengths = jnp.array([5, 3])
    x = random_inputs()
    model = Bidirectional(hidden_size=H, cell="gru")
    params = random_params(model, x, lengths=lengths)
    out, (fwd_carry, bwd_carry) = jit_apply(model, params, x, lengths)
    fwd_out, fwd_ref = jit_apply(RNN(hidden_size=H, cell="gru"), params["forward"], x, lengths)
    bwd_out, bwd_ref = jit_apply(
        RNN(hidden_size=H, cell="gru", reverse=True), params["backward"], x, lengths
    )
    assert out.shape == (B, T, 2 * H)
    assert_close(out, jnp.concatenate([fwd_out, bwd_out], -1), 1e-6)
    assert_close(fwd_carry, fwd_ref, 1e-6)
    assert_close(bwd_carry, bwd_ref, 1e-6)
    assert not np.allclose(fwd_carry, bwd_carry)  # the two directions really differ


def test_stacked_layer_two_reads_layer_one_outputs():
    lengths = jnp.array([5, 3])
    x = random_inputs(d=2 * H)  # same width as layer 0's output, so one compiled layer serves both
    model = StackedRNN(num_layers=2, hidden_size=H, cell="lstm", bidirectional=True)
    params = random_params(model, x, lengths=lengths)
    out, carries = jit_apply(model, params, x, lengths)

    layer = jax.jit(Bidirectional(hidden_size=H, cell="lstm").apply)
    out0, carry0 = layer({"params": params["layer_0"]}, x, lengths)
    out1, carry1 = layer({"params": params["layer_1"]}, out0, lengths)
    assert_close(out, out1, 1e-6)
    assert len(carries) == 2
    assert_close(carries, jax.tree.map(np.asarray, (carry0, carry1)), 1e-6)


def test_stacked_dropout_only_between_layers():
    lengths = jnp.array([5, 3])
    x = random_inputs(d=H)
    rngs = {"dropout": jax.random.key(7)}
    model = StackedRNN(num_layers=2, hidden_size=H, cell="rnn", dropout_rate=0.5)
    params = random_params(model, x, lengths=lengths)
    train_out, train_carries = jit_apply(model, params, x, lengths, deterministic=False, rngs=rngs)
    eval_out, eval_carries = jit_apply(model, params, x, lengths)
    assert not np.allclose(train_out[:, :3], eval_out[:, :3])
    np.testing.assert_array_equal(train_out[1, 3:], 0.0)
    # Layer 0 itself is untouched (dropout acts on its outputs, between the layers) ...
    np.testing.assert_array_equal(train_carries[0], eval_carries[0])
    # ... and the last layer's outputs are not dropped (rate 0.5 would zero about half of them).
    assert np.all(train_out[0] != 0.0)


@pytest.mark.parametrize("variant", ["rnn", "lstm_peephole", "lstm_coupled_peephole", "gru"])
def test_gradients_reach_every_param_and_are_finite(variant):
    lengths = jnp.array([5, 3])
    x = random_inputs()
    model = RNN(hidden_size=H, **VARIANTS[variant])
    params = random_params(model, x, lengths=lengths)

    def loss(params):
        out, carry = model.apply({"params": params}, x, lengths)
        return jnp.sum(out**2) + sum(jnp.sum(c**2) for c in jax.tree.leaves(carry))

    grads = jax.jit(jax.grad(loss))(params)["cell"]
    for name, g in grads.items():
        assert np.all(np.isfinite(g)), name
        assert np.any(g != 0), f"no gradient reaches {name}"


def test_jit_equals_no_jit():
    lengths = jnp.array([4, 2])
    x = random_inputs()
    model = RNN(hidden_size=H, cell="lstm", peephole=True, reverse=True)
    params = random_params(model, x, lengths=lengths)
    eager = model.apply({"params": params}, x, lengths)
    jitted = jit_apply(model, params, x, lengths)
    assert_close(jitted, jax.tree.map(np.asarray, eager), 1e-6)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_bf16_compute_keeps_f32_params_and_tracks_f32(cell):
    lengths = jnp.array([5, 3])
    x = random_inputs()
    f32 = RNN(hidden_size=H, cell=cell)
    bf16 = RNN(hidden_size=H, cell=cell, dtype=jnp.bfloat16)
    shapes = nn.unbox(jax.eval_shape(bf16.init, jax.random.key(0), x, lengths))
    assert all(a.dtype == jnp.float32 for a in jax.tree.leaves(shapes))
    params = random_params(f32, x, lengths=lengths)
    out, carry = jit_apply(bf16, params, x, lengths)
    ref_out, ref_carry = jit_apply(f32, params, x, lengths)
    assert out.dtype == jnp.bfloat16
    assert all(c.dtype == jnp.float32 for c in jax.tree.leaves(carry))  # state kept in f32
    assert_close(out.astype(jnp.float32), ref_out, 3e-2)
    assert_close(carry, jax.tree.map(np.asarray, ref_carry), 3e-2)
    assert not np.array_equal(out.astype(jnp.float32), ref_out)  # bf16 really was used


def _scan_bodies(jaxpr):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            yield eqn.params["jaxpr"].jaxpr
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _scan_bodies(sub)


def _all_eqns(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _all_eqns(sub)


def test_loop_body_is_only_the_recurrent_matmul():
    # Input projection for all steps happens before the scan; the recurrent kernel is fetched
    # and cast to bf16 once, outside it.
    lengths = jnp.array([5, 3])
    x = random_inputs()
    model = RNN(hidden_size=H, cell="lstm", dtype=jnp.bfloat16)
    params = random_params(model, x, lengths=lengths)
    jaxpr = jax.make_jaxpr(lambda p: model.apply({"params": p}, x, lengths))(params).jaxpr
    bodies = list(_scan_bodies(jaxpr))
    assert len(bodies) == 1
    eqns = list(_all_eqns(bodies[0]))
    dots = [e for e in eqns if e.primitive.name == "dot_general"]
    assert len(dots) == 1  # h @ U only
    assert {tuple(v.aval.shape) for v in dots[0].invars} == {(B, H), (H, 4, H)}
    kernel_casts = [
        e
        for e in eqns
        if e.primitive.name == "convert_element_type" and e.invars[0].aval.shape == (H, 4, H)
    ]
    assert not kernel_casts


def test_sharded_equals_single_device():
    model, x, lengths, _, params, mesh, rules = sharded_bidirectional_lstm()
    kernel = params["params"]["forward"]["cell"]["recurrent_kernel"]
    assert kernel.sharding.spec == P(None, None, "tensor")
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        out, carry = jax.jit(model.apply)(params, x, lengths)
    # Batch split over data (4), the 2H features over tensor (2): each shard holds (1, T, H).
    assert out.sharding.shard_shape(out.shape) == (1, T, H)
    host = jax.tree.map(np.asarray, params)
    ref_out, ref_carry = jax.jit(model.apply)(host, x, lengths)
    assert_close(out, ref_out, 1e-5)
    assert_close(carry, jax.tree.map(np.asarray, ref_carry), 1e-5)


def test_bad_arguments_name_the_argument():
    x = random_inputs()
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="cell must be one of"):
        jax.eval_shape(RNN(hidden_size=H, cell="lstmm").init, key, x)
    with pytest.raises(ValueError, match="peephole/coupled"):
        jax.eval_shape(RNN(hidden_size=H, cell="gru", peephole=True).init, key, x)
    with pytest.raises(ValueError, match="lengths must have shape"):
        jax.eval_shape(RNN(hidden_size=H).init, key, x, jnp.array([1, 2, 3]))
    with pytest.raises(ValueError, match=r"x must be \(batch, time, features\)"):
        jax.eval_shape(RNN(hidden_size=H).init, key, x[0])
    with pytest.raises(ValueError, match="num_layers"):
        jax.eval_shape(StackedRNN(num_layers=0, hidden_size=H).init, key, x)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_matches_torch_with_converted_weights(cell):
    torch = pytest.importorskip("torch")
    lengths = np.array([5, 3])
    x = np.asarray(random_inputs())
    gates = 4 if cell == "lstm" else 3
    torch.manual_seed(0)
    ref = (torch.nn.LSTM if cell == "lstm" else torch.nn.GRU)(
        D, H, batch_first=True, bidirectional=True
    )
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in ref.state_dict().items()}

    def convert(suffix):
        p = {
            "input_kernel": sd[f"weight_ih_l0{suffix}"].reshape(gates, H, D).transpose(2, 0, 1),
            "recurrent_kernel": sd[f"weight_hh_l0{suffix}"].reshape(gates, H, H).transpose(2, 0, 1),
        }
        b_ih, b_hh = sd[f"bias_ih_l0{suffix}"], sd[f"bias_hh_l0{suffix}"]
        if cell == "lstm":
            p["bias"] = (b_ih + b_hh).reshape(gates, H)
        else:
            p["bias"], p["recurrent_bias"] = b_ih.reshape(gates, H), b_hh.reshape(gates, H)
        return {"cell": p}

    params = {"params": {"forward": convert(""), "backward": convert("_reverse")}}
    out, (fwd, bwd) = Bidirectional(hidden_size=H, cell=cell).apply(
        params, jnp.asarray(x), jnp.asarray(lengths)
    )
    packed = torch.nn.utils.rnn.pack_padded_sequence(
        torch.tensor(x), torch.tensor(lengths), batch_first=True, enforce_sorted=False
    )
    with torch.no_grad():
        ref_out, ref_state = ref(packed)
    ref_out, _ = torch.nn.utils.rnn.pad_packed_sequence(ref_out, batch_first=True, total_length=T)
    assert_close(out, ref_out.numpy(), 1e-5)
    # Final states at each sequence's last valid step: torch h_n / c_n are (directions, B, H).
    if cell == "lstm":
        (h_n, c_n), ours = ref_state, [(fwd[1], fwd[0]), (bwd[1], bwd[0])]
    else:
        h_n, c_n, ours = ref_state, None, [(fwd, None), (bwd, None)]
    for d, (h, c) in enumerate(ours):
        assert_close(h, h_n[d].numpy(), 1e-5, err_msg=f"h, direction {d}")
        if c is not None:
            assert_close(c, c_n[d].numpy(), 1e-5, err_msg=f"c, direction {d}")
