"""zoo.attention_maps: the sow_weights passthrough of BERT and GPT (same outputs, one [B, H, T, T]
map per layer, scanned or not); BERT maps equal a float64 numpy encoder's attention in every
layer, labelled with the tokenizer's pieces; GPT maps are causal; translation maps have the
documented shapes, labels and causality, and follow the greedy translation when no target is
given; draw writes a layers x heads PNG; and the command on a trained GPT workdir and on a
Hugging Face BERT directory, with its errors."""

import dataclasses
import math
import os
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest
from PIL import Image

from zoo import attention_maps as am
from zoo.data import synthetic_translation, tokenizers
from zoo.data.wordpiece import WordPieceTokenizer
from zoo.models import bert, gpt, transformer
from zoo.train import loop
from zoo.train.checkpoint import Checkpointer

# One device: nothing here is about sharding (tests/train/test_loop.py covers the layouts),
# and 8 fake devices only add compile and collective time.
ONE_DEVICE = jax.devices()[:1]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "animal", "didn", "'", "t",
         "cross", "street", "because", "it", "was", "too", "tire", "##d", "tired", "cat", "sat"]
BERT_CONFIG = bert.BertConfig(vocab_size=len(VOCAB), hidden_size=8, num_layers=3, num_heads=2,
                              intermediate_size=16, max_position_embeddings=24)
GPT_CONFIG = gpt.GPTConfig(vocab_size=len(VOCAB), max_len=16, num_layers=2, num_heads=2,
                           embed_dim=8, mlp_dim=16)
IDS = np.array([[2, 5, 6, 13, 3, 14, 3], [2, 19, 20, 3, 0, 0, 0]], np.int32)  # row 1: 3 pads
TYPES = np.array([[0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0, 0]], np.int32)
MASK = (IDS != 0).astype(np.int32)


def _perturbed(params, seed=0):
    """params + N(0, 0.3^2): init's zero biases and unit LayerNorm gains would hide a wrongly used
    bias or gain, and larger weights give peaked, distinguishable attention rows."""
    leaves, treedef = jax.tree.flatten(nn.unbox(params))
    rng = np.random.default_rng(seed)
    return jax.tree.unflatten(treedef, [np.asarray(x) + rng.normal(0, 0.3, x.shape).astype(
        np.float32) for x in leaves])


def _stack_layers(stack, num_layers):
    """Unscanned layer_i params -> the scanned stack's 'layers' subtree (layers axis first)."""
    return {"layers": jax.tree.map(lambda *xs: np.stack(xs),
                                   *[stack[f"layer_{i}"] for i in range(num_layers)])}


@pytest.fixture(scope="module")
def wordpiece():
    return WordPieceTokenizer(VOCAB)


@pytest.fixture(scope="module")
def bert_params():
    init = bert.BertModel(BERT_CONFIG).init(jax.random.key(0), IDS)
    return _perturbed(init["params"])


@pytest.fixture(scope="module")
def gpt_params():
    return _perturbed(gpt.GPT(GPT_CONFIG).init(jax.random.key(1), IDS)["params"], seed=1)


@pytest.fixture(scope="module")
def spm():
    """A SentencePiece model trained on synthetic translation pairs (both languages)."""
    pairs = synthetic_translation.translation_pairs(seed=0, num_pairs=200)
    return tokenizers.train_sentencepiece([s for pair in pairs for s in pair], 80)


# ---- float64 numpy BERT encoder --------------------------------------------------------------


def _f64(x):
    return np.asarray(x, np.float64)


