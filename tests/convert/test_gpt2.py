"""GPT-2 conversion: parity with Hugging Face logits (full, scanned, KV-cache), exact round
trips through HF layouts and HF loading, and the errors a wrong checkpoint gets."""

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
from zoo.convert import gpt2
from zoo.models.gpt import GPT

B, T = 2, 7
HF_SIZES = dict(n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=16)
# HF's default bos/eos (50256) lie outside a 50-token vocabulary.
HF_TOKENS = dict(bos_token_id=0, eos_token_id=0)


def _hf_model(seed=0, **overrides):
    """A tiny random GPT2LMHeadModel in eval mode with every parameter N(0, 0.2^2).

    HF initialises biases to 0 and LayerNorm gains to 1; randomising them too makes a wrongly
    mapped bias or norm change the logits.
    """
    config = transformers.GPT2Config(**{**HF_SIZES, **HF_TOKENS, **overrides})
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():  # wte and the tied lm_head are one parameter
            p.normal_(0.0, 0.2)
    return model


def _hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.from_numpy(tokens)).logits.numpy()


@pytest.fixture(scope="module")
def hf():
    return _hf_model()


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(0).integers(0, HF_SIZES["vocab_size"], (B, T))


@pytest.fixture(scope="module")
def state_dict(hf):
    return {k: v.numpy() for k, v in hf.state_dict().items()}


def _assert_logits_close(ours, ref):
    assert_close(np.asarray(ours), ref, 1e-5, err_msg="logits")


@pytest.mark.parametrize("scan_layers", [False, True])
def test_converted_gpt_matches_hf_logits(hf, tokens, scan_layers):
    config = gpt2.config_from_hf(hf.config.to_dict(), scan_layers=scan_layers)
    params = gpt2.params_from_hf(hf.state_dict(), config)  # torch tensors in
    ref = _hf_logits(hf, tokens)
    assert np.abs(ref).max() > 0.5  # the random weights give logits worth comparing
    logits = jax.jit(lambda p, t: GPT(config).apply({"params": p}, t))(params, tokens)
    _assert_logits_close(logits, ref)


def test_params_have_the_models_own_structure_and_shapes(hf):
    """Conversion yields exactly the tree GPT.init would create, for both layouts."""
    for scan_layers in (False, True):
        config = gpt2.config_from_hf(hf.config.to_dict(), scan_layers=scan_layers)
        params = gpt2.params_from_hf(hf.state_dict(), config)
        init = jax.eval_shape(GPT(config).init, jax.random.key(0), jnp.zeros((1, T), jnp.int32))
        want = jax.tree.map(lambda x: (x.shape, x.dtype), nn.unbox(init["params"]))
        got = jax.tree.map(lambda x: (x.shape, x.dtype), params)
        assert got == want


def test_fused_qkv_layout(state_dict, hf):
    """c_attn columns [q | k | v], head h owning columns h*K .. h*K + K - 1 within each block."""
    config = gpt2.config_from_hf(hf.config.to_dict())
    attn = gpt2.params_from_hf(state_dict, config)["h"]["layer_1"]["self_attention"]
    w = state_dict["transformer.h.1.attn.c_attn.weight"]  # (D, 3D)
    b = state_dict["transformer.h.1.attn.c_attn.bias"]  # (3D,)
    d, heads = HF_SIZES["n_embd"], HF_SIZES["n_head"]
    k = d // heads
    for block, name in enumerate(("query", "key", "value")):
        for h in range(heads):
            cols = slice(block * d + h * k, block * d + (h + 1) * k)
            np.testing.assert_array_equal(attn[name]["kernel"][:, h, :], w[:, cols])
            np.testing.assert_array_equal(attn[name]["bias"][h], b[cols])
    proj = state_dict["transformer.h.1.attn.c_proj.weight"]
    for h in range(heads):
        np.testing.assert_array_equal(attn["out"]["kernel"][h], proj[h * k:(h + 1) * k])


@pytest.mark.parametrize("scan_layers", [False, True])
def test_round_trip_is_exact(state_dict, hf, scan_layers):
    config = gpt2.config_from_hf(hf.config.to_dict(), scan_layers=scan_layers)
    back = gpt2.params_to_hf(gpt2.params_from_hf(state_dict, config), config)
    assert back.keys() == state_dict.keys()
    for name, x in state_dict.items():
        assert back[name].dtype == x.dtype, name
        np.testing.assert_array_equal(back[name], x, err_msg=name)


