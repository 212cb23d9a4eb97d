"""BERT fine-tuning heads: shapes, dtypes and axis names; the span head and the classifier
against float64 numpy heads over BertModel's outputs (dropout included); a pretraining
checkpoint's `bert` params dropping into both heads unchanged; the heads' checkpoint names
(zoo.convert.bert, no torch needed)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.convert import bert as convert
from zoo.models import bert

B, T, H, LABELS = 2, 6, 16, 3
CONFIG = bert.BertConfig(
    vocab_size=50, hidden_size=H, num_layers=2, num_heads=2, intermediate_size=32,
    max_position_embeddings=16, type_vocab_size=2,
)
IDS = np.array([[2, 7, 9, 3, 11, 4], [2, 5, 8, 6, 0, 0]], np.int32)  # row 1: 2 pads
TYPES = np.array([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 0, 0]], np.int32)
MASK = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], np.int32)
POSITIONS = np.array([[4, 1], [3, 0]], np.int32)


def _init(module, *extra):
    """Boxed abstract params (shapes, dtypes, axis names): nothing is compiled."""
    return jax.eval_shape(module.init, jax.random.key(0), IDS, TYPES, MASK, *extra)["params"]


def _random(abstract, seed):
    """Concrete params for abstract ones: N(0, 0.2^2) everywhere, LayerNorm gains 1 + N(0,
    0.1^2); init's zero biases and unit gains would hide a dropped bias or gain."""
    rng = np.random.default_rng(seed)

    def draw(path, x):
        base = 1.0 if path[-1].key == "scale" else 0.0
        scale = 0.1 if base else 0.2
        return (base + rng.normal(0, scale, x.shape)).astype(x.dtype)

    return jax.tree_util.tree_map_with_path(draw, nn.unbox(abstract))


@pytest.fixture(scope="module")
def pretrained():
    """A 'pretraining checkpoint': BertForPreTraining params."""
    return _random(_init(bert.BertForPreTraining(CONFIG), POSITIONS), 0)


@pytest.fixture(scope="module")
def qa_params(pretrained):
    """The pretraining checkpoint's encoder under a fresh span head."""
    head = _init(bert.BertForQuestionAnswering(CONFIG))["qa_outputs"]
    return {"bert": pretrained["bert"], "qa_outputs": _random(head, 1)}


@pytest.fixture(scope="module")
def cls_params(pretrained):
    head = _init(bert.BertForSequenceClassification(CONFIG, LABELS))["classifier"]
    return {"bert": pretrained["bert"], "classifier": _random(head, 2)}


_encoder_jit = jax.jit(lambda p: bert.BertModel(CONFIG).apply({"params": p}, IDS, TYPES, MASK))


def _encoder(params):
    seq, pooled = _encoder_jit(params)
    return np.asarray(seq, np.float64), np.asarray(pooled, np.float64)


def _dense64(x, layer):
    return x @ np.asarray(layer["kernel"], np.float64) + np.asarray(layer["bias"], np.float64)


def test_shapes_dtypes_and_axis_names():
    qa = _init(bert.BertForQuestionAnswering(CONFIG))
    cls = _init(bert.BertForSequenceClassification(CONFIG, LABELS))
    for layer, out in ((qa["qa_outputs"], 2), (cls["classifier"], LABELS)):
        assert layer["kernel"].names == ("embed", None) and layer["kernel"].value.shape == (H, out)
        assert layer["bias"].names == (None,) and layer["bias"].value.shape == (out,)
    # bf16 compute still hands back float32 logits.
    bf16 = bert.BertConfig(**{**CONFIG.__dict__, "dtype": "bfloat16"})
    start, end = jax.eval_shape(
        lambda: bert.BertForQuestionAnswering(bf16).init_with_output(
            jax.random.key(0), IDS, TYPES, MASK)[0])
    logits = jax.eval_shape(
        lambda: bert.BertForSequenceClassification(bf16, LABELS).init_with_output(
            jax.random.key(0), IDS, TYPES, MASK)[0])
    assert (start.shape, start.dtype, end.shape, end.dtype) == ((B, T), jnp.float32,
                                                                (B, T), jnp.float32)
    assert (logits.shape, logits.dtype) == ((B, LABELS), jnp.float32)
    with pytest.raises(ValueError, match="num_labels must be >= 1, got 0"):
        bert.BertForSequenceClassification(CONFIG, 0).init(jax.random.key(0), IDS, TYPES, MASK)


def test_pretraining_bert_params_fit_both_heads_unchanged(pretrained, qa_params, cls_params):
    """The heads' own `bert` subtree is exactly BertForPreTraining's: same paths, shapes, dtypes
    and logical axis names, so the pretrained subtree is used as is (the fixtures apply it)."""
    pt = _init(bert.BertForPreTraining(CONFIG), POSITIONS)
    qa = _init(bert.BertForQuestionAnswering(CONFIG))
    cls = _init(bert.BertForSequenceClassification(CONFIG, LABELS))
    assert set(qa) == {"bert", "qa_outputs"} and set(cls) == {"bert", "classifier"}

    def spec(tree):
        return jax.tree.map(lambda p: (p.value.shape, p.value.dtype, p.names), tree,
                            is_leaf=lambda x: isinstance(x, nn.Partitioned))

    assert spec(qa["bert"]) == spec(pt["bert"]) == spec(cls["bert"])
    # The subtree is used as is (the span and classifier tests below run on it).
    assert qa_params["bert"] is pretrained["bert"] and cls_params["bert"] is pretrained["bert"]


