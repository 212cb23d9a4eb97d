"""BERT conversion: parity with Hugging Face BertForPreTraining / BertModel outputs (padding and
segments in use, scanned and not), exact round trips through the HF and google-research/bert TF
layouts, HF strict loading of our export, and the errors a wrong checkpoint gets."""

import dataclasses
import json
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.numerics import assert_close
from zoo.convert import bert as convert
from zoo.models.bert import BertForPreTraining, BertModel

B, T = 2, 7
# intermediate_size is deliberately not 4 * hidden_size.
HF_SIZES = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=48, max_position_embeddings=16, type_vocab_size=2)
IDS = np.array([[2, 7, 9, 3, 11, 4, 13], [2, 5, 8, 3, 6, 0, 0]], np.int64)
TYPES = np.array([[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 0, 0]], np.int64)
MASK = np.array([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]], np.int64)  # row 1: 2 pads
POSITIONS = np.array([[5, 1, 3], [4, 2, 0]], np.int64)  # real tokens only
REAL = MASK.astype(bool)


def _hf_model(seed=0, **overrides):
    """A tiny random BertForPreTraining in eval mode with every parameter N(0, 0.2^2).

    HF initialises biases to 0 and LayerNorm gains to 1; randomising them too makes a wrongly
    mapped bias or norm change the outputs.
    """
    config = transformers.BertConfig(**{**HF_SIZES, **overrides})
    torch.manual_seed(seed)
    model = transformers.BertForPreTraining(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # the tied decoder weight/bias are the same parameters
            p.normal_(0.0, 0.2)
    return model


def _t(x):
    return torch.from_numpy(np.asarray(x))


def _hf_pretraining(model):
    with torch.no_grad():
        out = model(_t(IDS), attention_mask=_t(MASK), token_type_ids=_t(TYPES))
    mlm = out.prediction_logits.numpy()[np.arange(B)[:, None], POSITIONS]  # (B, P, V)
    return mlm, out.seq_relationship_logits.numpy()


@pytest.fixture(scope="module")
def hf():
    return _hf_model()


@pytest.fixture(scope="module")
def state_dict(hf):
    return {k: v.numpy() for k, v in hf.state_dict().items()}


def _ours(config, params):
    return jax.jit(lambda p: BertForPreTraining(config).apply(
        {"params": p}, IDS.astype(np.int32), TYPES.astype(np.int32), MASK.astype(np.int32),
        POSITIONS.astype(np.int32)))(params)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_converted_bert_matches_hf_pretraining_logits(hf, scan_layers):
    config = convert.config_from_hf(hf.config.to_dict(), scan_layers=scan_layers)
    params = convert.params_from_hf(hf.state_dict(), config)  # torch tensors in
    ref_mlm, ref_nsp = _hf_pretraining(hf)
    assert np.abs(ref_mlm).max() > 0.5 and np.abs(ref_nsp).max() > 0.1  # worth comparing
    mlm, nsp = _ours(config, params)
    assert_close(mlm, ref_mlm, 1e-5, err_msg="MLM logits")
    assert_close(nsp, ref_nsp, 1e-5, err_msg="NSP logits")


def test_bare_bertmodel_state_dict_loads_into_bertmodel(hf, state_dict):
    """HF BertModel's bare names give BertModel params: same sequence output (real tokens) and
    pooled output as HF's BertModel."""
    config = convert.config_from_hf(hf.config.to_dict())
    bare = hf.bert.state_dict()
    assert not any(k.startswith(("bert.", "cls.")) for k in bare)
    params = convert.params_from_hf(bare, config)
    assert set(params) == {"embeddings", "encoder", "pooler"}
    seq, pooled = jax.jit(lambda p: BertModel(config).apply(
        {"params": p}, IDS.astype(np.int32), TYPES.astype(np.int32), MASK.astype(np.int32)))(params)
    with torch.no_grad():
        ref = hf.bert(_t(IDS), attention_mask=_t(MASK), token_type_ids=_t(TYPES))
    assert_close(np.asarray(seq)[REAL], ref.last_hidden_state.numpy()[REAL], 1e-5,
                 err_msg="sequence output")
    assert_close(pooled, ref.pooler_output.numpy(), 1e-5, err_msg="pooled output")
    # 'bert.'-prefixed names without heads, and heads=False on the full pretraining dict, load
    # the same encoder.
    prefixed = {"bert." + k: v for k, v in bare.items()}
    jax.tree.map(np.testing.assert_array_equal, convert.params_from_hf(prefixed, config), params)
    jax.tree.map(np.testing.assert_array_equal,
                 convert.params_from_hf(state_dict, config, heads=False), params)
    # ... and export back to BertModel's names (or prefixed ones) exactly.
    back = convert.params_to_hf(params, config)
    assert back.keys() == bare.keys()
    for k, v in bare.items():
        np.testing.assert_array_equal(back[k], v.numpy(), err_msg=k)
    assert convert.params_to_hf(params, config, prefix="bert.").keys() == prefixed.keys()


def test_params_have_the_models_own_structure_and_shapes(hf):
    """Conversion yields exactly the tree BertForPreTraining.init creates, for both layouts."""
    for scan_layers in (False, True):
        config = convert.config_from_hf(hf.config.to_dict(), scan_layers=scan_layers)
        params = convert.params_from_hf(hf.state_dict(), config)
        ids = jnp.zeros((1, T), jnp.int32)
        init = jax.eval_shape(BertForPreTraining(config).init, jax.random.key(0), ids, ids, ids,
                              jnp.zeros((1, 2), jnp.int32))
        want = jax.tree.map(lambda x: (x.shape, x.dtype), nn.unbox(init["params"]))
        got = jax.tree.map(lambda x: (x.shape, x.dtype), params)
        assert got == want


def test_linear_transpose_and_head_split_layout(state_dict, hf):
    """HF nn.Linear (out, in): our q kernel (D, H, K)[:, h] is rows h*K.. of HF's weight,
    transposed; the attention output (H, K, D)[h] is HF's columns h*K.., transposed."""
    config = convert.config_from_hf(hf.config.to_dict())
    params = convert.params_from_hf(state_dict, config)
    attn = params["bert"]["encoder"]["layer_1"]["self_attention"]
    d, heads = HF_SIZES["hidden_size"], HF_SIZES["num_attention_heads"]
    k = d // heads
    prefix = "bert.encoder.layer.1.attention."
    for name in ("query", "key", "value"):
        w, b = state_dict[f"{prefix}self.{name}.weight"], state_dict[f"{prefix}self.{name}.bias"]
        for h in range(heads):
            rows = slice(h * k, (h + 1) * k)
            np.testing.assert_array_equal(attn[name]["kernel"][:, h, :], w[rows].T)
            np.testing.assert_array_equal(attn[name]["bias"][h], b[rows])
    out = state_dict[prefix + "output.dense.weight"]
    for h in range(heads):
        np.testing.assert_array_equal(attn["out"]["kernel"][h], out[:, h * k:(h + 1) * k].T)
    np.testing.assert_array_equal(params["seq_relationship"]["kernel"],
                                  state_dict["cls.seq_relationship.weight"].T)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_hf_round_trip_is_exact(state_dict, hf, scan_layers):
    config = convert.config_from_hf(hf.config.to_dict(), scan_layers=scan_layers)
    back = convert.params_to_hf(convert.params_from_hf(state_dict, config), config)
    assert back.keys() == state_dict.keys()
    for name, x in state_dict.items():
        assert back[name].dtype == x.dtype, name
        np.testing.assert_array_equal(back[name], x, err_msg=name)


def test_hf_loads_exported_params_strictly(hf):
    """Our params -> HF names -> a fresh HF model (strict load) -> the source model's logits."""
    config = convert.config_from_hf(hf.config.to_dict(), scan_layers=True)
    exported = convert.params_to_hf(convert.params_from_hf(hf.state_dict(), config), config)
    fresh = transformers.BertForPreTraining(
        transformers.BertConfig(**convert.config_to_hf(config))).eval()
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in exported.items()}, strict=True)
    # Still tied after loading.
    assert fresh.cls.predictions.decoder.weight is fresh.bert.embeddings.word_embeddings.weight
    for a, b in zip(_hf_pretraining(fresh), _hf_pretraining(hf)):
        np.testing.assert_array_equal(a, b)