def test_bare_gpt2model_names_round_trip(state_dict, hf):
    """GPT2Model's bare names (plus old checkpoints' attention buffers) load the same params."""
    config = gpt2.config_from_hf(hf.config.to_dict())
    gpt2model_names = transformers.GPT2Model(hf.config).state_dict().keys()
    bare = {k[len("transformer."):]: v for k, v in state_dict.items() if k != "lm_head.weight"}
    assert bare.keys() == gpt2model_names
    bare["h.0.attn.bias"] = np.tril(np.ones((1, 1, 16, 16), bool))  # pre-2022 checkpoints
    bare["h.0.attn.masked_bias"] = np.float32(-1e4)
    want = gpt2.params_from_hf(state_dict, config)
    got = gpt2.params_from_hf(bare, config)
    jax.tree.map(np.testing.assert_array_equal, got, want)
    back = gpt2.params_to_hf(got, config, lm_head=False)
    assert back.keys() == gpt2model_names


def test_hf_loads_exported_params_strictly(hf, tokens):
    """Our params -> HF names -> a fresh HF model (strict load) -> the source model's logits."""
    config = gpt2.config_from_hf(hf.config.to_dict(), scan_layers=True)
    exported = gpt2.params_to_hf(gpt2.params_from_hf(hf.state_dict(), config), config)
    fresh = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(**gpt2.config_to_hf(config, **HF_TOKENS))
    ).eval()
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in exported.items()}, strict=True)
    assert fresh.lm_head.weight is fresh.transformer.wte.weight  # still tied after loading
    np.testing.assert_array_equal(_hf_logits(fresh, tokens), _hf_logits(hf, tokens))


def test_from_pretrained_reads_an_exported_directory(hf, tokens, tmp_path, monkeypatch):
    """config_to_hf's config.json + params_to_hf's safetensors form a loadable HF checkpoint."""
    from safetensors.numpy import save_file
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = gpt2.config_from_hf(hf.config.to_dict())
    exported = gpt2.params_to_hf(gpt2.params_from_hf(hf.state_dict(), config), config)
    del exported["lm_head.weight"]  # as HF saves it: the tied head is re-tied on load
    save_file(exported, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps(gpt2.config_to_hf(config, **HF_TOKENS)))
    loaded = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path)).eval()
    np.testing.assert_array_equal(_hf_logits(loaded, tokens), _hf_logits(hf, tokens))


def test_kv_cache_decoding_matches_hf(hf, tokens):
    """Our decode-mode GPT fed one token at a time gives HF's full-forward logits per position."""
    config = gpt2.config_from_hf(hf.config.to_dict())
    params = gpt2.params_from_hf(hf.state_dict(), config)
    model = GPT(config, decode=True)
    # init with a full-length input sizes the KV caches (T positions).
    cache = jax.jit(model.init)(jax.random.key(0), jnp.zeros((B, T), jnp.int32))["cache"]

    @jax.jit
    def step(cache, token):
        logits, mutated = model.apply(
            {"params": params, "cache": cache}, token, mutable=["cache"]
        )
        return mutated["cache"], logits[:, 0]

    steps = []
    for t in range(T):
        cache, logits = step(cache, tokens[:, t:t + 1])
        steps.append(logits)
    _assert_logits_close(np.stack(steps, axis=1), _hf_logits(hf, tokens))


def test_config_round_trip_and_hf_fields(hf):
    config = gpt2.config_from_hf(hf.config.to_dict(), scan_layers=True, dropout_rate=0.0)
    assert (config.num_layers, config.num_heads, config.embed_dim, config.mlp_dim,
            config.vocab_size, config.max_len, config.layer_norm_epsilon) == (
        2, 4, 32, 128, 50, 16, 1e-5)
    assert config.scan_layers and config.dropout_rate == 0.0
    # scan_layers is our choice, not the checkpoint's: it does not survive the trip.
    assert gpt2.config_from_hf(gpt2.config_to_hf(config)) == dataclasses.replace(
        config, scan_layers=False)
    # HF reads our dict back to the same architecture, n_inner included.
    hf_config = transformers.GPT2Config(**gpt2.config_to_hf(config, **HF_TOKENS))
    assert (hf_config.n_layer, hf_config.n_head, hf_config.n_embd, hf_config.n_inner,
            hf_config.n_positions, hf_config.vocab_size) == (2, 4, 32, 128, 16, 50)


# ---- errors ------------------------------------------------------------------------------------


