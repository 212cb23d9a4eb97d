"""RNN LMs: the LSTM / GRU / Elman equations over packed rows, state resets between documents,
one-step decoding, axes, precision and config checks."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.models import rnnlm

V, D, H = 11, 5, 6

# Row 0: two documents; row 1: one document then packing padding (segment 0).
TOKENS = np.array([[2, 7, 7, 1, 10, 3, 5], [3, 4, 5, 6, 8, 0, 0]], np.int32)
SEGMENTS = np.array([[1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 1, 0, 0]], np.int32)


def _config(cell, tie=False, **kw):
    # Untied: D != H, so the two layers' input kernels differ in shape and cannot be mixed up.
    return rnnlm.RNNLMConfig(vocab_size=V, cell=cell, embed_dim=H if tie else D, hidden_size=H,
                             num_layers=2, tie_embeddings=tie, **kw)


def _random_params(cfg, seed=0):
    """Initialised params with every leaf (biases included) replaced by random values, so a term
    that were dropped or misplaced would change the logits."""
    params = nn.unbox(rnnlm.RNNLM(cfg).init(jax.random.key(seed), jnp.asarray(TOKENS))["params"])
    leaves, treedef = jax.tree.flatten(params)
    rng = np.random.default_rng(seed)
    return treedef.unflatten([rng.normal(0, 0.5, np.shape(x)).astype(np.float32)
                              for x in leaves])


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _cell_step(cell, p, x, state):
    """One step of the PyTorch equations in float64; p holds (D, G, H) kernels, (G, H) biases."""
    xw = np.einsum("d,dgh->gh", x, p["input_kernel"]) + p["bias"]  # (G, H)
    if cell == "lstm":
        c, h = state
        z = xw + np.einsum("k,kgh->gh", h, p["recurrent_kernel"])
        i, f, g, o = _sigmoid(z[0]), _sigmoid(z[1]), np.tanh(z[2]), _sigmoid(z[3])
        c = f * c + i * g
        h = o * np.tanh(c)
        return (c, h), h
    h = state
    hu = np.einsum("k,kgh->gh", h, p["recurrent_kernel"])
    if cell == "gru":
        hu = hu + p["recurrent_bias"]
        r, z = _sigmoid(xw[0] + hu[0]), _sigmoid(xw[1] + hu[1])
        n = np.tanh(xw[2] + r * hu[2])
        h = (1 - z) * n + z * h
    else:  # Elman
        h = np.tanh(xw[0] + hu[0])
    return h, h


def _reference(params, tokens, segment_ids, cfg):
    """float64 numpy logits, one position at a time; every layer's state starts at zero at the
    row start and wherever the segment id changes."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    table = p["embed"]["embedding"]
    zero = np.zeros(cfg.hidden_size)
    out = np.zeros(tokens.shape + (cfg.vocab_size,))
    for b in range(tokens.shape[0]):
        for t in range(tokens.shape[1]):
            if t == 0 or segment_ids[b, t] != segment_ids[b, t - 1]:
                states = [(zero, zero) if cfg.cell == "lstm" else zero
                          for _ in range(cfg.num_layers)]
            x = table[tokens[b, t]]
            for k in range(cfg.num_layers):
                states[k], x = _cell_step(cfg.cell, p[f"layer_{k}"], x, states[k])
            if cfg.tie_embeddings:
                out[b, t] = x @ table.T + p["output_bias"]
            else:
                out[b, t] = x @ p["output"]["kernel"] + p["output"]["bias"]
    return out


CELLS = [("lstm", False), ("gru", True), ("rnn", False)]


