"""GPT fine-tuning model (zoo.models.gpt_classifier): the head reads the [extract] state, which
sees the whole input; multiple choice scores each option alone; the objective is cls + lambda *
LM; the new tokens train while the 'gpt' subtree stays a plain GPT's."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.models import gpt
from zoo.models.gpt_classifier import (
    GPTForClassification,
    delimiter_id,
    extract_id,
)
from zoo.tasks.gpt_classification import finetune_loss_sums, transform_inputs

V, T = 11, 8
CONFIG = gpt.GPTConfig(vocab_size=V, max_len=T, num_layers=2, num_heads=2, embed_dim=8,
                       mlp_dim=16, dropout_rate=0.0, attention_dropout_rate=0.0)
DELIM, EXTRACT = delimiter_id(V), extract_id(V)
# [start]=2, a=(7, 8), [delim], b=(9,), [extract], padding 0.
ROW = np.array([2, 7, 8, DELIM, 9, EXTRACT, 0, 0], np.int32)
E = 5  # ROW's extract position


@pytest.fixture(scope="module")
def model_and_params():
    model = GPTForClassification(CONFIG, num_labels=3, dropout_rate=0.0)
    params = nn.unbox(model.init(jax.random.key(0), ROW[None])["params"])
    # A non-zero head bias, so a test reading the wrong state or dropping the bias fails.
    params = jax.tree.map(lambda x: x, params)
    params["classifier"]["bias"] = jnp.array([0.1, -0.2, 0.3])
    return model, params


def test_head_reads_exactly_the_extract_state(model_and_params):
    model, params = model_and_params
    logits, lm_logits = model.apply({"params": params}, ROW[None])
    # The same state computed by hand: GPT with the special rows, its final hidden at E.
    _, hidden = gpt.GPT(CONFIG).apply(
        {"params": params["gpt"]}, ROW[None], extra_embeddings=params["special_tokens"],
        return_hidden=True)
    h = np.asarray(hidden[0, E], np.float64)
    w = np.asarray(params["classifier"]["kernel"], np.float64)
    b = np.asarray(params["classifier"]["bias"], np.float64)
    assert_close(np.asarray(logits[0]), h @ w + b, 1e-5)
    assert lm_logits.shape == (1, T, V)
    # Not the last column: its state differs from the extract position's.
    assert not np.allclose(np.asarray(hidden[0, -1]), h, atol=1e-3)


def test_extract_state_sees_every_input_token_and_nothing_after_it(model_and_params):
    model, params = model_and_params
    # Row j changes the token at position j (a text id to another, a special to text).
    variants = np.tile(ROW, (T, 1))
    for j in range(T):
        variants[j, j] = 10 if ROW[j] != 10 else 3
    variants[E, E] = EXTRACT  # position E must stay the extract token to be read
    logits = np.asarray(model.apply({"params": params}, np.concatenate([ROW[None], variants]))[0])
    changed = np.abs(logits[1:] - logits[0]).max(axis=-1)
    before = [j for j in range(E)]
    after = [j for j in range(E + 1, T)]
    # The causal model lets [extract] attend to the whole input: every earlier token matters...
    assert (changed[before] > 1e-6).all(), changed
    # ... and padding after it never does.
    np.testing.assert_array_equal(changed[after], 0.0)


@pytest.mark.slow
def test_multiple_choice_scores_each_option_alone():
    mc = GPTForClassification(CONFIG, multiple_choice=True, dropout_rate=0.0)
    mc_params = nn.unbox(mc.init(jax.random.key(1), ROW[None, None])["params"])
    assert mc_params["classifier"]["kernel"].shape == (8, 1)  # one score per option row
    options = np.stack([ROW, ROW.copy(), ROW.copy()])
    options[1, 4], options[2, 4] = 3, 10  # three options differing in the option token
    tokens = options[None]  # (B=1, K=3, T)
    scores, lm_logits = mc.apply({"params": mc_params}, tokens)
    assert scores.shape == (1, 3) and lm_logits.shape == (1, 3, T, V)
    alone = [float(mc.apply({"params": mc_params}, o[None, None])[0][0, 0]) for o in options]
    assert_close(np.asarray(scores[0]), np.asarray(alone), 1e-5)
    assert len(set(np.round(alone, 6))) == 3
    # Permuting the options permutes their scores: no option sees another.
    permuted = np.asarray(mc.apply({"params": mc_params}, options[[2, 0, 1]][None])[0][0])
    assert_close(permuted, np.asarray(scores[0])[[2, 0, 1]], 1e-5)
    # The class loss is a softmax over the K options (float64 reference).
    s = np.asarray(scores[0], np.float64)
    batch = {"label": np.array([2]), "example_weight": np.ones(1, np.float32),
             "lm_targets": np.zeros((1, 3, T), np.int32),
             "lm_weights": np.zeros((1, 3, T), np.float32)}
    sums = finetune_loss_sums(scores, lm_logits, batch, lm_weight=0.5)
    expected = np.log(np.exp(s).sum()) - s[2]
    np.testing.assert_allclose(float(sums["loss_sum"]), expected, rtol=1e-5)


def test_wrong_input_rank_is_an_error_naming_the_shape(model_and_params):
    model, params = model_and_params
    with pytest.raises(ValueError, match="multiple_choice=False"):
        model.apply({"params": params}, ROW[None, None])


@pytest.mark.parametrize("lm_weight", [0.0, 0.5])
def test_objective_is_cls_loss_plus_lambda_lm_loss(lm_weight):
    rng = np.random.default_rng(0)
    b, c = 3, 4
    logits = rng.normal(size=(b, c)).astype(np.float32)
    lm_logits = rng.normal(size=(b, T, V)).astype(np.float32)
    labels = np.array([1, 0, 3])
    example_weight = np.array([1.0, 1.0, 0.0], np.float32)  # the last row is padding
    targets = rng.integers(0, V, size=(b, T)).astype(np.int32)
    text = np.zeros((b, T), bool)
    text[0, :5], text[1, 2:4] = True, True
    weights = text / np.maximum(text.sum(axis=1, keepdims=True), 1)
    batch = {"label": labels, "example_weight": example_weight, "lm_targets": targets,
             "lm_weights": weights.astype(np.float32)}
    sums = {k: float(v) for k, v in finetune_loss_sums(logits, lm_logits, batch, lm_weight).items()}

    def log_softmax(x):
        x = x.astype(np.float64)
        return x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
            - x.max(-1, keepdims=True)

    cls = -log_softmax(logits)[np.arange(b), labels] * example_weight
    nll = -np.take_along_axis(log_softmax(lm_logits), targets[..., None], -1)[..., 0]
    lm = np.array([nll[i][text[i]].mean() if text[i].any() else 0.0 for i in range(b)])
    np.testing.assert_allclose(sums["cls_loss_sum"], cls.sum(), rtol=1e-5)
    np.testing.assert_allclose(sums["lm_loss_sum"], lm.sum(), rtol=1e-5)
    np.testing.assert_allclose(sums["loss_sum"], cls.sum() + lm_weight * lm.sum(), rtol=1e-5)
    assert sums["weight_sum"] == 2.0


def test_transform_inputs_writes_the_papers_rows_and_text_targets():
    out = transform_inputs([[[7, 8, 9], [10]], [[7, 8, 9, 7, 8]]], seq_len=7, vocab_size=V,
                           start_id=2, pad_id=0)
    np.testing.assert_array_equal(out["tokens"], [[2, 7, 8, 9, DELIM, 10, EXTRACT],
                                                  [2, 7, 8, 9, 7, 8, EXTRACT]])
    np.testing.assert_array_equal(out["truncated"], [False, False])
    # One position shorter: the longest part loses its last token ([7, 8, 9] -> [7, 8]), and
    # [extract] is always kept; a short row is padded after [extract].
    out = transform_inputs([[[7, 8, 9], [10]], [[7, 8, 9]]], seq_len=6, vocab_size=V,
                           start_id=2, pad_id=0)
    np.testing.assert_array_equal(out["tokens"], [[2, 7, 8, DELIM, 10, EXTRACT],
                                                  [2, 7, 8, 9, EXTRACT, 0]])
    np.testing.assert_array_equal(out["truncated"], [True, False])
    # Targets: the next token wherever it is text ([delim] predicts 10), never a special/pad.
    np.testing.assert_array_equal(out["lm_text"], [[1, 1, 0, 1, 0, 0], [1, 1, 1, 0, 0, 0]])
    np.testing.assert_array_equal(out["lm_targets"], [[7, 8, 0, 10, 0, 0], [7, 8, 9, 0, 0, 0]])


def test_new_tokens_train_and_the_gpt_subtree_is_a_plain_gpts(model_and_params):
    model, params = model_and_params
    plain = nn.unbox(gpt.GPT(CONFIG).init(jax.random.key(0), ROW[None])["params"])
    shapes = lambda tree: jax.tree.map(jnp.shape, tree)
    assert jax.tree.structure(params["gpt"]) == jax.tree.structure(plain)
    assert shapes(params["gpt"]) == shapes(plain)
    assert set(params) == {"gpt", "special_tokens", "classifier"}
    assert params["special_tokens"].shape == (2, CONFIG.embed_dim)

    def loss(p):
        logits, lm_logits = model.apply({"params": p}, ROW[None])
        batch = {"label": np.array([1]), "example_weight": np.ones(1, np.float32),
                 "lm_targets": np.zeros((1, T), np.int32),
                 "lm_weights": np.zeros((1, T), np.float32)}
        return finetune_loss_sums(logits, lm_logits, batch, 0.5)["loss_sum"]

    grads = jax.jit(jax.grad(loss))(params)  # compiled: op by op it takes seconds
    # Both [delim] and [extract] rows get gradient, and so does the pretrained model.
    assert (np.abs(np.asarray(grads["special_tokens"])).sum(axis=1) > 0).all()
    assert np.abs(np.asarray(grads["gpt"]["wte"]["embedding"])).sum() > 0


def test_gpt_extra_embeddings_and_hidden_keep_plain_behaviour():
    model = gpt.GPT(CONFIG)
    tokens = np.array([[2, 7, 8, 9, 3, 0, 0, 0]], np.int32)
    params = nn.unbox(model.init(jax.random.key(2), tokens)["params"])
    extra = jax.random.normal(jax.random.key(3), (2, CONFIG.embed_dim))
    plain = model.apply({"params": params}, tokens)
    logits, hidden = model.apply({"params": params}, tokens, extra_embeddings=extra,
                                 return_hidden=True)
    # No id >= V: the extra rows change nothing; the logits are hidden @ wte^T.
    np.testing.assert_array_equal(np.asarray(plain), np.asarray(logits))
    wte = np.asarray(params["wte"]["embedding"], np.float64)
    assert_close(np.asarray(hidden, np.float64) @ wte.T, np.asarray(logits), 1e-4)
    # An id V + i reads extra row i: the same states as a token whose embedding is that row.
    swapped = tokens.copy()
    swapped[0, 1] = V + 1
    params_with_row = jax.tree.map(lambda x: x, params)
    params_with_row["wte"] = {"embedding": params["wte"]["embedding"].at[7].set(extra[1])}
    _, got = model.apply({"params": params}, swapped, extra_embeddings=extra, return_hidden=True)
    _, want = model.apply({"params": params_with_row}, tokens, return_hidden=True)
    assert_close(np.asarray(got), np.asarray(want), 1e-5)
