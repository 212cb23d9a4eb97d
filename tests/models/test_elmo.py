"""ELMo's biLM and ScalarMix: directions read the way they claim, padding is invisible, the LSTM
and the mix equal float64 references, and every parameter names its logical axes."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.models import elmo

V, H = 13, 8


def _bilm(num_layers=2, residual=True, rnn_backend="scan"):
    return elmo.BiLM(elmo.BiLMConfig(vocab_size=V, hidden_size=H, num_layers=num_layers,
                                     residual=residual, rnn_backend=rnn_backend))


def _init(model, seed=0):
    """Random N(0, 0.5^2) params of the model's shapes (eval_shape: no init to compile), biases
    included, so a gate-order or direction slip cannot hide behind a zero or one init."""
    ids = jnp.ones((1, 4), jnp.int32)
    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), ids)["params"])
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: jnp.asarray(rng.normal(0, 0.5, x.shape), x.dtype), shapes)


def _jit(model):
    """(logits pair, layers) of model at params, compiled once per input shape."""
    return jax.jit(lambda params, *args: (model.apply({"params": params}, *args),
                                          model.apply({"params": params}, *args,
                                                      method="layers")))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _lstm_reference(x, w, length, reverse):
    """Float64 LSTM over x [T, D] (gate order i, f, g, o) up to `length`; zeros after."""
    wi, wh, b = (np.asarray(w[k], np.float64) for k in ("input_kernel", "recurrent_kernel",
                                                         "bias"))
    c, h = np.zeros(wh.shape[0]), np.zeros(wh.shape[0])
    out = np.zeros((x.shape[0], wh.shape[0]))
    steps = range(length - 1, -1, -1) if reverse else range(length)
    for t in steps:
        z = np.einsum("d,dgh->gh", x[t], wi) + np.einsum("k,kgh->gh", h, wh) + b  # (4, H)
        i, f, g, o = _sigmoid(z[0]), _sigmoid(z[1]), np.tanh(z[2]), _sigmoid(z[3])
        c = f * c + i * g
        h = o * np.tanh(c)
        out[t] = h
    return out


def test_one_layer_bilm_matches_float64_lstm_reference():
    model = _bilm(num_layers=1)
    params = _init(model)
    ids = np.array([[2, 5, 7, 9, 3, 0], [2, 11, 4, 3, 0, 0]], np.int32)
    lengths = np.array([5, 4], np.int32)
    (fwd_logits, bwd_logits), layers = _jit(model)(params, ids, lengths)
    layers = np.asarray(layers)
    table = np.asarray(params["embed"]["embedding"], np.float64)
    kernel = np.asarray(params["softmax"]["kernel"], np.float64)
    bias = np.asarray(params["softmax"]["bias"], np.float64)
    for b in range(2):
        x = table[ids[b]]  # (T, H)
        n = lengths[b]
        f = _lstm_reference(x, params["forward_0"]["cell"], n, reverse=False)
        r = _lstm_reference(x, params["backward_0"]["cell"], n, reverse=True)
        x0 = np.where(np.arange(6)[:, None] < n, x, 0.0)
        assert_close(layers[b, 0], np.concatenate([x0, x0], -1), 1e-5)
        assert_close(layers[b, 1], np.concatenate([f, r], -1), 1e-4)
        # One shared softmax scores both directions' top layer.
        assert_close(np.asarray(fwd_logits[b, :n]), f[:n] @ kernel + bias, 1e-4)
        assert_close(np.asarray(bwd_logits[b, :n]), r[:n] @ kernel + bias, 1e-4)


def test_the_fused_lstm_kernel_gives_the_scans_bilm_and_gradients():
    # config.model.rnn_backend='cpu_fused': the same parameters, the same logits, layers and
    # gradients as the scan, padding included.
    scan, fused = _bilm(), _bilm(rnn_backend="cpu_fused")
    params = _init(scan, seed=3)
    ids = np.array([[2, 5, 7, 9, 3, 0], [2, 11, 4, 3, 0, 0]], np.int32)
    lengths = np.array([5, 4], np.int32)

    def loss(model):
        def f(p):
            fwd, bwd = model.apply({"params": p}, ids, lengths)
            layers = model.apply({"params": p}, ids, lengths, method="layers")
            return jnp.sum(jnp.sin(fwd)) + jnp.sum(jnp.cos(bwd)) + jnp.sum(layers ** 2)
        return jax.jit(jax.value_and_grad(f))(params)

    assert_close(loss(fused), loss(scan), 2e-5)


def test_second_layer_adds_the_residual():
    ids = np.array([[2, 5, 7, 9, 3, 0]], np.int32)
    lengths = np.array([5], np.int32)
    with_res, without = _bilm(residual=True), _bilm(residual=False)
    params = _init(with_res)  # the same parameters serve both
    a = np.asarray(_jit(with_res)(params, ids, lengths)[1])
    b = np.asarray(_jit(without)(params, ids, lengths)[1])
    assert_close(a[:, 1], b[:, 1], 1e-7)  # the first LSTM layer has no residual
    assert_close(a[:, 2], b[:, 2] + b[:, 1], 1e-5)


def test_forward_reads_left_to_right_and_backward_right_to_left():
    model = _bilm()
    params = _init(model, seed=1)
    apply = _jit(model)
    ids = np.array([[2, 5, 7, 9, 4, 3]], np.int32)
    fwd, bwd = (np.asarray(a) for a in apply(params, ids)[0])
    for s in range(6):
        changed = ids.copy()
        changed[0, s] = 12 if ids[0, s] != 12 else 11
        fwd2, bwd2 = (np.asarray(a) for a in apply(params, changed)[0])
        moved_f = np.abs(fwd2 - fwd).max(axis=-1)[0] > 1e-6  # (T,) positions that changed
        moved_b = np.abs(bwd2 - bwd).max(axis=-1)[0] > 1e-6
        # Forward logits at t see tokens <= t only; backward logits at t tokens >= t only.
        np.testing.assert_array_equal(moved_f, np.arange(6) >= s, err_msg=f"forward, s={s}")
        np.testing.assert_array_equal(moved_b, np.arange(6) <= s, err_msg=f"backward, s={s}")


def test_padding_is_invisible():
    model = _bilm()
    params = _init(model, seed=2)
    short = np.array([[2, 5, 7, 3]], np.int32)
    # The same sentence in a wider row, with arbitrary ids after its length.
    long = np.array([[2, 5, 7, 3, 9, 12, 4]], np.int32)
    lengths = np.array([4], np.int32)
    apply = _jit(model)
    (fa, ba), la = apply(params, short, lengths)
    (fb, bb), lb = apply(params, long, lengths)
    for x, y in ((fa, fb), (ba, bb)):
        assert_close(np.asarray(y)[:, :4], np.asarray(x), 1e-5)
    la, lb = np.asarray(la), np.asarray(lb)
    assert_close(lb[:, :, :4], la, 1e-5)
    np.testing.assert_array_equal(lb[:, :, 4:], 0.0)  # nothing past the length


def test_scalar_mix_matches_float64_reference():
    rng = np.random.default_rng(3)
    layers = rng.normal(size=(2, 3, 5, 4)).astype(np.float32)
    s = np.array([0.3, -1.2, 0.8], np.float32)
    params = {"scalar_weights": s, "gamma": np.float32(1.7)}
    out = np.asarray(elmo.ScalarMix(3).apply({"params": params}, layers))
    w = np.exp(s.astype(np.float64))
    w /= w.sum()
    expected = 1.7 * np.einsum("l,bltd->btd", w, layers.astype(np.float64))
    assert_close(out, expected, 1e-5)

    # With layer_norm each layer is first standardised over its features, per token.
    out = np.asarray(elmo.ScalarMix(3, layer_norm=True).apply({"params": params}, layers))
    x = layers.astype(np.float64)
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6)
    assert_close(out, 1.7 * np.einsum("l,bltd->btd", w, x), 1e-4)


def test_scalar_mix_weights_are_normalised_and_trainable():
    mix = elmo.ScalarMix(3)
    rng = np.random.default_rng(4)
    h = rng.normal(size=(2, 1, 5, 4)).astype(np.float32)
    params = {"scalar_weights": np.array([2.0, -3.0, 0.5], np.float32), "gamma": np.float32(0.6)}
    # Three copies of one layer: whatever s is, weights summing to 1 give back gamma * h.
    out = mix.apply({"params": params}, np.repeat(h, 3, axis=1))
    assert_close(np.asarray(out), 0.6 * h[:, 0], 1e-5)

    # Different layers: the loss has a gradient in every s_j and in gamma.
    layers = rng.normal(size=(2, 3, 5, 4)).astype(np.float32)
    target = rng.normal(size=(2, 5, 4)).astype(np.float32)
    grads = jax.grad(lambda p: jnp.sum((mix.apply({"params": p}, layers) - target) ** 2))(params)
    assert np.all(np.abs(np.asarray(grads["scalar_weights"])) > 1e-4)
    assert abs(float(grads["gamma"])) > 1e-4
    # Fresh weights: s = 0 (equal mix), gamma = 1.
    fresh = nn.unbox(mix.init(jax.random.key(0), layers)["params"])
    np.testing.assert_array_equal(np.asarray(fresh["scalar_weights"]), 0.0)
    assert float(fresh["gamma"]) == 1.0


def _assert_all_boxed(variables):
    leaves = jax.tree.leaves(variables, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    assert leaves
    for leaf in leaves:
        assert isinstance(leaf, nn.LogicallyPartitioned), leaf
        assert len(leaf.names) == leaf.value.ndim, leaf


def test_every_parameter_names_its_logical_axes():
    ids = jnp.ones((2, 6), jnp.int32)
    lengths = jnp.full((2,), 6)
    # Shapes only (eval_shape): the boxes are there before any value is computed.
    _assert_all_boxed(jax.eval_shape(_bilm().init, jax.random.key(0), ids, lengths)["params"])
    bilm = elmo.BiLMConfig(vocab_size=V, hidden_size=H)
    for cfg in (elmo.FeatureClassifierConfig(num_classes=3, kind="elmo", bilm=bilm, pair=True,
                                             hidden_size=8),
                elmo.FeatureClassifierConfig(num_classes=3, kind="word2vec", vocab_size=V,
                                             embed_dim=4, hidden_size=8)):
        variables = jax.eval_shape(elmo.FeatureClassifier(cfg).init, jax.random.key(0), ids,
                                   lengths, ids, lengths)
        _assert_all_boxed(variables["params"])


def test_elmo_features_skip_sentence_boundaries_and_word2vec_oov_reads_zero():
    bilm = elmo.BiLMConfig(vocab_size=V, hidden_size=H)
    cfg = elmo.FeatureClassifierConfig(num_classes=2, kind="elmo", bilm=bilm, hidden_size=8)
    model = elmo.FeatureClassifier(cfg)
    ids = np.array([[2, 5, 1, 3, 2, 6, 3, 0]], np.int32)  # <s> w <unk> </s> <s> w </s> <pad>
    params = jax.eval_shape(model.init, jax.random.key(0), ids, np.array([7]))
    params = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), nn.unbox(params))
    # The mask depends on the ids only; shapes of the features are checked too.
    features, mask = jax.jit(lambda p: model.apply(p, ids, np.array([7]), method="features"))(
        params)
    assert features.shape == (1, 8, 2 * H)
    np.testing.assert_array_equal(np.asarray(mask)[0], [0, 1, 1, 0, 0, 1, 0, 0])

    cfg = elmo.FeatureClassifierConfig(num_classes=2, kind="word2vec", vocab_size=V, embed_dim=4)
    model = elmo.FeatureClassifier(cfg)
    ids = np.array([[4, V, 6]], np.int32)  # id V: a word outside the table
    params = model.init(jax.random.key(0), ids, np.array([3]))
    vectors, mask = model.apply(params, ids, np.array([3]), method="features")
    table = np.asarray(nn.unbox(params["params"])["embedding"])
    np.testing.assert_array_equal(np.asarray(vectors)[0], [table[4], np.zeros(4), table[6]])
    np.testing.assert_array_equal(np.asarray(mask)[0], [1, 1, 1])


@pytest.mark.parametrize("kwargs, field", [
    ({"hidden_size": 0}, "hidden_size"),
    ({"num_layers": 0}, "num_layers"),
    ({"dropout_rate": 1.0}, "dropout_rate"),
    ({"dtype": "int32"}, "dtype"),
    ({"rnn_backend": "fast"}, "rnn_backend"),
])
def test_bad_bilm_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        elmo.BiLMConfig(vocab_size=V, **kwargs)


def test_config_for_size_and_bad_feature_kind():
    assert elmo.config_for_size("tiny", vocab_size=V).hidden_size == 32
    with pytest.raises(ValueError, match="config.model.size"):
        elmo.config_for_size("huge", vocab_size=V)
    with pytest.raises(ValueError, match="config.features.kind"):
        elmo.FeatureClassifierConfig(num_classes=2, kind="glove")


def test_align_head_ignores_word_order_and_padding_and_needs_pairs():
    """The decomposable-attention head sees bags of token features: shuffling a text's tokens
    or padding it changes nothing, so any context must come from the features."""
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 5, 6)).astype(np.float32), rng.normal(size=(2, 4, 6)).astype(
        np.float32)
    mask_a = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], bool)
    mask_b = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
    head = elmo.AlignEncoder(hidden_size=8)
    params = head.init(jax.random.key(0), a, mask_a, b, mask_b)
    out = head.apply(params, a, mask_a, b, mask_b)
    assert out.shape == (2, 16)
    perm_a, perm_b = [2, 0, 3, 1, 4], [1, 2, 0, 3]  # within the real tokens of row 0
    shuffled = head.apply(params, a[:, perm_a], mask_a[:, perm_a], b[:, perm_b],
                          mask_b[:, perm_b])
    assert_close(np.asarray(shuffled[0]), np.asarray(out[0]), 1e-5)
    junk_a = a.copy()
    junk_a[~mask_a] = 100.0  # padding's features never enter
    assert_close(np.asarray(head.apply(params, junk_a, mask_a, b, mask_b)), np.asarray(out), 1e-6)
    with pytest.raises(ValueError, match="align"):
        elmo.FeatureClassifierConfig(num_classes=2, kind="word2vec", vocab_size=5, embed_dim=4,
                                     head="align", pair=False)