@pytest.mark.parametrize("cell,tie", CELLS)
def test_logits_equal_float64_reference_with_resets_at_document_starts(cell, tie):
    cfg = _config(cell, tie)
    params = _random_params(cfg)
    logits = rnnlm.RNNLM(cfg).apply({"params": params}, jnp.asarray(TOKENS),
                                    segment_ids=jnp.asarray(SEGMENTS))
    assert logits.dtype == jnp.float32 and logits.shape == (2, 7, V)
    assert_close(logits, _reference(params, TOKENS, SEGMENTS, cfg), 1e-5)
    # Without segment ids a row is one document: the state crosses the 1 -> 2 boundary.
    whole = rnnlm.RNNLM(cfg).apply({"params": params}, jnp.asarray(TOKENS))
    assert_close(whole, _reference(params, TOKENS, np.ones_like(TOKENS), cfg), 1e-5)


@pytest.mark.parametrize("cell,tie", CELLS)
def test_a_document_does_not_see_the_one_before_it_in_the_row(cell, tie):
    cfg = _config(cell, tie)
    params = _random_params(cfg)
    forward = jax.jit(lambda tok, seg: rnnlm.RNNLM(cfg).apply({"params": params}, tok,
                                                              segment_ids=seg))
    perturbed = TOKENS.copy()
    perturbed[0, :3] = [9, 1, 4]  # the first document of row 0
    perturbed[1, :5] = [1, 2, 3, 4, 5]  # row 1's document, before its padding
    before, after = forward(TOKENS, SEGMENTS), forward(perturbed, SEGMENTS)
    # The second document and the padding start from the zero state: bit-identical logits.
    np.testing.assert_array_equal(after[0, 3:], before[0, 3:])
    np.testing.assert_array_equal(after[1, 5:], before[1, 5:])
    assert not np.allclose(after[0, :3], before[0, :3])  # the perturbation did reach the model
    # One segment per row: the same perturbation now carries over.
    ones = np.ones_like(SEGMENTS)
    assert not np.allclose(forward(perturbed, ones)[0, 3:], forward(TOKENS, ones)[0, 3:])


@pytest.mark.parametrize("cell,tie", CELLS)
def test_one_step_decoding_equals_the_full_forward_at_every_position(cell, tie):
    cfg = _config(cell, tie)
    model = rnnlm.RNNLM(cfg)
    params = _random_params(cfg)
    tokens = jnp.asarray(TOKENS)
    full = model.apply({"params": params}, tokens)  # (B, T, V), one document per row

    @jax.jit
    def step(chunk, carries):
        return model.apply({"params": params}, chunk, carries=carries, return_carries=True)

    # A 3-token prefill chunk, then one token at a time from the carried state.
    logits, carries = step(tokens[:, :3], rnnlm.initial_carries(cfg, 2))
    assert_close(logits, full[:, :3], 1e-5)
    for t in range(3, TOKENS.shape[1]):
        logits, carries = step(tokens[:, t : t + 1], carries)
        assert_close(logits[:, 0], full[:, t], 1e-5, err_msg=f"position {t}")
    # The state is float32 [B, H] per leaf, batch first (the Decoder's batch axis 0).
    assert all(c.shape == (2, H) and c.dtype == jnp.float32 for c in jax.tree.leaves(carries))
    assert len(carries) == cfg.num_layers