def test_from_pretrained_reads_an_exported_directory(hf, tmp_path, monkeypatch):
    """config_to_hf's config.json + params_to_hf's safetensors form a loadable HF checkpoint."""
    from safetensors.numpy import save_file
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = convert.config_from_hf(hf.config.to_dict())
    exported = convert.params_to_hf(convert.params_from_hf(hf.state_dict(), config), config)
    for tied in ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"):
        del exported[tied]  # as HF saves it: the tied copies are re-tied on load
    save_file(exported, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps(convert.config_to_hf(config)))
    loaded = transformers.BertForPreTraining.from_pretrained(str(tmp_path)).eval()
    for a, b in zip(_hf_pretraining(loaded), _hf_pretraining(hf)):
        np.testing.assert_array_equal(a, b)


def _tf_from_hf(state_dict):
    """google-research/bert variable names and layouts, written from HF's by the mapping HF's
    own TF loader inverts: '.' -> '/', layer.N -> layer_N, LayerNorm weight/bias -> gamma/beta,
    Linear weight (out, in) -> kernel (in, out), embedding tables lose '.weight', and the
    heads' cls.predictions.bias -> output_bias, seq_relationship weight/bias ->
    output_weights (kept (2, H)) / output_bias. The tied decoder copies have no TF variable."""
    tf = {}
    for name, x in state_dict.items():
        if name.startswith("cls.predictions.decoder."):
            continue
        if name == "cls.predictions.bias":
            tf["cls/predictions/output_bias"] = x
        elif name == "cls.seq_relationship.weight":
            tf["cls/seq_relationship/output_weights"] = x
        elif name == "cls.seq_relationship.bias":
            tf["cls/seq_relationship/output_bias"] = x
        elif name.endswith("_embeddings.weight"):
            tf[name[: -len(".weight")].replace(".", "/")] = x
        elif ".LayerNorm." in name:
            tf[name.replace(".weight", ".gamma").replace(".bias", ".beta").replace(".", "/")] = x
        elif name.endswith(".weight"):
            tf[name.replace(".weight", ".kernel").replace(".", "/")] = x.T
        else:
            tf[name.replace(".", "/")] = x
    return {re.sub(r"layer/(\d+)", r"layer_\1", k): v for k, v in tf.items()}


