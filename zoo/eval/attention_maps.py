"""Attention weights per layer and head, for one input, read out of the models that have them.

The Wenzhou University Transformer lecture and the lecture notes from NNLM to BERT show what one
encoder layer's heads do with "The animal didn't cross the street because it was too tired":
encoding "it", one head attends mostly to "The animal", another to "tired". This module gives the
same thing for our models: every layer and head as a query x key matrix with the tokens on both axes
(AttentionMaps), which zoo.commands.attention_plot draws and python -m zoo.commands.attention_maps
writes as PNGs.

What each family gives (maps_for_model picks by the model's class):

* BERT (a bare BertModel or a head model holding the encoder as params['bert']): the encoder's
  self-attention over [CLS] a [SEP] (b [SEP]).
* GPT: the decoder's causal self-attention over [BOS] text (zero above the diagonal).
* The GPT classifier: its GPT subtree's causal self-attention over the classifier's own input,
  [start] text ([delim] text_b) [extract]; the [extract] row is what the head reads.
* The Transformer encoder-decoder: encoder self-attention over the source (x [EOS]), decoder
  self-attention over the decoder input [BOS] y, and cross-attention from each decoder position
  to the source; decoder row t is the position that reads y_t (y_0 = BOS) and predicts y_{t+1}.
* RNN seq2seq with attention (additive (Bahdanau), dot or general (Luong)): the
  'alignment' of the course slides on sequence generation and attention, one map of decoder
  step x source position: row t is the distribution alpha_t
  the model sowed for the step that produced target token t.

Without a target, both translators translate greedily first, and one teacher-forced forward over
that translation sows the maps. The weights are what the model computed: rows are softmax
distributions over the keys a query may see (attention dropout is off: deterministic forward).
Models without attention (ELMo, the NNLM, word2vec, the RNN LM, seq2seq with attention='none')
raise a ConfigError naming the families that have maps.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from zoo import decoding
from zoo.errors import ConfigError
from zoo.models import bert, encoder_decoder, gpt, gpt_classifier, seq2seq

# kind -> (title, what a row is, what a column is, whether the grid is layers x heads)
_KINDS = {
    "encoder_self": ("encoder self-attention", "query", "key", True),
    "decoder_self": ("decoder self-attention (causal)", "query", "key", True),
    "cross": ("cross-attention (decoder query -> source key)", "query", "key", True),
    "alignment": ("alignment: each decoder step's attention over the source",
                  "decoder step (token it produced)", "source token", False),
}
KINDS = tuple(_KINDS)
# config.task (or, for maps_for_model, the model class) -> why it has no maps to draw.
NO_MAPS = {
    "elmo": "ELMo's biLM (two LSTM language models, no attention)",
    "nnlm": "the NNLM (a fixed window of embeddings through one hidden layer, no attention)",
    "word2vec": "word2vec (word vectors, no sequence model, no attention)",
    "rnnlm": "the RNN language model (its recurrent state carries the context, no attention)",
    "feature_classify": "the feature classifier (frozen ELMo / word2vec features under a "
                        "pooling or alignment head; this command does not draw them)",
}
_MODEL_TASKS = {"BiLM": "elmo", "NNLM": "nnlm", "Word2Vec": "word2vec", "RNNLM": "rnnlm",
                "FeatureClassifier": "feature_classify"}
SEQ2SEQ_WITHOUT_ATTENTION = ("RNN seq2seq with attention='none' (the decoder reads only the "
                             "encoder's final state: no alignment)")
_WITH_MAPS = ("Transformer translation (configs/translate.py), BERT and its head models "
              "(configs/bert_pretrain.py, classify.py, squad.py), GPT (configs/gpt.py), the GPT "
              "classifier (configs/gpt_classify.py) and RNN seq2seq with attention "
              "(configs/rnn_translate.py:attention=additive, dot or general)")


def no_maps(where: str, family: str) -> ConfigError:
    return ConfigError(f"{where}: no attention maps for {family}; attention maps come from "
                       f"{_WITH_MAPS}")


@dataclasses.dataclass
class AttentionMaps:
    """One attention kind of one input.

    Attributes:
      kind: 'encoder_self', 'decoder_self', 'cross' or 'alignment' (RNN seq2seq: one layer,
        one head).
      weights: float32 [layers, heads, queries, keys]; row q is query q's distribution over keys.
      query_tokens: the token at each query position (rows).
      key_tokens: the token at each key position (columns).
    """

    kind: str
    weights: np.ndarray
    query_tokens: list[str]
    key_tokens: list[str]

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"AttentionMaps: kind={self.kind!r}; use one of {KINDS}")
        self.weights = np.asarray(self.weights, np.float32)
        expected = (len(self.query_tokens), len(self.key_tokens))
        if self.weights.ndim != 4 or self.weights.shape[2:] != expected:
            raise ValueError(
                f"AttentionMaps({self.kind}): weights must be [layers, heads, queries, keys] "
                f"with {expected[0]} query and {expected[1]} key tokens, got shape "
                f"{self.weights.shape}"
            )

    @property
    def num_layers(self) -> int:
        return self.weights.shape[0]

    @property
    def num_heads(self) -> int:
        return self.weights.shape[1]

    @property
    def title(self) -> str:
        return _KINDS[self.kind][0]

    @property
    def row_label(self) -> str:
        return _KINDS[self.kind][1]

    @property
    def column_label(self) -> str:
        return _KINDS[self.kind][2]

    @property
    def per_head(self) -> bool:
        """The panels are layers x heads (an RNN alignment has neither)."""
        return _KINDS[self.kind][3]


def _stacked(stack: Any, attention: str) -> np.ndarray:
    """A stack's sown weights for one attention sublayer -> float32 [L, B, H, q, k].

    `stack` is the stack's 'intermediates' subtree: one 'layers' entry with a leading layers
    axis when the layers are scanned, else layer_0 .. layer_{L-1}.
    """
    if "layers" in stack:
        return np.asarray(stack["layers"][attention]["attention_weights"][-1], np.float32)
    names = sorted((k for k in stack if k.startswith("layer_")), key=lambda k: int(k[6:]))
    return np.stack([np.asarray(stack[k][attention]["attention_weights"][-1], np.float32)
                     for k in names])


def _host(params: Any) -> Any:
    """Plain numpy params: no logical boxes, no shardings tied to a training mesh."""
    params = nn.unbox(params)
    if isinstance(params, dict) and set(params) == {"params"}:
        params = params["params"]
    return jax.device_get(params)


def check_text(name: str, text: str | None) -> str:
    if text is None or not str(text).strip():
        raise ConfigError(f"{name}: the text is empty; give the sentence whose attention to draw "
                          f"(e.g. {name}=\"The animal didn't cross the street because it was too "
                          "tired\")")
    return str(text)


def _encode(tokenizer: Any, name: str, text: str) -> list[int]:
    if tokenizer is None:
        raise ConfigError(
            "this checkpoint has no tokenizer (no vocab.txt, tokenizer.json or vocab.json + "
            "merges.txt beside it): pass --tokenizer=<a .model, vocab.txt or GPT-2 directory of "
            "the model's vocabulary>"
        )
    ids = list(tokenizer.encode(check_text(name, text)))
    if not ids:
        raise ConfigError(f"{name}: {text!r} gives no tokens; give some words")
    return ids


def _check_length(what: str, length: int, limit: int, field: str) -> None:
    if length > limit:
        raise ConfigError(f"{what} is {length} tokens but the model has {limit} positions "
                          f"({field}); shorten the text")


def _check_vocab(what: str, ids: Sequence[int], vocab_size: int) -> None:
    # An embedding lookup clamps out-of-range ids silently: a tokenizer that is not the model's
    # would draw maps of the wrong tokens without a word.
    if max(ids) >= vocab_size:
        raise ConfigError(f"{what}: the tokenizer gives id {max(ids)} but the model's vocabulary "
                          f"has {vocab_size} entries; use the tokenizer the model was trained with")


def _pieces(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    return [tokenizer.id_to_token(int(i)) for i in ids]


def bert_maps(config: bert.BertConfig, bert_params: Any, tokenizer: Any, text: str,
              text_b: str | None = None) -> list[AttentionMaps]:
    """The BERT encoder's self-attention over [CLS] text [SEP] (text_b [SEP]).

    Args:
      config: the encoder's config.
      bert_params: the BertModel params (a head model's params['bert']).
      tokenizer: the model's tokenizer (zoo.data.tokenizers.base.Tokenizer).
      text: sentence A.
      text_b: sentence B (segment 1), or None for a single sentence.

    Returns:
      [AttentionMaps('encoder_self', [L, H, T, T], tokens, tokens)].
    """
    ids = [tokenizer.cls_id, *_encode(tokenizer, "text", text), tokenizer.sep_id]
    types = [0] * len(ids)
    if text_b is not None:
        ids_b = [*_encode(tokenizer, "text_b", text_b), tokenizer.sep_id]
        ids, types = ids + ids_b, types + [1] * len(ids_b)
    _check_length("[CLS] text [SEP] (text_b [SEP])", len(ids), config.max_position_embeddings,
                  "max_position_embeddings")
    _check_vocab("text", ids, config.vocab_size)
    _, state = bert.BertModel(config).apply(
        {"params": _host(bert_params)}, np.asarray([ids], np.int32),
        np.asarray([types], np.int32), None, sow_weights=True, mutable=["intermediates"])
    weights = _stacked(state["intermediates"]["encoder"], "self_attention")[:, 0]
    tokens = _pieces(tokenizer, ids)
    return [AttentionMaps("encoder_self", weights, tokens, tokens)]


def _gpt_weights(model: gpt.GPT, params: Any, ids: Sequence[int], extra: Any = None
                 ) -> np.ndarray:
    """GPT's sown self-attention of one row of ids -> [L, H, T, T]; `extra`: the rows of ids
    past the vocabulary (the classifier's [delim] / [extract])."""
    model = model.clone(parent=None, decode=False)
    _, state = model.apply({"params": params}, np.asarray([ids], np.int32), sow_weights=True,
                           extra_embeddings=extra, mutable=["intermediates"])
    return _stacked(state["intermediates"]["h"], "self_attention")[:, 0]


def gpt_maps(model: gpt.GPT, params: Any, tokenizer: Any, text: str) -> list[AttentionMaps]:
    """GPT's causal self-attention over [BOS] text (the BOS only for tokenizers that have one).

    Returns:
      [AttentionMaps('decoder_self', [L, H, T, T], tokens, tokens)], zero above the diagonal.
    """
    ids = _encode(tokenizer, "text", text)
    bos = getattr(tokenizer, "bos_id", None)
    if bos is not None:
        ids = [bos, *ids]  # as the LM task's documents and prompts start
    _check_length("[BOS] text", len(ids), model.config.max_len, "max_len")
    _check_vocab("text", ids, model.config.vocab_size)
    tokens = _pieces(tokenizer, ids)
    return [AttentionMaps("decoder_self", _gpt_weights(model, _host(params), ids), tokens,
                          tokens)]


def gpt_classifier_maps(model: gpt_classifier.GPTForClassification, params: Any, tokenizer: Any,
                        text: str, text_b: str | None = None) -> list[AttentionMaps]:
    """The GPT classifier's GPT over its own input transformation (zoo.tasks.gpt_classification):
    [start] text [extract], or [start] text [delim] text_b [extract] for a pair (multiple
    choice: the context and one option).

    Returns:
      [AttentionMaps('decoder_self', [L, H, T, T], tokens, tokens)], the new tokens labelled
      '[delim]' and '[extract]'.
    """
    cfg = model.config
    ids_a = _encode(tokenizer, "text", text)
    ids_b = [] if text_b is None else _encode(tokenizer, "text_b", text_b)
    start = getattr(tokenizer, "bos_id", None)
    if start is None:
        raise ConfigError(f"{type(tokenizer).__name__} has no beginning-of-text id to start the "
                          "classifier's input with; use the tokenizer the model was trained with")
    _check_vocab("text", [start, *ids_a, *ids_b], cfg.vocab_size)
    delimiter = [gpt_classifier.delimiter_id(cfg.vocab_size)] if text_b is not None else []
    ids = [start, *ids_a, *delimiter, *ids_b, gpt_classifier.extract_id(cfg.vocab_size)]
    _check_length("[start] text ([delim] text_b) [extract]", len(ids), cfg.max_len, "max_len")
    params = _host(params)
    weights = _gpt_weights(gpt.GPT(cfg), params["gpt"], ids, extra=params["special_tokens"])
    names = {gpt_classifier.delimiter_id(cfg.vocab_size): "[delim]",
             gpt_classifier.extract_id(cfg.vocab_size): "[extract]"}
    tokens = [names.get(i) or tokenizer.id_to_token(i) for i in ids]
    return [AttentionMaps("decoder_self", weights, tokens, tokens)]


def translation_maps(model: encoder_decoder.EncoderDecoder, params: Any, tokenizer: Any,
                     source: str, target: str | None = None) -> list[AttentionMaps]:
    """The encoder-decoder's three kinds of attention for one sentence pair.

    Args:
      model, params: the EncoderDecoder and its parameters.
      tokenizer: its (joint) SentencePiece tokenizer.
      source: the sentence to translate; encoded as x [EOS], as zoo.data.readers.parallel does.
      target: its translation; None translates greedily (zoo.models.encoder_decoder.translate).

    Returns:
      AttentionMaps for 'encoder_self' [L_enc, H, S, S] (source tokens on both axes),
      'decoder_self' [L_dec, H, T, T] and 'cross' [L_dec, H, T, S], whose queries are the
      decoder input [BOS] y.
    """
    cfg = model.config
    source_ids = [*_encode(tokenizer, "source", source), cfg.eos_id]
    _check_length("source [EOS]", len(source_ids), cfg.max_len, "max_len")
    _check_vocab("source", source_ids, cfg.source_vocab)
    params = _host(params)
    model = model.clone(parent=None, incremental=False)
    batch = np.asarray([source_ids], np.int32)
    if target is None:
        out = encoder_decoder.translate(model, params, batch, method="greedy")
        tokens, length = jax.device_get((out.tokens[0], out.lengths[0]))
        target_ids = [int(t) for t in tokens[:int(length)]]
        if target_ids and target_ids[-1] == cfg.eos_id:
            target_ids = target_ids[:-1]
    else:
        target_ids = _encode(tokenizer, "target", target)
    decoder_ids = [cfg.bos_id, *target_ids]
    _check_length("[BOS] target", len(decoder_ids), cfg.max_len, "max_len")
    _check_vocab("target", decoder_ids, cfg.target_vocab)
    _, state = model.apply({"params": params}, batch, np.asarray([decoder_ids], np.int32),
                           sow_weights=True, mutable=["intermediates"])
    found = encoder_decoder.attention_weights(state["intermediates"])
    src, tgt = _pieces(tokenizer, source_ids), _pieces(tokenizer, decoder_ids)
    axes = {"encoder_self": (src, src), "decoder_self": (tgt, tgt), "cross": (tgt, src)}
    return [AttentionMaps(kind, np.asarray(found[kind], np.float32)[:, 0], *axes[kind])
            for kind in axes]


def _greedy_rnn(model: seq2seq.Seq2Seq, params: Any, source: np.ndarray, max_len: int
                ) -> list[int]:
    """The RNN translator's greedy output for one source [1, S]: its tokens after [BOS], [EOS]
    included when it stopped by itself."""
    cfg = model.config
    decoder = seq2seq.seq2seq_decoder(model, params, source, max_len=max_len)
    out = decoding.greedy(decoder, np.asarray([[cfg.bos_id]], np.int32), max_len=max_len,
                          eos_id=cfg.eos_id, pad_id=cfg.pad_id)
    tokens, length = jax.device_get((out.tokens[0], out.lengths[0]))
    return [int(t) for t in tokens[1:int(length)]]


def alignment_maps(model: seq2seq.Seq2Seq, params: Any, tokenizer: Any, source: str,
                   target: str | None = None, max_len: int | None = None
                   ) -> list[AttentionMaps]:
    """The RNN encoder-decoder's alignment (the picture in the course slides on
    sequence generation and attention): at each decoder step, the
    distribution alpha the model computed over the source positions (Bahdanau's additive or
    Luong's dot / general score), sown by the model itself (Seq2Seq.decode, sow_weights) in a
    teacher-forced forward.

    Args:
      model, params: the Seq2Seq (attention other than 'none') and its parameters.
      tokenizer: its joint SentencePiece tokenizer.
      source: the sentence to translate; encoded as x [EOS], as zoo.data.readers.parallel does.
      target: its translation; None translates greedily first, into at most max_len - 1 tokens
        (default |x| + 50, zoo.models.encoder_decoder.translate's limit).

    Returns:
      [AttentionMaps('alignment', [1, 1, T, S], produced tokens, source tokens)]: row t is the
      step that produced target token t (y [EOS] for a given target; the greedy output, [EOS]
      included when it stopped by itself) and holds the weights that step's output read.
    """
    cfg = model.config
    if cfg.attention == "none":
        raise no_maps(type(model).__name__, SEQ2SEQ_WITHOUT_ATTENTION)
    source_ids = [*_encode(tokenizer, "source", source), cfg.eos_id]
    _check_vocab("source", source_ids, cfg.vocab_size)
    params = _host(params)
    batch = np.asarray([source_ids], np.int32)
    if target is None:
        produced = _greedy_rnn(model, params, batch, max_len or 1 + len(source_ids) + 50)
    else:
        produced = [*_encode(tokenizer, "target", target), cfg.eos_id]
    _check_vocab("target", produced, cfg.vocab_size)
    # Step t reads y_{t-1} (y_0 = BOS) and produces y_t: the decoder input is the output shifted.
    decoder_ids = [cfg.bos_id, *produced[:-1]]
    _, state = model.apply({"params": params}, batch, np.asarray([decoder_ids], np.int32),
                           sow_weights=True, mutable=["intermediates"])
    alpha = np.asarray(seq2seq.attention_weights(state["intermediates"]), np.float32)[0]
    return [AttentionMaps("alignment", alpha[None, None], _pieces(tokenizer, produced),
                          _pieces(tokenizer, source_ids))]


def maps_for_model(model: nn.Module, params: Any, tokenizer: Any, text: str, *,
                   text_b: str | None = None, target: str | None = None
                   ) -> list[AttentionMaps]:
    """The attention maps of whatever model this is, for one input.

    Args:
      model: an EncoderDecoder, an RNN Seq2Seq with attention, a GPT, a GPTForClassification, a
        BertModel, or a BERT head model (BertForPreTraining, BertForQuestionAnswering,
        BertForSequenceClassification: params['bert'] is its encoder).
      params: the model's parameters.
      tokenizer: its tokenizer.
      text: the input (the source sentence for translation).
      text_b: BERT and the GPT classifier only: the second segment (text pair, or the option of
        a multiple-choice row).
      target: translation only: the target sentence (None: translate greedily).

    Raises:
      ConfigError: a model without attention maps (ELMo, NNLM, word2vec, the RNN LM, seq2seq
        without attention, ...), or an argument the model does not take.
    """
    name = type(model).__name__
    is_bert = isinstance(getattr(model, "config", None), bert.BertConfig)
    is_classifier = isinstance(model, gpt_classifier.GPTForClassification)
    if text_b is not None and not (is_bert or is_classifier):
        raise ConfigError(f"text_b: only BERT models and the GPT classifier take a second "
                          f"segment, not {name}")
    translators = (encoder_decoder.EncoderDecoder, seq2seq.Seq2Seq)
    if target is not None and not isinstance(model, translators):
        raise ConfigError(f"target: only encoder-decoder (translation) models take a target, not "
                          f"{name}")
    if isinstance(model, encoder_decoder.EncoderDecoder):
        return translation_maps(model, params, tokenizer, text, target)
    if isinstance(model, seq2seq.Seq2Seq):
        return alignment_maps(model, params, tokenizer, text, target)
    if isinstance(model, gpt.GPT):
        return gpt_maps(model, params, tokenizer, text)
    if is_classifier:
        return gpt_classifier_maps(model, params, tokenizer, text, text_b)
    if isinstance(model, bert.BertModel):
        return bert_maps(model.config, params, tokenizer, text, text_b)
    params = nn.unbox(params)
    if is_bert and "bert" in params:
        return bert_maps(model.config, params["bert"], tokenizer, text, text_b)
    raise no_maps(name, NO_MAPS.get(_MODEL_TASKS.get(name), "this model"))