def test_bert_checkpoint_is_named_as_such(hf):
    bert = transformers.BertModel(transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16,
    ))
    config = gpt2.config_from_hf(hf.config.to_dict())
    with pytest.raises(ValueError, match=r"not a GPT-2 checkpoint: it looks like BERT"):
        gpt2.params_from_hf(bert.state_dict(), config)
    with pytest.raises(ValueError, match=r"not a GPT-2 checkpoint.*keys: a, b"):
        gpt2.params_from_hf({"a": np.zeros(1), "b": np.zeros(1)}, config)
    with pytest.raises(ValueError, match=r"model_type='bert', not a GPT-2 config"):
        gpt2.config_from_hf(bert.config.to_dict())


def test_missing_and_unexpected_keys_are_listed(state_dict, hf):
    config = gpt2.config_from_hf(hf.config.to_dict())
    partial = dict(state_dict)
    del partial["transformer.h.1.mlp.c_fc.bias"], partial["transformer.ln_f.weight"]
    with pytest.raises(ValueError, match=r"(?m)missing keys: transformer\.h\.1\.mlp\.c_fc\.bias, "
                                         r"transformer\.ln_f\.weight$"):
        gpt2.params_from_hf(partial, config)
    # A 3-layer checkpoint into the 2-layer config: layer 2 is unexpected.
    deeper = _hf_model(n_layer=3).state_dict()
    with pytest.raises(ValueError, match=r"unexpected keys: ") as error:
        gpt2.params_from_hf(deeper, config)
    listed = set(re.search(r"unexpected keys: (.*)", str(error.value)).group(1).split(", "))
    assert listed == {k for k in deeper if k.startswith("transformer.h.2.")}
    assert "config_from_hf" in str(error.value)


def test_wrong_shape_names_key_and_both_shapes(state_dict, hf):
    config = gpt2.config_from_hf(hf.config.to_dict())
    bad = dict(state_dict, **{"transformer.h.0.attn.c_attn.weight": np.zeros((32, 64), np.float32)})
    with pytest.raises(ValueError, match=r"'transformer\.h\.0\.attn\.c_attn\.weight' has shape "
                                         r"\(32, 64\) but the config needs \(32, 96\)"):
        gpt2.params_from_hf(bad, config)
    params = gpt2.params_from_hf(state_dict, config)
    params["h"]["layer_0"]["mlp"]["wi"]["kernel"] = np.zeros((32, 100), np.float32)
    with pytest.raises(ValueError, match=r"'h/layer_0/mlp/wi/kernel' has shape \(32, 100\) but "
                                         r"the config needs \(32, 128\)"):
        gpt2.params_to_hf(params, config)


def test_other_checkpoint_errors(state_dict, hf):
    config = gpt2.config_from_hf(hf.config.to_dict())
    untied = dict(state_dict, **{"lm_head.weight": state_dict["lm_head.weight"] + 1.0})
    with pytest.raises(ValueError, match="untied output layer"):
        gpt2.params_from_hf(untied, config)
    mixed = dict(state_dict)
    mixed["ln_f.bias"] = mixed.pop("transformer.ln_f.bias")
    with pytest.raises(ValueError, match="mixes 'transformer.'-prefixed names"):
        gpt2.params_from_hf(mixed, config)
    scanned = gpt2.config_from_hf(hf.config.to_dict(), scan_layers=True)
    with pytest.raises(ValueError, match=r"(?s)is config\.scan_layers right.*missing params: "
                                         r"h/layers/"):
        gpt2.params_to_hf(gpt2.params_from_hf(state_dict, config), scanned)


def test_unsupported_hf_options_are_refused(hf):
    base = hf.config.to_dict()
    for field, value, why in [
        ("activation_function", "gelu", "tanh approximation"),
        ("scale_attn_by_inverse_layer_idx", True, "layer depth"),
        ("tie_word_embeddings", False, "ties the output layer"),
    ]:
        with pytest.raises(ValueError, match=f"{field}={value!r} is not supported.*{why}"):
            gpt2.config_from_hf({**base, field: value})
    with pytest.raises(ValueError, match=r"resid_pdrop=0\.1 != embd_pdrop=0\.0.*dropout_rate"):
        gpt2.config_from_hf({**base, "embd_pdrop": 0.0})
    assert gpt2.config_from_hf({**base, "embd_pdrop": 0.0}, dropout_rate=0.0).dropout_rate == 0.0
    with pytest.raises(ValueError, match=r"cannot override \['num_layers'\]"):
        gpt2.config_from_hf(base, num_layers=3)