@pytest.mark.parametrize("scan_layers", [False, True])
def test_tf_variable_names_round_trip(state_dict, hf, scan_layers):
    config = convert.config_from_hf(hf.config.to_dict(), scan_layers=scan_layers)
    tf = _tf_from_hf(state_dict)
    assert "bert/encoder/layer_1/attention/self/query/kernel" in tf  # the mapping is TF's
    assert tf["bert/encoder/layer_0/intermediate/dense/kernel"].shape == (32, 48)
    # Optimizer slots and the step counter in a training checkpoint are skipped.
    with_slots = dict(tf, global_step=np.int64(7), **{
        "bert/pooler/dense/kernel/adam_m": np.zeros((32, 32), np.float32),
        "bert/pooler/dense/kernel/adam_v": np.zeros((32, 32), np.float32)})
    params = convert.params_from_tf_variables(with_slots, config)
    jax.tree.map(np.testing.assert_array_equal, params,
                 convert.params_from_hf(state_dict, config))
    back = convert.params_to_tf_variables(params, config)
    assert back.keys() == tf.keys()
    for name, x in tf.items():
        np.testing.assert_array_equal(back[name], x, err_msg=name)
    # Without the cls/ heads (or heads=False): BertModel params.
    encoder = convert.params_from_tf_variables(tf, config, heads=False)
    jax.tree.map(np.testing.assert_array_equal, encoder, params["bert"])