def test_span_logits_are_a_dense_head_over_the_sequence_output(qa_params):
    seq, _ = _encoder(qa_params["bert"])
    ref = _dense64(seq, qa_params["qa_outputs"])  # (B, T, 2)
    start, end = jax.jit(lambda p: bert.BertForQuestionAnswering(CONFIG).apply(
        {"params": p}, IDS, TYPES, MASK))(qa_params)
    assert np.abs(ref[..., 0] - ref[..., 1]).max() > 0.1  # start and end differ: order matters
    assert_close(start, ref[..., 0], 1e-5, err_msg="start")
    assert_close(end, ref[..., 1], 1e-5, err_msg="end")


def test_classifier_is_dense_over_dropout_of_pooled(cls_params):
    model = bert.BertForSequenceClassification(CONFIG, LABELS, dropout_rate=0.5)
    default = bert.BertForSequenceClassification(CONFIG, LABELS)  # config.dropout_rate = 0.1

    @jax.jit
    def run(p, key):
        """(eval logits, training logits + what the pooler and dropout produced, the training
        logits of `default` under the same rng)."""
        train = model.apply(
            {"params": p}, IDS, TYPES, MASK, deterministic=False, rngs={"dropout": key},
            capture_intermediates=lambda m, _: m.name in ("pooler", "dropout"),
            mutable=["intermediates"])
        other = default.apply({"params": p}, IDS, TYPES, MASK, deterministic=False,
                              rngs={"dropout": key})
        return model.apply({"params": p}, IDS, TYPES, MASK), train, other

    logits, (train_logits, state), default_logits = run(cls_params, jax.random.key(3))
    _, pooled = _encoder(cls_params["bert"])
    assert_close(logits, _dense64(pooled, cls_params["classifier"]), 1e-5)
    seen = state["intermediates"]
    pooled = np.asarray(seen["bert"]["pooler"]["__call__"][0], np.float64)  # this step's
    dropped = np.asarray(seen["dropout"]["__call__"][0], np.float64)
    # Inverted dropout at rate 0.5: every unit is 0 or twice the pooled value; both happen.
    kept = dropped != 0
    assert_close(dropped, np.where(kept, 2 * pooled, 0), 1e-6, err_msg="dropout output")
    assert 0 < kept.sum() < kept.size
    assert_close(train_logits, _dense64(dropped, cls_params["classifier"]), 1e-5)
    # dropout_rate=None uses config.dropout_rate: another rate, so other masks and logits.
    assert not np.allclose(default_logits, train_logits)


def test_head_params_convert_to_checkpoint_names_and_back(qa_params, cls_params):
    """The heads' rows in zoo.convert.bert: google-research names (run_squad.py's
    cls/squad/output_weights, run_classifier.py's root output_weights, both (out, H)) and HF's
    (qa_outputs / classifier (out, H); HF's span model has no pooler), each detected on the way
    back and reproducing the params exactly."""
    def equal(a, b):
        jax.tree.map(np.testing.assert_array_equal, a, b)
        assert jax.tree.structure(a) == jax.tree.structure(b)

    qa_tf = convert.params_to_tf_variables(qa_params, CONFIG)
    np.testing.assert_array_equal(qa_tf["cls/squad/output_weights"],
                                  qa_params["qa_outputs"]["kernel"].T)
    assert "bert/pooler/dense/kernel" in qa_tf  # run_squad.py's checkpoints keep the pooler
    equal(convert.params_from_tf_variables(qa_tf, CONFIG), qa_params)
    cls_tf = convert.params_to_tf_variables(cls_params, CONFIG)
    assert cls_tf["output_weights"].shape == (LABELS, H)
    equal(convert.params_from_tf_variables(cls_tf, CONFIG), cls_params)

    qa_hf = convert.params_to_hf(qa_params, CONFIG)
    np.testing.assert_array_equal(qa_hf["qa_outputs.weight"], qa_params["qa_outputs"]["kernel"].T)
    assert not any("pooler" in name for name in qa_hf)
    back = convert.params_from_hf(qa_hf, CONFIG)
    assert not np.any(back["bert"]["pooler"]["dense"]["kernel"])  # zeros: the head ignores it
    back["bert"]["pooler"] = qa_params["bert"]["pooler"]
    equal(back, qa_params)
    cls_hf = convert.params_to_hf(cls_params, CONFIG)
    np.testing.assert_array_equal(cls_hf["classifier.bias"], cls_params["classifier"]["bias"])
    equal(convert.params_from_hf(cls_hf, CONFIG, num_labels=LABELS), cls_params)
    # heads=False leaves a task head behind; a wrong num_labels or two heads are refused.
    equal(convert.params_from_hf(cls_hf, CONFIG, heads=False), cls_params["bert"])
    with pytest.raises(ValueError, match=r"'classifier\.weight' has shape \(3, 16\) but the "
                                         r"config needs \(2, 16\); pass the checkpoint's "
                                         r"num_labels"):
        convert.params_from_hf(cls_hf, CONFIG, num_labels=2)
    with pytest.raises(ValueError, match=r"holds the heads of BertForQuestionAnswering and "
                                         r"BertForSequenceClassification; pass heads="):
        convert.params_from_hf({**cls_hf, **qa_hf}, CONFIG)