def _layer_norm(x, p, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * _f64(p["scale"]) + _f64(p["bias"])


def _np_bert_attention(params, ids, types, valid, config):
    """Every layer's attention weights [L, H, T, T] of one sequence, in float64."""
    emb, eps = params["embeddings"], config.layer_norm_epsilon
    t = len(ids)
    x = (_f64(emb["word_embeddings"]["embedding"])[ids]
         + _f64(emb["token_type_embeddings"]["embedding"])[types]
         + _f64(emb["position_embeddings"]["embedding"])[:t])
    x = _layer_norm(x, emb["norm"], eps)
    maps = []
    for i in range(config.num_layers):
        layer = params["encoder"][f"layer_{i}"]
        att = layer["self_attention"]

        def proj(name, x=x, att=att):
            return np.einsum("td,dhk->thk", x, _f64(att[name]["kernel"])) + _f64(
                att[name]["bias"])

        q, k, v = proj("query"), proj("key"), proj("value")  # (T, H, D)
        logits = np.einsum("thd,shd->hts", q, k) / math.sqrt(q.shape[-1])
        logits = np.where(valid[None, None, :], logits, -np.inf)
        w = np.exp(logits - logits.max(-1, keepdims=True))
        w = w / w.sum(-1, keepdims=True)  # (H, T, S)
        maps.append(w)
        out = np.einsum("hts,shd->thd", w, v)
        out = np.einsum("thd,hdo->to", out, _f64(att["out"]["kernel"])) + _f64(att["out"]["bias"])
        x = _layer_norm(x + out, layer["self_attention_norm"], eps)
        h = x @ _f64(layer["mlp"]["wi"]["kernel"]) + _f64(layer["mlp"]["wi"]["bias"])
        h = 0.5 * h * (1.0 + np.vectorize(math.erf)(h / math.sqrt(2.0)))  # erf GELU
        h = h @ _f64(layer["mlp"]["wo"]["kernel"]) + _f64(layer["mlp"]["wo"]["bias"])
        x = _layer_norm(x + h, layer["mlp_norm"], eps)
    return np.stack(maps)


# ---- the sow passthrough ---------------------------------------------------------------------


@pytest.mark.parametrize("scan", [False, True])
def test_bert_sow_weights_keeps_outputs_and_sows_every_layer(bert_params, scan):
    config = dataclasses.replace(BERT_CONFIG, scan_layers=scan)
    params = dict(bert_params)
    if scan:
        params["encoder"] = _stack_layers(bert_params["encoder"], BERT_CONFIG.num_layers)
    model = bert.BertModel(config)
    plain = model.apply({"params": params}, IDS, TYPES, MASK)
    (seq, pooled), state = model.apply({"params": params}, IDS, TYPES, MASK, sow_weights=True,
                                       mutable=["intermediates"])
    np.testing.assert_array_equal(seq, plain[0])
    np.testing.assert_array_equal(pooled, plain[1])
    weights = am._stacked(state["intermediates"]["encoder"], "self_attention")
    assert weights.shape == (3, 2, 2, 7, 7)  # [L, B, H, T, T]
    for row in range(2):  # the numpy reference, per sequence, every layer
        real = MASK[row].astype(bool)
        want = _np_bert_attention(bert_params, IDS[row], TYPES[row], real, BERT_CONFIG)
        np.testing.assert_allclose(weights[:, row][:, :, real], want[:, :, real],
                                   rtol=1e-4, atol=1e-5)
    assert np.all(weights[:, 1][..., ~MASK[1].astype(bool)] == 0)  # padding keys get nothing


@pytest.mark.parametrize("scan", [False, True])
def test_gpt_sow_weights_keeps_logits_and_sows_every_layer(gpt_params, scan):
    params = dict(gpt_params)
    if scan:
        params["h"] = {**_stack_layers(gpt_params["h"], 2), "final_norm": gpt_params["h"][
            "final_norm"]}
    model = gpt.GPT(dataclasses.replace(GPT_CONFIG, scan_layers=scan))
    plain = model.apply({"params": params}, IDS)
    logits, state = model.apply({"params": params}, IDS, sow_weights=True,
                                mutable=["intermediates"])
    np.testing.assert_array_equal(logits, plain)
    weights = am._stacked(state["intermediates"]["h"], "self_attention")
    assert weights.shape == (2, 2, 2, 7, 7)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
    assert np.all(weights[..., np.triu_indices(7, 1)[0], np.triu_indices(7, 1)[1]] == 0)
    if scan:  # the scanned stack sows the same maps as the unscanned one
        unscanned = gpt.GPT(GPT_CONFIG).apply({"params": gpt_params}, IDS, sow_weights=True,
                                              mutable=["intermediates"])[1]
        np.testing.assert_allclose(
            weights, am._stacked(unscanned["intermediates"]["h"], "self_attention"), atol=1e-6)


def test_stacked_orders_layers_by_number_scanned_or_not():
    """layer_10 sorts before layer_2 as a string; the maps must come in layer order."""
    def sown(value):
        return {"self_attention": {"attention_weights": (np.full((1, 1, 2, 2), value),)}}

    unscanned = {f"layer_{i}": sown(i) for i in range(12)}
    np.testing.assert_array_equal(am._stacked(unscanned, "self_attention")[:, 0, 0, 0, 0],
                                  np.arange(12))
    scanned = {"layers": {"self_attention": {"attention_weights": (
        np.arange(12.0)[:, None, None, None, None] * np.ones((12, 1, 1, 2, 2)),)}}}
    np.testing.assert_array_equal(am._stacked(scanned, "self_attention")[:, 0, 0, 0, 0],
                                  np.arange(12))


# ---- extraction --------------------------------------------------------------------------------


def test_bert_maps_equal_the_float64_encoder_and_carry_the_pieces(bert_params, wordpiece):
    text, text_b = "The animal didn't cross the street", "it was too tired"
    (maps,) = am.bert_maps(BERT_CONFIG, bert_params, wordpiece, text, text_b)
    ids_a, ids_b = wordpiece.encode(text), wordpiece.encode(text_b)
    ids = [wordpiece.cls_id, *ids_a, wordpiece.sep_id, *ids_b, wordpiece.sep_id]
    want_tokens = ["[CLS]", "the", "animal", "didn", "'", "t", "cross", "the", "street", "[SEP]",
                   "it", "was", "too", "tired", "[SEP]"]
    assert [wordpiece.id_to_token(i) for i in ids] == want_tokens
    assert maps.kind == "encoder_self"
    assert maps.query_tokens == maps.key_tokens == want_tokens
    assert maps.weights.shape == (3, 2, 15, 15) and maps.weights.dtype == np.float32
    np.testing.assert_allclose(maps.weights.sum(-1), 1.0, rtol=1e-5)
    types = [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)  # text_b is segment 1
    want = _np_bert_attention(bert_params, np.array(ids), np.array(types), np.ones(15, bool),
                              BERT_CONFIG)
    np.testing.assert_allclose(maps.weights, want, rtol=1e-4, atol=1e-5)


def test_maps_for_model_reads_the_encoder_of_a_bert_head_model(bert_params, wordpiece):
    head = bert.BertForQuestionAnswering(BERT_CONFIG)
    params = _perturbed(head.init(jax.random.key(2), IDS, TYPES, MASK)["params"], seed=2)
    (got,) = am.maps_for_model(head, params, wordpiece, "the cat sat", text_b="it sat")
    (want,) = am.bert_maps(BERT_CONFIG, params["bert"], wordpiece, "the cat sat", "it sat")
    np.testing.assert_array_equal(got.weights, want.weights)
    (bare,) = am.maps_for_model(bert.BertModel(BERT_CONFIG), bert_params, wordpiece, "the cat")
    assert bare.query_tokens == ["[CLS]", "the", "cat", "[SEP]"]
    with pytest.raises(ValueError, match="target"):
        am.maps_for_model(head, params, wordpiece, "the cat", target="x")
    with pytest.raises(TypeError, match="Dense"):
        am.maps_for_model(nn.Dense(2), {}, wordpiece, "the cat")


def test_gpt_maps_are_causal_and_start_with_bos(gpt_params, spm):
    config = dataclasses.replace(GPT_CONFIG, vocab_size=spm.vocab_size)
    params = _perturbed(gpt.GPT(config).init(jax.random.key(3), IDS)["params"], seed=3)
    text = "one plus three equals four"
    (maps,) = am.maps_for_model(gpt.GPT(config), params, spm, text)
    ids = [spm.bos_id, *spm.encode(text)]
    assert maps.kind == "decoder_self"
    assert maps.query_tokens == maps.key_tokens == [spm.id_to_token(i) for i in ids]
    t = len(ids)
    assert maps.weights.shape == (2, 2, t, t)
    above = np.triu(np.ones((t, t), bool), 1)
    assert np.all(maps.weights[..., above] == 0.0)  # exactly: no query sees a later token
    assert np.all(maps.weights[..., ~above] > 0.0)
    np.testing.assert_allclose(maps.weights.sum(-1), 1.0, rtol=1e-5)
    # The first position sees only itself; not every row is uniform (the maps are the model's).
    np.testing.assert_allclose(maps.weights[..., 0, 0], 1.0)
    assert np.abs(maps.weights[..., -1, :] - 1.0 / t).max() > 0.05
    with pytest.raises(ValueError, match="text_b: only BERT"):
        am.maps_for_model(gpt.GPT(config), params, spm, text, text_b="two")


@pytest.fixture(scope="module")
def translation(spm):
    config = transformer.config_for_size("tiny", vocab_size=spm.vocab_size, max_len=24,
                                         hidden_size=16, num_heads=4, mlp_dim=32,
                                         num_encoder_layers=1, num_decoder_layers=2)
    model = transformer.EncoderDecoder(config)
    src, tgt = np.ones((1, 5), np.int32), np.ones((1, 4), np.int32)
    params = _perturbed(model.init(jax.random.key(4), src, tgt)["params"], seed=4)
    return model, params


def test_translation_maps_with_a_target(translation, spm):
    model, params = translation
    source, target = "一加三", "one plus three equals four"
    maps = {m.kind: m for m in am.translation_maps(model, params, spm, source, target)}
    assert list(maps) == ["encoder_self", "decoder_self", "cross"]
    src = [spm.id_to_token(i) for i in spm.encode(source)] + [spm.id_to_token(spm.eos_id)]
    tgt = [spm.id_to_token(spm.bos_id)] + [spm.id_to_token(i) for i in spm.encode(target)]
    s, t = len(src), len(tgt)
    assert maps["encoder_self"].weights.shape == (1, 4, s, s)
    assert maps["decoder_self"].weights.shape == (2, 4, t, t)
    assert maps["cross"].weights.shape == (2, 4, t, s)
    assert maps["encoder_self"].query_tokens == maps["encoder_self"].key_tokens == src
    assert maps["decoder_self"].query_tokens == maps["decoder_self"].key_tokens == tgt
    assert maps["cross"].query_tokens == tgt and maps["cross"].key_tokens == src
    for m in maps.values():
        np.testing.assert_allclose(m.weights.sum(-1), 1.0, rtol=1e-5)
    above = np.triu(np.ones((t, t), bool), 1)
    assert np.all(maps["decoder_self"].weights[..., above] == 0.0)
    assert np.all(maps["cross"].weights > 0.0)  # every query sees the whole source
    # The decoder's maps depend on the source: the cross-attention is to this source.
    other = {m.kind: m for m in am.translation_maps(model, params, spm, "九加三", target)}
    assert np.abs(other["cross"].weights - maps["cross"].weights).max() > 1e-3


def test_translation_maps_without_a_target_follow_the_greedy_translation(translation, spm):
    model, params = translation
    source = "二十三减四十五"
    maps = {m.kind: m for m in am.translation_maps(model, params, spm, source)}
    ids = np.asarray([[*spm.encode(source), spm.eos_id]], np.int32)
    out = transformer.translate(model, params, ids)
    tokens = [int(x) for x in np.asarray(out.tokens[0])[:int(out.lengths[0])]]
    if tokens and tokens[-1] == spm.eos_id:
        tokens = tokens[:-1]
    assert len(tokens) >= 1  # a random model stops at its length limit, not at once
    want = [spm.id_to_token(spm.bos_id)] + [spm.id_to_token(i) for i in tokens]
    assert maps["cross"].query_tokens == maps["decoder_self"].query_tokens == want
    assert maps["cross"].weights.shape[2] == len(want)


def test_empty_or_untokenizable_text_is_an_error(bert_params, wordpiece, gpt_params):
    with pytest.raises(ValueError, match="text: the text is empty"):
        am.bert_maps(BERT_CONFIG, bert_params, wordpiece, "   ")
    with pytest.raises(ValueError, match="text_b: the text is empty"):
        am.bert_maps(BERT_CONFIG, bert_params, wordpiece, "the cat", "")
    with pytest.raises(ValueError, match="no tokenizer"):
        am.gpt_maps(gpt.GPT(GPT_CONFIG), gpt_params, None, "the cat")
    with pytest.raises(ValueError, match="max_position_embeddings"):
        am.bert_maps(BERT_CONFIG, bert_params, wordpiece, " ".join(["cat"] * 30))


# ---- drawing -----------------------------------------------------------------------------------


def _png(path):
    image = Image.open(path)
    image.load()
    return image


def test_draw_writes_a_layers_by_heads_grid(tmp_path):
    rng = np.random.default_rng(0)
    weights = rng.dirichlet(np.ones(5), size=(3, 4, 4)).astype(np.float32)  # [L, H, q, k]
    maps = am.AttentionMaps("cross", weights, ["<s>", "one", "plus", "three"],
                            ["一", "加", "三", "</s>", "x"])
    full = am.draw(maps, str(tmp_path / "sub" / "full.png"))
    part = am.draw(maps, str(tmp_path / "part.png"), layers=[2], heads=[1, 3])
    assert full == str(tmp_path / "sub" / "full.png")
    a, b = _png(full), _png(part)
    assert a.format == b.format == "PNG"
    assert (a.text["Layers"], a.text["Heads"], a.text["Panels"]) == ("0,1,2", "0,1,2,3", "12")
    assert (b.text["Layers"], b.text["Heads"], b.text["Panels"]) == ("2", "1,3", "2")
    # The canvas grows with the grid: 4 heads are wider than 2, 3 layers taller than 1.
    assert a.size[0] > b.size[0] * 1.4 and a.size[1] > b.size[1] * 2
    assert len(np.unique(np.asarray(a.convert("RGB")).reshape(-1, 3), axis=0)) > 50  # drawn
    with pytest.raises(ValueError, match="layers"):
        am.draw(maps, str(tmp_path / "bad.png"), layers=[3])
    with pytest.raises(ValueError, match="AttentionMaps"):
        am.AttentionMaps("cross", weights, ["a"], ["b"])


# ---- the command -------------------------------------------------------------------------------


GPT_FLAG = f"--config={ROOT}/configs/gpt.py:size=tiny"
# What tests/conftest.py's tiny_lm_config changes in config.data, as flags the command repeats.
LM_DATA_KEYS = ("seq_len", "batch_size", "eval_batch_size", "vocab_size", "synthetic_entities")


def _capture_maps(monkeypatch):
    drawn = []
    draw = am.draw

    def recording(maps, path, **kw):
        drawn.append(maps)
        return draw(maps, path, **kw)

    monkeypatch.setattr(am, "draw", recording)
    return drawn


def test_command_on_a_trained_gpt_workdir(tiny_lm_config, tmp_path, monkeypatch, capsys):
    config = tiny_lm_config(steps=2)
    config.data.synthetic_entities = 60  # a smaller world than the default: faster
    config.sample.num = 0
    workdir = str(tmp_path / "lm")
    loop.run(config, workdir, devices=ONE_DEVICE)
    capsys.readouterr()  # the training log
    flags = [GPT_FLAG, f"--workdir={workdir}",
             *(f"--config.data.{k}={config.data[k]}" for k in LM_DATA_KEYS)]
    drawn = _capture_maps(monkeypatch)
    text = "Lomira lives in the city"
    paths = am.main(["attention_maps", *flags, f"--text={text}", "--heads=0,3"])
    want_path = os.path.join(workdir, "attention", "decoder_self.png")
    assert paths == [want_path] and capsys.readouterr().out.split() == [want_path]
    assert _png(want_path).text["Panels"] == "4"  # 2 layers x heads 0, 3
    # The maps are those of the trained checkpoint, not of a fresh initialisation.
    setup = loop.build(config, workdir, devices=ONE_DEVICE)
    checkpointer = Checkpointer(workdir)
    trained = checkpointer.restore(setup.state).params
    checkpointer.close()
    tokenizer = setup.task.tokenizer
    (want,) = am.gpt_maps(setup.task.model, trained, tokenizer, text)
    (fresh,) = am.gpt_maps(setup.task.model, setup.state.params, tokenizer, text)
    np.testing.assert_allclose(drawn[0].weights, want.weights, atol=1e-6)
    assert np.abs(drawn[0].weights - fresh.weights).max() > 1e-4
    assert drawn[0].query_tokens[0] == tokenizer.id_to_token(tokenizer.bos_id)


def test_command_on_a_hugging_face_bert_directory(tmp_path, bert_params, wordpiece, monkeypatch,
                                                  capsys):
    pytest.importorskip("safetensors")
    from zoo import hf

    directory = tmp_path / "bert"
    hf.save_pretrained(directory, BERT_CONFIG, bert_params, wordpiece)
    drawn = _capture_maps(monkeypatch)
    out = tmp_path / "maps"
    paths = am.main(["attention_maps", f"--pretrained={directory}", "--text=the animal",
                     "--text_b=it was tired", f"--out={out}", "--layers=0,2"])
    assert paths == [str(out / "encoder_self.png")] and os.path.isfile(paths[0])
    assert _png(paths[0]).text["Layers"] == "0,2"
    (want,) = am.bert_maps(BERT_CONFIG, bert_params, wordpiece, "the animal", "it was tired")
    assert drawn[0].query_tokens == want.query_tokens
    np.testing.assert_allclose(drawn[0].weights, want.weights, rtol=1e-5, atol=1e-6)


def test_command_on_a_gpt2_directory_needs_a_tokenizer(tmp_path, spm, monkeypatch):
    """zoo reads no GPT-2 byte-level BPE: --tokenizer supplies one, or the error says so."""
    pytest.importorskip("safetensors")
    from zoo import hf

    config = dataclasses.replace(GPT_CONFIG, vocab_size=spm.vocab_size)
    params = _perturbed(gpt.GPT(config).init(jax.random.key(5), IDS)["params"], seed=5)
    directory, model_file = tmp_path / "gpt2", str(tmp_path / "spm.model")
    hf.save_pretrained(directory, config, params, bos_token_id=0, eos_token_id=0)
    spm.save(model_file)
    flags = [f"--pretrained={directory}", "--text=one plus three", f"--out={tmp_path}"]
    with pytest.raises(ValueError, match="--tokenizer"):
        am.main(["x", *flags])
    drawn = _capture_maps(monkeypatch)
    assert am.main(["x", *flags, f"--tokenizer={model_file}"]) == [
        str(tmp_path / "decoder_self.png")]
    (want,) = am.gpt_maps(gpt.GPT(config), params, spm, "one plus three")
    np.testing.assert_allclose(drawn[0].weights, want.weights, rtol=1e-5, atol=1e-6)
    # A tokenizer with more ids than the model's vocabulary is refused, not clamped.
    small = dataclasses.replace(GPT_CONFIG, vocab_size=8)
    with pytest.raises(ValueError, match="vocabulary has 8 entries"):
        am.gpt_maps(gpt.GPT(small), gpt.GPT(small).init(jax.random.key(0), IDS[:, :2])["params"],
                    spm, "one plus three")


def test_command_errors(tmp_path):
    config_flag = GPT_FLAG
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        am.main(["x", config_flag, f"--workdir={missing}", "--text=hi"])
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        am.main(["x", config_flag, f"--workdir={empty}", "--text=hi"])
    assert os.listdir(empty) == []  # nothing built or created in a wrong workdir
    with pytest.raises(ValueError, match="--text: the text is empty"):
        am.main(["x", config_flag, f"--workdir={empty}", "--text= "])
    with pytest.raises(ValueError, match="--pretrained=DIR"):
        am.main(["x", "--text=hi"])
    with pytest.raises(ValueError, match="--heads=a"):
        am.main(["x", config_flag, f"--workdir={empty}", "--text=hi", "--heads=a"])
    with pytest.raises(ValueError, match="not both"):
        am.main(["x", config_flag, f"--workdir={empty}", f"--pretrained={empty}", "--text=hi"])
    # As a user runs it: one line saying what is wrong, no traceback.
    proc = subprocess.run([sys.executable, "-m", "zoo.attention_maps", config_flag,
                           f"--workdir={missing}", "--text=hi"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("zoo.attention_maps: --workdir=")
    assert "Traceback" not in proc.stderr