def test_config_round_trip_and_google_bert_config_json(hf):
    config = convert.config_from_hf(hf.config, scan_layers=True, dropout_rate=0.0)
    assert (config.num_layers, config.num_heads, config.hidden_size, config.intermediate_size,
            config.vocab_size, config.max_position_embeddings, config.type_vocab_size,
            config.layer_norm_epsilon) == (2, 4, 32, 48, 50, 16, 2, 1e-12)
    assert config.scan_layers and config.dropout_rate == 0.0
    # scan_layers / dropout are our choices, not the checkpoint's: only the latter survives.
    assert convert.config_from_hf(convert.config_to_hf(config)) == dataclasses.replace(
        config, scan_layers=False)
    hf_config = transformers.BertConfig(**convert.config_to_hf(config))
    assert (hf_config.num_hidden_layers, hf_config.num_attention_heads, hf_config.hidden_size,
            hf_config.intermediate_size, hf_config.vocab_size, hf_config.hidden_act) == (
        2, 4, 32, 48, 50, "gelu")
    # google-research/bert's bert_config.json (uncased_L-2_H-128_A-2): no model_type.
    google = {"attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
              "hidden_dropout_prob": 0.1, "hidden_size": 128, "initializer_range": 0.02,
              "intermediate_size": 512, "max_position_embeddings": 512,
              "num_attention_heads": 2, "num_hidden_layers": 2, "type_vocab_size": 2,
              "vocab_size": 30522}
    small = convert.config_from_hf(google)
    assert (small.num_layers, small.hidden_size, small.num_heads, small.intermediate_size,
            small.vocab_size) == (2, 128, 2, 512, 30522)


def test_old_hf_names_and_buffers_are_accepted(state_dict, hf):
    """pytorch-pretrained-bert's LayerNorm gamma/beta and saved position_ids buffers."""
    config = convert.config_from_hf(hf.config.to_dict())
    old = {re.sub(r"LayerNorm\.weight$", "LayerNorm.gamma",
                  re.sub(r"LayerNorm\.bias$", "LayerNorm.beta", k)): v
           for k, v in state_dict.items()}
    assert "bert.embeddings.LayerNorm.gamma" in old
    old["bert.embeddings.position_ids"] = np.arange(16)[None]
    jax.tree.map(np.testing.assert_array_equal, convert.params_from_hf(old, config),
                 convert.params_from_hf(state_dict, config))


# ---- errors ------------------------------------------------------------------------------------


def test_gpt2_checkpoint_is_named_as_such(hf):
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=16, bos_token_id=0,
        eos_token_id=0))
    config = convert.config_from_hf(hf.config.to_dict())
    with pytest.raises(ValueError, match=r"not a BERT checkpoint: it looks like GPT-2 .*"
                                         r"zoo\.convert\.gpt2"):
        convert.params_from_hf(gpt2.state_dict(), config)
    with pytest.raises(ValueError, match=r"not a BERT checkpoint.*keys: a, b"):
        convert.params_from_hf({"a": np.zeros(1), "b": np.zeros(1)}, config)
    with pytest.raises(ValueError, match=r"not a BERT checkpoint.*bert/embeddings/word_emb"):
        convert.params_from_tf_variables({"model/x": np.zeros(1)}, config)
    with pytest.raises(ValueError, match=r"model_type='gpt2', not a BERT config"):
        convert.config_from_hf(gpt2.config.to_dict())


def test_missing_and_unexpected_keys_are_listed(state_dict, hf):
    config = convert.config_from_hf(hf.config.to_dict())
    partial = dict(state_dict)
    del partial["bert.encoder.layer.1.output.dense.bias"], partial["cls.seq_relationship.bias"]
    with pytest.raises(ValueError, match=r"(?m)missing keys: bert\.encoder\.layer\.1\.output\."
                                         r"dense\.bias, cls\.seq_relationship\.bias$"):
        convert.params_from_hf(partial, config)
    # A 3-layer checkpoint into the 2-layer config: layer 2 is unexpected.
    deeper = _hf_model(num_hidden_layers=3).state_dict()
    with pytest.raises(ValueError, match=r"unexpected keys: ") as error:
        convert.params_from_hf(deeper, config)
    listed = set(re.search(r"unexpected keys: (.*)", str(error.value)).group(1).split(", "))
    assert listed == {k for k in deeper if k.startswith("bert.encoder.layer.2.")}
    assert "config_from_hf" in str(error.value)
    # Pretraining params asked of a BertModel-only dict: the heads are listed as missing.
    with pytest.raises(ValueError, match=r"missing keys: cls\.predictions\.bias, "):
        convert.params_from_hf(hf.bert.state_dict(), config, heads=True)
    tf = _tf_from_hf(state_dict)
    del tf["bert/pooler/dense/kernel"]
    with pytest.raises(ValueError, match=r"(?m)missing keys: bert/pooler/dense/kernel$"):
        convert.params_from_tf_variables(tf, config)


