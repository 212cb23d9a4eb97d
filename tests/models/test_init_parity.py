"""A fresh model starts where its reference implementation starts: every tensor of zoo's
initial params, renamed to the reference checkpoint's names, has the mean and standard deviation
of the same tensor in a freshly constructed Hugging Face PyTorch model.

Parity of imported weights cannot see an initialisation that differs: BERT's kernels were drawn
with zoo.nn's fan-in scaled lecun_normal (std 0.125 at width 64, 6x BERT's 0.02), which passed
every conversion test and cost tiny BERT trained on Brown its MLM loss, MLM accuracy and NSP
accuracy against BertForPreTraining fed the same batches.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zoo.convert import bert as bert_convert
from zoo.convert import gpt2 as gpt2_convert
from zoo.models import bert, gpt

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# Wide enough that a standard deviation is estimated to a few percent from one draw.
BERT = bert.BertConfig(vocab_size=512, hidden_size=64, num_layers=2, num_heads=2,
                       intermediate_size=256, max_position_embeddings=64)
GPT = gpt.GPTConfig(vocab_size=512, max_len=64, num_layers=4, num_heads=4, embed_dim=64,
                    mlp_dim=256)
T, P = 8, 2


def _moments(x) -> tuple[float, float]:
    x = np.asarray(x, np.float64)
    return float(x.mean()), float(x.std())


def _assert_same_distribution(ours: dict, theirs: dict, what: str) -> None:
    """Per tensor: equal constants (zero biases, unit gains) exactly, random draws' standard
    deviations within 5 standard errors (sqrt(1 / 2n) of the std, relative) and means within 5
    standard errors of a zero mean."""
    assert sorted(ours) == sorted(theirs), f"{what}: the two models name different tensors"
    wrong = []
    for name in sorted(ours):
        (m1, s1), (m2, s2) = _moments(ours[name]), _moments(theirs[name])
        n = np.asarray(ours[name]).size
        if s2 == 0.0:
            if s1 != 0.0 or m1 != m2:
                wrong.append(f"{name}: zoo mean {m1:.4f} std {s1:.4f}, reference constant {m2}")
            continue
        rel = 5.0 / np.sqrt(2.0 * n)
        if abs(s1 - s2) > rel * s2 or abs(m1 - m2) > 5.0 * s2 / np.sqrt(n):
            wrong.append(f"{name}: zoo mean {m1:.4f} std {s1:.4f}, reference mean {m2:.4f} "
                         f"std {s2:.4f} ({n} values)")
    assert not wrong, f"{what}: initial tensors differ from the reference's:\n" + "\n".join(wrong)


def _hf_state(model) -> dict:
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("heads", ["pretraining", "question_answering", "sequence_classification"])
def test_bert_initial_params_match_hugging_face(heads):
    ids = jnp.zeros((1, T), jnp.int32)
    if heads == "pretraining":
        model = bert.BertForPreTraining(BERT)
        extra = (jnp.zeros((1, P), jnp.int32),)
        hf_cls = transformers.BertForPreTraining
    elif heads == "question_answering":
        model, extra = bert.BertForQuestionAnswering(BERT), ()
        hf_cls = transformers.BertForQuestionAnswering
    else:
        model, extra = bert.BertForSequenceClassification(BERT, num_labels=3), ()
        hf_cls = transformers.BertForSequenceClassification
    params = model.init(jax.random.key(0), ids, ids, jnp.ones_like(ids), *extra)["params"]
    ours = bert_convert.params_to_hf(params, BERT, heads=heads)
    num_labels = 3 if heads == "sequence_classification" else None
    torch.manual_seed(0)
    reference = hf_cls(transformers.BertConfig(**bert_convert.config_to_hf(
        BERT, num_labels=num_labels)))
    theirs = {k: v for k, v in _hf_state(reference).items() if k in ours}
    # HF zeroes the [PAD] row (pad_token_id 0) of the word table; compare the other rows.
    for state in (ours, theirs):
        for name in [k for k in state if k.endswith("word_embeddings.weight")]:
            state[name] = state[name][1:]
    _assert_same_distribution(ours, theirs, f"BERT ({heads})")


def test_initializer_range_round_trips_through_hugging_face_config():
    config = bert.BertConfig(vocab_size=32, hidden_size=16, num_layers=1, num_heads=2,
                             intermediate_size=32, initializer_range=0.05)
    hf = bert_convert.config_to_hf(config)
    assert hf["initializer_range"] == 0.05
    assert bert_convert.config_from_hf(hf).initializer_range == 0.05


def test_gpt2_initial_params_match_hugging_face():
    """GPT-2 also scales the two projections per layer that add into the residual stream
    (attn.c_proj, mlp.c_proj) by 1 / sqrt(2 * layers): at 4 layers, std 0.0071 against 0.02."""
    model = gpt.GPT(GPT)
    params = model.init(jax.random.key(0), jnp.zeros((1, T), jnp.int32))["params"]
    ours = gpt2_convert.params_to_hf(params, GPT)
    torch.manual_seed(0)
    reference = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        **gpt2_convert.config_to_hf(GPT, bos_token_id=0, eos_token_id=0)))
    theirs = {k: v for k, v in _hf_state(reference).items() if k in ours}
    _assert_same_distribution(ours, theirs, "GPT-2")