def test_every_parameter_has_logical_axes_and_flops_count_every_matmul_weight():
    tokens = jnp.zeros((1, 4), jnp.int32)
    rnn_axes = {"input_kernel": ("rnn_in", None, "rnn_hidden"),
                "recurrent_kernel": ("rnn_in", None, "rnn_hidden"), "bias": (None, "rnn_hidden")}
    gru_axes = dict(rnn_axes, recurrent_bias=(None, "rnn_hidden"))
    cases = {
        ("lstm", False): {"embed": {"embedding": ("vocab", "embed")},
                          "layer_0": rnn_axes, "layer_1": rnn_axes,
                          "output": {"kernel": ("embed", "vocab"), "bias": ("vocab",)}},
        ("gru", True): {"embed": {"embedding": ("vocab", "embed")},
                        "layer_0": gru_axes, "layer_1": gru_axes, "output_bias": ("vocab",)},
    }
    for (cell, tie), expected in cases.items():
        cfg = _config(cell, tie)
        boxed = rnnlm.RNNLM(cfg).init(jax.random.key(0), tokens)["params"]
        names = jax.tree.map(lambda x: x.names, boxed,
                             is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
        assert names == expected, cell
        # 6 FLOPs per weight of every matmul: the layers' kernels and the output projection
        # (the embedding table itself when tied).
        params = nn.unbox(boxed)
        kernels = sum(params[f"layer_{k}"][n].size for k in range(2)
                      for n in ("input_kernel", "recurrent_kernel"))
        kernels += params["embed"]["embedding"].size if tie else params["output"]["kernel"].size
        assert rnnlm.flops_per_token(cfg) == 6.0 * kernels


def test_bfloat16_compute_returns_float32_logits_close_to_float32():
    cfg = _config("lstm")
    params = _random_params(cfg)
    full = rnnlm.RNNLM(cfg).apply({"params": params}, jnp.asarray(TOKENS))
    half_cfg = dataclasses.replace(cfg, dtype="bfloat16")
    half, carries = rnnlm.RNNLM(half_cfg).apply({"params": params}, jnp.asarray(TOKENS),
                                                return_carries=True)
    assert half.dtype == jnp.float32
    assert all(c.dtype == jnp.float32 for c in jax.tree.leaves(carries))  # the state stays f32
    assert_close(half, full, 0.05)
    assert not np.allclose(half, full, atol=1e-6)  # it really computed in bfloat16


def test_dropout_acts_only_in_training():
    cfg = _config("gru", dropout_rate=0.5)
    params = _random_params(cfg)
    model, tokens = rnnlm.RNNLM(cfg), jnp.asarray(TOKENS)
    plain = rnnlm.RNNLM(dataclasses.replace(cfg, dropout_rate=0.0)).apply({"params": params},
                                                                          tokens)
    np.testing.assert_array_equal(model.apply({"params": params}, tokens), plain)
    train = [model.apply({"params": params}, tokens, deterministic=False,
                         rngs={"dropout": jax.random.key(s)}) for s in (0, 1)]
    assert not np.allclose(train[0], plain) and not np.allclose(train[0], train[1])


@pytest.mark.parametrize("kw,needle", [
    (dict(cell="transformer"), "cell"),
    (dict(num_layers=0), "num_layers"),
    (dict(hidden_size=0), "hidden_size"),
    (dict(dropout_rate=1.0), "dropout_rate"),
    (dict(tie_embeddings=True, embed_dim=8, hidden_size=16), "tie_embeddings"),
    (dict(dtype="int32"), "dtype"),
    (dict(param_dtype="float33"), "param_dtype"),
])
def test_bad_config_names_the_field(kw, needle):
    with pytest.raises(ValueError, match=f"RNNLMConfig.{needle}"):
        rnnlm.RNNLMConfig(vocab_size=V, **kw)


def test_bad_inputs_and_unknown_size_raise():
    cfg = _config("rnn")
    model, tokens = rnnlm.RNNLM(cfg), jnp.zeros((2, 5), jnp.int32)
    with pytest.raises(ValueError, match="segment_ids shape"):
        model.init(jax.random.key(0), tokens, segment_ids=jnp.zeros((2, 4), jnp.int32))
    with pytest.raises(ValueError, match=r"\[batch, length\]"):
        model.init(jax.random.key(0), jnp.zeros((5,), jnp.int32))
    with pytest.raises(ValueError, match="one entry per layer"):
        model.init(jax.random.key(0), tokens, carries=rnnlm.initial_carries(cfg, 2)[:1])
    with pytest.raises(ValueError, match="huge"):
        rnnlm.config_for_size("huge", vocab_size=V)
    tiny = rnnlm.config_for_size("tiny", vocab_size=V, cell="gru", num_layers=3)
    assert (tiny.cell, tiny.num_layers, tiny.hidden_size) == ("gru", 3, 64)