def test_wrong_shape_names_key_and_both_shapes(state_dict, hf):
    config = convert.config_from_hf(hf.config.to_dict())
    bad = dict(state_dict, **{"bert.encoder.layer.0.intermediate.dense.weight":
                              np.zeros((64, 32), np.float32)})
    with pytest.raises(ValueError, match=r"'bert\.encoder\.layer\.0\.intermediate\.dense\.weight'"
                                         r" has shape \(64, 32\) but the config needs \(48, 32\)"):
        convert.params_from_hf(bad, config)
    tf = dict(_tf_from_hf(state_dict), **{"cls/seq_relationship/output_weights":
                                          np.zeros((32, 2), np.float32)})
    with pytest.raises(ValueError, match=r"'cls/seq_relationship/output_weights' has shape "
                                         r"\(32, 2\) but the config needs \(2, 32\)"):
        convert.params_from_tf_variables(tf, config)
    params = convert.params_from_hf(state_dict, config)
    params["bert"]["encoder"]["layer_0"]["mlp"]["wi"]["kernel"] = np.zeros((32, 100), np.float32)
    with pytest.raises(ValueError, match=r"'bert/encoder/layer_0/mlp/wi/kernel' has shape "
                                         r"\(32, 100\) but the config needs \(32, 48\)"):
        convert.params_to_hf(params, config)


def test_other_checkpoint_errors(state_dict, hf):
    config = convert.config_from_hf(hf.config.to_dict())
    untied = dict(state_dict, **{"cls.predictions.decoder.weight":
                                 state_dict["cls.predictions.decoder.weight"] + 1.0})
    with pytest.raises(ValueError, match="untied MLM decoder"):
        convert.params_from_hf(untied, config)
    bias = dict(state_dict, **{"cls.predictions.decoder.bias": np.zeros(50, np.float32)})
    with pytest.raises(ValueError, match=r"'cls\.predictions\.decoder\.bias' differs"):
        convert.params_from_hf(bias, config)
    mixed = {k: v for k, v in hf.bert.state_dict().items()}
    mixed["bert.pooler.dense.bias"] = mixed.pop("pooler.dense.bias")
    with pytest.raises(ValueError, match="mixes 'bert.'-prefixed names"):
        convert.params_from_hf(mixed, config)
    scanned = convert.config_from_hf(hf.config.to_dict(), scan_layers=True)
    with pytest.raises(ValueError, match=r"(?s)is config\.scan_layers right.*missing params: "
                                         r"bert/encoder/layers/"):
        convert.params_to_hf(convert.params_from_hf(state_dict, config), scanned)


def test_unsupported_hf_options_are_refused(hf):
    base = hf.config.to_dict()
    for field, value, why in [
        ("hidden_act", "gelu_new", "exact"),
        ("position_embedding_type", "relative_key", "absolute positions"),
        ("is_decoder", True, "bidirectional"),
        ("tie_word_embeddings", False, "tied"),
    ]:
        with pytest.raises(ValueError, match=f"{field}={value!r} is not supported.*{why}"):
            convert.config_from_hf({**base, field: value})
    with pytest.raises(ValueError, match=r"cannot override \['num_layers'\]"):
        convert.config_from_hf(base, num_layers=3)
    with pytest.raises(ValueError, match=r"lacks \['hidden_size'\]"):
        convert.config_from_hf({k: v for k, v in base.items() if k != "hidden_size"})
