"""zoo.eval.attention_maps and zoo.commands.attention_plot.draw, from a model's parameters to the
picture: the sow_weights passthrough of BERT and GPT (same outputs, one [B, H, T, T] map per
layer, scanned or not); BERT maps equal a float64 numpy encoder's attention in every layer,
labelled with the tokenizer's pieces; GPT maps are causal; translation maps have the documented
shapes, labels and causality, and follow the greedy translation when no target is given; RNN
seq2seq alignments (additive, dot, general) are, row by row, the float64 softmax of the model's
own step-by-step queries; the GPT classifier's maps are its GPT over its own input; models
without attention are one ConfigError; draw writes a layers x heads PNG. The command itself:
test_attention_maps_command.py."""

import dataclasses
import math

import flax.linen as nn
import jax
import numpy as np
import pytest

from tests import attention_cases as cases
from tests.attention_cases import (ATTENTIONS, BERT_CONFIG, GPT_CONFIG, IDS, MASK, TYPES,
                                   perturbed, png)
from tests.numerics import assert_close
from zoo import decoding
from zoo.commands.attention_plot import draw
from zoo.errors import ConfigError
from zoo.eval import attention_maps as am
from zoo.models import (bert, elmo, encoder_decoder, gpt, gpt_classifier, nnlm, rnnlm, seq2seq,
                        word2vec)


def _stack_layers(stack, num_layers):
    """Unscanned layer_i params -> the scanned stack's 'layers' subtree (layers axis first)."""
    return {"layers": jax.tree.map(lambda *xs: np.stack(xs),
                                   *[stack[f"layer_{i}"] for i in range(num_layers)])}


@pytest.fixture(scope="module")
def wordpiece():
    return cases.wordpiece()


@pytest.fixture(scope="module")
def bert_params():
    return cases.bert_params()


@pytest.fixture(scope="module")
def gpt_params():
    return perturbed(gpt.GPT(GPT_CONFIG).init(jax.random.key(1), IDS)["params"], seed=1)


@pytest.fixture(scope="module")
def spm():
    return cases.spm()


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
        assert_close(weights[:, row][:, :, real], want[:, :, real], 1e-4)
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
        assert_close(weights, am._stacked(unscanned["intermediates"]["h"], "self_attention"),
                     1e-6)


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
    assert_close(maps.weights, want, 1e-4)


def test_maps_for_model_reads_the_encoder_of_a_bert_head_model(bert_params, wordpiece):
    head = bert.BertForQuestionAnswering(BERT_CONFIG)
    params = perturbed(head.init(jax.random.key(2), IDS, TYPES, MASK)["params"], seed=2)
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
    params = perturbed(gpt.GPT(config).init(jax.random.key(3), IDS)["params"], seed=3)
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
    config = encoder_decoder.config_for_size("tiny", vocab_size=spm.vocab_size, max_len=24,
                                         hidden_size=16, num_heads=4, mlp_dim=32,
                                         num_encoder_layers=1, num_decoder_layers=2)
    model = encoder_decoder.EncoderDecoder(config)
    src, tgt = np.ones((1, 5), np.int32), np.ones((1, 4), np.int32)
    params = perturbed(model.init(jax.random.key(4), src, tgt)["params"], seed=4)
    return model, params


@pytest.mark.slow
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


@pytest.mark.slow
def test_translation_maps_without_a_target_follow_the_greedy_translation(translation, spm):
    model, params = translation
    source = "二十三减四十五"
    maps = {m.kind: m for m in am.translation_maps(model, params, spm, source)}
    ids = np.asarray([[*spm.encode(source), spm.eos_id]], np.int32)
    out = encoder_decoder.translate(model, params, ids)
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


def test_draw_writes_a_layers_by_heads_grid(tmp_path):
    rng = np.random.default_rng(0)
    weights = rng.dirichlet(np.ones(5), size=(3, 4, 4)).astype(np.float32)  # [L, H, q, k]
    maps = am.AttentionMaps("cross", weights, ["<s>", "one", "plus", "three"],
                            ["一", "加", "三", "</s>", "x"])
    full = draw(maps, str(tmp_path / "sub" / "full.png"))
    part = draw(maps, str(tmp_path / "part.png"), layers=[2], heads=[1, 3])
    assert full == str(tmp_path / "sub" / "full.png")
    a, b = png(full), png(part)
    assert a.format == b.format == "PNG"
    assert (a.text["Layers"], a.text["Heads"], a.text["Panels"]) == ("0,1,2", "0,1,2,3", "12")
    assert (b.text["Layers"], b.text["Heads"], b.text["Panels"]) == ("2", "1,3", "2")
    # The canvas grows with the grid: 4 heads are wider than 2, 3 layers taller than 1.
    assert a.size[0] > b.size[0] * 1.4 and a.size[1] > b.size[1] * 2
    assert len(np.unique(np.asarray(a.convert("RGB")).reshape(-1, 3), axis=0)) > 50  # drawn
    with pytest.raises(ValueError, match="layers"):
        draw(maps, str(tmp_path / "bad.png"), layers=[3])
    with pytest.raises(ValueError, match="AttentionMaps"):
        am.AttentionMaps("cross", weights, ["a"], ["b"])


# ---- RNN seq2seq alignments ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def rnn_models(spm):
    """attention kind -> (Seq2Seq, params): a tiny LSTM encoder-decoder per scoring function."""
    models = {}
    for i, attention in enumerate(ATTENTIONS):
        config = seq2seq.config_for_size("tiny", vocab_size=spm.vocab_size, attention=attention,
                                         embed_dim=16, hidden_size=16, num_layers=1)
        model = seq2seq.Seq2Seq(config)
        src, tgt = np.ones((1, 5), np.int32), np.ones((1, 4), np.int32)
        models[attention] = model, perturbed(model.init(jax.random.key(i), src, tgt)["params"],
                                             seed=i)
    return models


def _top_h(carry):
    """The top layer's h of a decoder carry, (c, h) for the LSTM, as float64 (B, H)."""
    return _f64(carry[1] if isinstance(carry, tuple) else carry)


def _np_scores(kind, p, memory, query):
    """The score of each encoder output h_s (memory (S, M)) for one query (H,), float64, as the
    course slides on sequence generation and attention define it."""
    if kind == "additive":  # Bahdanau: v^T tanh(W_k h_s + W_q q)
        return np.tanh(memory @ _f64(p["key_kernel"]) + query @ _f64(p["query_kernel"])) @ _f64(
            p["v"])
    if kind == "dot":  # Luong: h_s^T q
        return memory @ query
    return memory @ (query @ _f64(p["query_kernel"]))  # Luong general: h_s^T W q, W^T stored


@pytest.mark.slow
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
        assert_close(m.weights[0, 0, t], alpha / alpha.sum(), 1e-4)
        if attention != "additive":
            context = _f64(m.weights[0, 0, t]) @ memory
            h_tilde = np.tanh(np.concatenate([context, after]) @ _f64(p["output_kernel"]))
            assert_close(state.feed[0], h_tilde, 1e-4)
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


@pytest.mark.slow
def test_gpt_classifier_maps_its_gpt_over_the_classifiers_own_input(spm):
    config = dataclasses.replace(GPT_CONFIG, vocab_size=spm.vocab_size)
    model = gpt_classifier.GPTForClassification(config, num_labels=3)
    extract = gpt_classifier.extract_id(config.vocab_size)
    init = model.init(jax.random.key(6), np.asarray([[spm.bos_id, 7, extract]], np.int32))
    params = perturbed(init["params"], seed=6)
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
    assert_close(m.weights[..., :n, :n], lm.weights, 1e-5)
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
