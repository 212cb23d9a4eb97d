"""zoo.commands.attention_maps: the sow_weights passthrough of BERT and GPT (same outputs, one [B, H, T, T]
map per layer, scanned or not); BERT maps equal a float64 numpy encoder's attention in every
layer, labelled with the tokenizer's pieces; GPT maps are causal; translation maps have the
documented shapes, labels and causality, and follow the greedy translation when no target is
given; RNN seq2seq alignments (additive, dot, general) are, row by row, the float64 softmax of
the model's own step-by-step queries; the GPT classifier's maps are its GPT over its own input;
models and jobs without attention are one ConfigError; draw writes a layers x heads PNG; and the
command on trained GPT, GPT-classifier, RNN seq2seq and (in a process of its own) Transformer
translation workdirs and on a Hugging Face BERT directory, with its errors."""

import dataclasses
import math
import os
import re
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest
from PIL import Image

from configs import gpt_classify as gpt_classify_config
from configs import rnn_translate as rnn_translate_config
from configs import translate as translate_config
from zoo import decoding
from zoo.commands import attention_maps as am
from zoo.commands import jobs
from zoo.data.synthetic import translation as synthetic_translation
from zoo.data.tokenizers import base as tokenizers
from zoo.data.tokenizers.wordpiece import WordPieceTokenizer
from zoo.errors import ConfigError
from zoo.models import bert, elmo, gpt, gpt_classifier, nnlm, rnnlm, seq2seq, transformer, word2vec
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
    with pytest.raises(ConfigError, match="^Dense: no attention maps for this model"):
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
    jobs.train(config, workdir, devices=ONE_DEVICE)
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
    setup = jobs.build(config, workdir, devices=ONE_DEVICE)
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
    """A GPT-2 directory without vocab.json + merges.txt (save_pretrained writes none):
    --tokenizer supplies one, or the error says so."""
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
    proc = subprocess.run([sys.executable, "-m", "zoo.commands.attention_maps", config_flag,
                           f"--workdir={missing}", "--text=hi"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("zoo.commands.attention_maps: --workdir=")
    assert "Traceback" not in proc.stderr


# ---- RNN seq2seq alignments ---------------------------------------------------------------------

ATTENTIONS = ("additive", "dot", "general")


@pytest.fixture(scope="module")
def rnn_models(spm):
    """attention kind -> (Seq2Seq, params): a tiny LSTM encoder-decoder per scoring function."""
    models = {}
    for i, attention in enumerate(ATTENTIONS):
        config = seq2seq.config_for_size("tiny", vocab_size=spm.vocab_size, attention=attention,
                                         embed_dim=16, hidden_size=16, num_layers=1)
        model = seq2seq.Seq2Seq(config)
        src, tgt = np.ones((1, 5), np.int32), np.ones((1, 4), np.int32)
        models[attention] = model, _perturbed(model.init(jax.random.key(i), src, tgt)["params"],
                                              seed=i)
    return models


def _top_h(carry):
    """The top layer's h of a decoder carry, (c, h) for the LSTM, as float64 (B, H)."""
    return _f64(carry[1] if isinstance(carry, tuple) else carry)


def _np_scores(kind, p, memory, query):
    """Seed 002's score of each encoder output h_s (memory (S, M)) for one query (H,), float64."""
    if kind == "additive":  # Bahdanau: v^T tanh(W_k h_s + W_q q)
        return np.tanh(memory @ _f64(p["key_kernel"]) + query @ _f64(p["query_kernel"])) @ _f64(
            p["v"])
    if kind == "dot":  # Luong: h_s^T q
        return memory @ query
    return memory @ (query @ _f64(p["query_kernel"]))  # Luong general: h_s^T W q, W^T stored


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_rnn_alignment_rows_are_the_models_softmax_at_each_step(rnn_models, spm, attention):
    """Row t belongs to the step that produced target token t: the float64 softmax of the score
    of that step's query (Bahdanau: the state before the step, s_{t-1}; Luong: the state after
    it, h_t), read from the model decoding one token at a time, against every encoder output.
    For Luong the row also rebuilds the step's attentional vector h~_t = tanh(W_c [c_t; h_t])
    with c_t = sum_s alpha_ts h_s, which the model feeds to the next step."""
    model, params = rnn_models[attention]
    source, target = "一加三", "one plus three equals four"
    (m,) = am.maps_for_model(model, params, spm, source, target=target)
    source_ids, produced = [*spm.encode(source), spm.eos_id], [*spm.encode(target), spm.eos_id]
    assert m.kind == "alignment" and m.weights.shape == (1, 1, len(produced), len(source_ids))
    assert m.query_tokens == [spm.id_to_token(i) for i in produced]  # y_1 .. y_n [EOS]
    assert m.key_tokens == [spm.id_to_token(i) for i in source_ids]  # x [EOS]
    np.testing.assert_allclose(m.weights.sum(-1), 1.0, rtol=1e-5)
    variables, p = {"params": params}, params["attention"]
    state = model.apply(variables, np.asarray([source_ids], np.int32), method="initial_state")
    memory = _f64(state.memory[0])  # (S, M) the encoder's outputs
    for t, token in enumerate([spm.bos_id, *produced[:-1]]):  # step t reads y_{t-1}
        before = _top_h(state.carries[-1])[0]
        _, state = model.apply(variables, np.asarray([[token]], np.int32), state,
                               method="decode")
        after = _top_h(state.carries[-1])[0]
        scores = _np_scores(attention, p, memory, before if attention == "additive" else after)
        alpha = np.exp(scores - scores.max())
        np.testing.assert_allclose(m.weights[0, 0, t], alpha / alpha.sum(), rtol=1e-4,
                                   atol=1e-6)
        if attention != "additive":
            context = _f64(m.weights[0, 0, t]) @ memory
            h_tilde = np.tanh(np.concatenate([context, after]) @ _f64(p["output_kernel"]))
            np.testing.assert_allclose(state.feed[0], h_tilde, rtol=1e-4, atol=1e-5)
    # Far from uniform next to the tolerances: the comparison above tells the scores apart.
    assert np.abs(m.weights - 1.0 / len(source_ids)).max() > 0.01


def test_rnn_alignment_without_a_target_draws_the_greedy_translation(rnn_models, spm):
    model, params = rnn_models["general"]
    source = "二十三减四十五"
    (m,) = am.alignment_maps(model, params, spm, source, max_len=12)
    ids = np.asarray([[*spm.encode(source), spm.eos_id]], np.int32)
    out = decoding.greedy(seq2seq.seq2seq_decoder(model, params, ids, max_len=12),
                          np.asarray([[spm.bos_id]], np.int32), max_len=12,
                          eos_id=spm.eos_id, pad_id=spm.pad_id)
    tokens = [int(x) for x in np.asarray(out.tokens[0])[1:int(out.lengths[0])]]
    assert len(tokens) >= 2 and m.query_tokens == [spm.id_to_token(i) for i in tokens]
    assert m.weights.shape == (1, 1, len(tokens), ids.shape[1])
    np.testing.assert_allclose(m.weights.sum(-1), 1.0, rtol=1e-5)


# ---- the GPT classifier, and the families without attention -----------------------------------


def test_gpt_classifier_maps_its_gpt_over_the_classifiers_own_input(spm):
    config = dataclasses.replace(GPT_CONFIG, vocab_size=spm.vocab_size)
    model = gpt_classifier.GPTForClassification(config, num_labels=3)
    extract = gpt_classifier.extract_id(config.vocab_size)
    init = model.init(jax.random.key(6), np.asarray([[spm.bos_id, 7, extract]], np.int32))
    params = _perturbed(init["params"], seed=6)
    text, text_b = "one plus three", "equals four"
    (m,) = am.maps_for_model(model, params, spm, text, text_b=text_b)
    want = [spm.id_to_token(spm.bos_id), *(spm.id_to_token(i) for i in spm.encode(text)),
            "[delim]", *(spm.id_to_token(i) for i in spm.encode(text_b)), "[extract]"]
    t = len(want)
    assert m.kind == "decoder_self" and m.query_tokens == m.key_tokens == want
    assert m.weights.shape == (2, 2, t, t)
    np.testing.assert_allclose(m.weights.sum(-1), 1.0, rtol=1e-5)
    assert np.all(m.weights[..., np.triu(np.ones((t, t), bool), 1)] == 0.0)
    # Causal, so the [start] text prefix is GPT's own map of [BOS] text from params['gpt'] ...
    (lm,) = am.gpt_maps(gpt.GPT(config), params["gpt"], spm, text)
    n = lm.weights.shape[-1]
    np.testing.assert_allclose(m.weights[..., :n, :n], lm.weights, rtol=1e-5, atol=1e-6)
    # ... and the new tokens read the classifier's own rows: swapping the [delim] and [extract]
    # rows of params['special_tokens'] moves the [extract] row (a constant shift would not: the
    # first LayerNorm removes it).
    moved = {**params, "special_tokens": params["special_tokens"][::-1]}
    (other,) = am.maps_for_model(model, moved, spm, text, text_b=text_b)
    np.testing.assert_array_equal(other.weights[..., :n, :], m.weights[..., :n, :])
    assert np.abs(other.weights[..., -1, :] - m.weights[..., -1, :]).max() > 1e-3
    # Both texts are checked against the vocabulary (an embedding lookup would clamp silently).
    small = gpt_classifier.GPTForClassification(dataclasses.replace(GPT_CONFIG, vocab_size=8))
    with pytest.raises(ConfigError, match="vocabulary has 8 entries"):
        am.maps_for_model(small, params, spm, "x", text_b=text_b)


@pytest.mark.parametrize("model, family", [
    (elmo.BiLM(elmo.BiLMConfig(vocab_size=8)), "ELMo's biLM"),
    (nnlm.NNLM(nnlm.NNLMConfig(vocab_size=8)), "the NNLM"),
    (word2vec.Word2Vec(word2vec.Word2VecConfig(vocab_size=8)), "word2vec"),
    (rnnlm.RNNLM(rnnlm.RNNLMConfig(vocab_size=8)), "the RNN language model"),
    (seq2seq.Seq2Seq(seq2seq.Seq2SeqConfig(vocab_size=8, attention="none")),
     "RNN seq2seq with attention='none'"),
])
def test_models_without_attention_maps_say_so(model, family, spm):
    with pytest.raises(ConfigError) as raised:
        am.maps_for_model(model, {}, spm, "one plus three")
    message = str(raised.value)
    assert message.startswith(f"{type(model).__name__}: no attention maps for {family} (")
    assert message.endswith("and RNN seq2seq with attention (configs/rnn_translate.py:"
                            "attention=additive, dot or general)") and "\n" not in message


@pytest.mark.parametrize("config, family", [
    ("elmo.py:size=tiny", "ELMo's biLM"),
    ("nnlm.py", "the NNLM"),
    ("word2vec.py", "word2vec"),
    ("rnnlm.py", "the RNN language model"),
    ("feature_classify.py:kind=elmo", "the feature classifier"),
    ("rnn_translate.py:attention=none", "RNN seq2seq with attention='none'"),
])
def test_command_refuses_jobs_without_attention_before_reading_the_workdir(tmp_path, config,
                                                                          family):
    workdir = tmp_path / "run"
    flag = f"--config={ROOT}/configs/{config}"
    with pytest.raises(ConfigError) as raised:
        am.main(["x", flag, f"--workdir={workdir}", "--text=hi"])
    assert str(raised.value).startswith(f"{flag}: no attention maps for {family}")
    assert "configs/gpt_classify.py" in str(raised.value)  # the families that have maps
    assert not workdir.exists()  # said at once: no data, tokenizer or checkpoint work


def test_command_without_attention_is_one_line_and_exit_status_1(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.commands.attention_maps", "--config=configs/elmo.py:size=tiny",
         f"--workdir={tmp_path}", "--text=The animal didn't cross the street"],
        cwd=ROOT, env=_one_device_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "zoo.commands.attention_maps: --config=configs/elmo.py:size=tiny: no attention maps for ELMo's "
        "biLM (two LSTM language models, no attention); attention maps come from Transformer "
        "translation (configs/translate.py)")


# ---- the command on trained translation and classification runs ------------------------------


def _one_device_env():
    """The suite's environment (its compilation cache and -O0 code generation) on one device,
    as a user's shell would run the command: the tracebacks ZOO_DEBUG shows off."""
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "",
                   os.environ.get("XLA_FLAGS", ""))
    env = dict(os.environ, XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count=1")
    env.pop("ZOO_DEBUG", None)
    return env


def _short_run(config, **data):
    """2 steps, greedy eval, nothing else: a checkpoint to read, not a model to judge."""
    config.data.update(data)
    config.train.update(steps=2, log_every=2, tensorboard=False, best_metric="")
    if "decode" in config.get("eval", {}):
        config.eval.update(decode="greedy", num_samples=0)
    return config


@pytest.fixture(scope="module")
def rnn_workdirs(tmp_path_factory):
    """attention -> (workdir, the command's --config flags) of a 2-step tiny RNN seq2seq run,
    trained on first use; the runs share one data cache (one SentencePiece model)."""
    root, runs = tmp_path_factory.mktemp("rnn_translate"), {}
    data = dict(synthetic_pairs=200, batch_size=8, eval_batch_size=32,
                cache_dir=str(root / "cache"))

    def get(attention):
        if attention not in runs:
            config = rnn_translate_config.get_config(f"attention={attention}")
            workdir = str(root / attention)
            jobs.train(_short_run(config, **data), workdir, devices=ONE_DEVICE)
            runs[attention] = workdir, [
                f"--config={ROOT}/configs/rnn_translate.py:attention={attention}",
                f"--workdir={workdir}", *(f"--config.data.{k}={v}" for k, v in data.items())]
        return runs[attention]

    return get


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_command_on_a_trained_rnn_seq2seq_workdir(attention, rnn_workdirs, monkeypatch, capsys):
    workdir, flags = rnn_workdirs(attention)
    capsys.readouterr()  # the training log
    drawn = _capture_maps(monkeypatch)
    paths = am.main(["attention_maps", *flags, "--text=一加三"])
    want = os.path.join(workdir, "attention", "alignment.png")
    out = capsys.readouterr().out.splitlines()
    assert paths == [want] and out[1:] == [want] and out[0].startswith("translation: ")
    assert _png(want).text["Title"].startswith("alignment") and _png(want).text["Panels"] == "1"
    (m,) = drawn
    assert m.kind == "alignment" and m.weights.shape[:2] == (1, 1)
    np.testing.assert_allclose(m.weights.sum(-1), 1.0, rtol=1e-5)
    if attention != "general":
        return
    # The rows and the printed translation are those of the trained checkpoint's greedy output.
    setup = jobs.build(am._flags(["x", *flags]).config, workdir, devices=ONE_DEVICE)
    checkpointer = Checkpointer(workdir)
    trained = checkpointer.restore_params(setup.state.params)
    checkpointer.close()
    tokenizer = setup.task.tokenizer
    (want_maps,) = am.alignment_maps(setup.task.model, trained, tokenizer, "一加三")
    assert m.query_tokens == want_maps.query_tokens
    np.testing.assert_allclose(m.weights, want_maps.weights, atol=1e-6)
    ids = [tokenizer.token_to_id(t) for t in m.query_tokens]
    ids = ids[:-1] if ids[-1] == tokenizer.eos_id else ids
    assert out[0] == f"translation: {tokenizer.decode(ids)}"


def test_command_on_a_transformer_translation_workdir_end_to_end(tmp_path):
    """As a user runs it, in a process of its own: the greedy translation, then the three PNGs."""
    data = dict(synthetic_pairs=200, batch_size=8, eval_batch_size=32,
                cache_dir=str(tmp_path / "cache"))
    workdir, out = tmp_path / "run", tmp_path / "maps"
    jobs.train(_short_run(translate_config.get_config("size=tiny"), **data), str(workdir),
               devices=ONE_DEVICE)
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.commands.attention_maps", "--config=configs/translate.py:size=tiny",
         f"--workdir={workdir}", "--text=一加三", f"--out={out}", "--layers=0", "--heads=0",
         *(f"--config.data.{k}={v}" for k, v in data.items())],
        cwd=ROOT, env=_one_device_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    want = [str(out / f"{kind}.png") for kind in ("encoder_self", "decoder_self", "cross")]
    assert lines[0].startswith("translation: ") and lines[1:] == want, proc.stdout
    assert [_png(p).text["Title"] for p in want] == [
        "encoder self-attention", "decoder self-attention (causal)",
        "cross-attention (decoder query -> source key)"]


def test_command_on_a_gpt_classifier_workdir(tmp_path, monkeypatch, capsys):
    data = dict(synthetic_entities=60, seq_len=32, batch_size=8, eval_batch_size=32,
                vocab_size=128)
    workdir = tmp_path / "run"
    jobs.train(_short_run(gpt_classify_config.get_config("size=tiny,task=relation"), **data),
               str(workdir), devices=ONE_DEVICE)
    capsys.readouterr()
    drawn = _capture_maps(monkeypatch)
    paths = am.main(["x", f"--config={ROOT}/configs/gpt_classify.py:size=tiny,task=relation",
                     f"--workdir={workdir}", "--text=Lomira lives in the city", "--layers=1",
                     *(f"--config.data.{k}={v}" for k, v in data.items())])
    assert paths == [str(workdir / "attention" / "decoder_self.png")]
    assert capsys.readouterr().out.split() == paths  # no translation line for a classifier
    (m,) = drawn
    assert m.kind == "decoder_self" and m.query_tokens[-1] == "[extract]"
    assert m.weights.shape[:2] == (2, 4) and _png(paths[0]).text["Panels"] == "4"
    np.testing.assert_allclose(m.weights.sum(-1), 1.0, rtol=1e-5)
