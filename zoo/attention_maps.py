"""Attention heat maps per layer and head, for one input, from any checkpoint.

Seeds 000 and 001 show what one encoder layer's heads do with "The animal didn't cross the street
because it was too tired": encoding "it", one head attends mostly to "The animal", another to
"tired". This module draws the same thing for our models: every layer (rows) and head (columns)
as a query x key heat map, the tokens on both axes, so the row of "it" in each panel is that
figure's picture for that head.

* BERT (any model holding the encoder as params['bert'], or a bare BertModel): the encoder's
  self-attention over [CLS] a [SEP] (b [SEP]).
* GPT: the decoder's causal self-attention over [BOS] text (zero above the diagonal).
* EncoderDecoder (translation): encoder self-attention over the source (x [EOS]), decoder
  self-attention over the decoder input [BOS] y, and cross-attention from each decoder position
  to the source. Without a target the model translates greedily first; then one teacher-forced
  forward over [BOS] y sows the maps, so decoder row t is the position that reads y_t (y_0 =
  BOS) and predicts y_{t+1}.

The weights are what the model computed: rows are softmax distributions over the keys a query
may see (attention dropout is off: deterministic forward).

Command line (one PNG per kind under --out, their paths printed):

    python -m zoo.attention_maps --config=configs/gpt.py:size=tiny --workdir=/tmp/gpt \\
        --text="The animal didn't cross the street because it was too tired"
    python -m zoo.attention_maps --pretrained=bert-base-uncased/ --text="..." --text_b="..." \\
        --out=/tmp/maps --layers=10,11 --heads=0,1,2
"""

import dataclasses
import functools
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from zoo import errors
from zoo.errors import ConfigError, MissingFileError
from zoo.models import bert, gpt
from zoo.models import transformer as seq2seq

KINDS = ("encoder_self", "decoder_self", "cross")
_TITLES = {
    "encoder_self": "encoder self-attention",
    "decoder_self": "decoder self-attention (causal)",
    "cross": "cross-attention (decoder query -> source key)",
}
# Families that cover CJK and other scripts DejaVu Sans lacks (the synthetic translation task's
# sources are Chinese); whichever of them is installed becomes a fallback font of the labels.
_FALLBACK_FONTS = ("Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans SC", "Source Han Sans SC",
                   "WenQuanYi Zen Hei", "WenQuanYi Micro Hei", "Droid Sans Fallback",
                   "AR PL UMing CN", "SimHei", "Microsoft YaHei", "PingFang SC", "Arial Unicode MS")


@dataclasses.dataclass
class AttentionMaps:
    """One attention kind of one input.

    Attributes:
      kind: 'encoder_self', 'decoder_self' or 'cross'.
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


# ---- extraction --------------------------------------------------------------------------------


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


def _check_text(name: str, text: str | None) -> str:
    if text is None or not str(text).strip():
        raise ConfigError(f"{name}: the text is empty; give the sentence whose attention to draw "
                          f"(e.g. {name}=\"The animal didn't cross the street because it was too "
                          "tired\")")
    return str(text)


def _encode(tokenizer: Any, name: str, text: str) -> list[int]:
    if tokenizer is None:
        raise ConfigError(
            "this checkpoint has no tokenizer (a GPT-2 directory's byte-level BPE is not read; "
            "see zoo.hf): pass --tokenizer=<a .model or vocab.txt of the model's vocabulary>"
        )
    ids = list(tokenizer.encode(_check_text(name, text)))
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
      tokenizer: the model's tokenizer (zoo.data.tokenizers.Tokenizer).
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
    model = model.clone(parent=None, decode=False)
    _, state = model.apply({"params": _host(params)}, np.asarray([ids], np.int32),
                           sow_weights=True, mutable=["intermediates"])
    weights = _stacked(state["intermediates"]["h"], "self_attention")[:, 0]
    tokens = _pieces(tokenizer, ids)
    return [AttentionMaps("decoder_self", weights, tokens, tokens)]


def translation_maps(model: seq2seq.EncoderDecoder, params: Any, tokenizer: Any, source: str,
                     target: str | None = None) -> list[AttentionMaps]:
    """The encoder-decoder's three kinds of attention for one sentence pair.

    Args:
      model, params: the EncoderDecoder and its parameters.
      tokenizer: its (joint) SentencePiece tokenizer.
      source: the sentence to translate; encoded as x [EOS], as zoo.data.parallel does.
      target: its translation; None translates greedily (zoo.models.transformer.translate).

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
        out = seq2seq.translate(model, params, batch, method="greedy")
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
    found = seq2seq.attention_weights(state["intermediates"])
    src, tgt = _pieces(tokenizer, source_ids), _pieces(tokenizer, decoder_ids)
    axes = {"encoder_self": (src, src), "decoder_self": (tgt, tgt), "cross": (tgt, src)}
    return [AttentionMaps(kind, np.asarray(found[kind], np.float32)[:, 0], *axes[kind])
            for kind in KINDS]


def maps_for_model(model: nn.Module, params: Any, tokenizer: Any, text: str, *,
                   text_b: str | None = None, target: str | None = None
                   ) -> list[AttentionMaps]:
    """The attention maps of whatever model this is, for one input.

    Args:
      model: an EncoderDecoder, a GPT, a BertModel, or a BERT head model (BertForPreTraining,
        BertForQuestionAnswering, BertForSequenceClassification: params['bert'] is its encoder).
      params: the model's parameters.
      tokenizer: its tokenizer.
      text: the input (the source sentence for translation).
      text_b: BERT only: the second segment.
      target: translation only: the target sentence (None: translate greedily).
    """
    is_bert = isinstance(getattr(model, "config", None), bert.BertConfig)
    if text_b is not None and not is_bert:
        raise ConfigError(f"text_b: only BERT models take a second segment, not "
                          f"{type(model).__name__}")
    if target is not None and not isinstance(model, seq2seq.EncoderDecoder):
        raise ConfigError(f"target: only encoder-decoder (translation) models take a target, not "
                          f"{type(model).__name__}")
    if isinstance(model, seq2seq.EncoderDecoder):
        return translation_maps(model, params, tokenizer, text, target)
    if isinstance(model, gpt.GPT):
        return gpt_maps(model, params, tokenizer, text)
    if isinstance(model, bert.BertModel):
        return bert_maps(model.config, params, tokenizer, text, text_b)
    params = nn.unbox(params)
    if is_bert and "bert" in params:
        return bert_maps(model.config, params["bert"], tokenizer, text, text_b)
    raise TypeError(
        f"maps_for_model: no attention maps for {type(model).__name__}; supported are "
        "EncoderDecoder, GPT, BertModel and BERT models holding the encoder as params['bert']"
    )


# ---- drawing -----------------------------------------------------------------------------------


def _select(name: str, chosen: Sequence[int] | None, available: int) -> list[int]:
    if chosen is None:
        return list(range(available))
    chosen = [int(i) for i in chosen]
    bad = [i for i in chosen if not 0 <= i < available]
    if not chosen or bad:
        raise ConfigError(f"{name}={chosen}: choose indices in [0, {available}) (the model has "
                          f"{available} {name})")
    return chosen


@functools.lru_cache(maxsize=1)
def _fallback_families() -> tuple[str, ...]:
    from matplotlib import font_manager

    installed = {f.name for f in font_manager.fontManager.ttflist}
    return tuple(name for name in _FALLBACK_FONTS if name in installed)


def _uncovered(labels: Sequence[str], families: Sequence[str]) -> set[str]:
    """Label characters none of `families` can draw."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    covered: set[int] = set()
    for family in families:
        path = font_manager.findfont(font_manager.FontProperties(family=family),
                                     fallback_to_default=False)
        covered.update(FT2Font(path).get_charmap())
    return {c for label in labels for c in label if not c.isspace() and ord(c) not in covered}


def draw(maps: AttentionMaps, path: str, *, layers: Sequence[int] | None = None,
         heads: Sequence[int] | None = None) -> str:
    """Draws one PNG: a grid of heat maps, a row per layer and a column per head.

    Each panel is query (rows, top to bottom) x key (columns); the token labels are on the left
    column's and the bottom row's axes, one colour scale (0 to the largest weight shown) and
    colorbar for all panels. The PNG's text chunks record the grid: 'Layers' and 'Heads' (the
    indices drawn, comma-separated) and 'Panels' (their count).

    Args:
      maps: what to draw.
      path: the PNG to write (its directory is created).
      layers, heads: indices to draw (default all).

    Returns:
      path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = _select("layers", layers, maps.num_layers)
    heads = _select("heads", heads, maps.num_heads)
    rows, cols = len(layers), len(heads)
    shown = maps.weights[np.ix_(layers, heads)]  # (rows, cols, q, k)
    vmax = max(float(shown.max()), 1e-6)
    q, k = len(maps.query_tokens), len(maps.key_tokens)
    # Big enough that every token label has its own line of text.
    size = float(np.clip(0.2 * max(q, k) + 0.6, 1.8, 8.0))
    families = ["DejaVu Sans", *_fallback_families()]
    missing = _uncovered(maps.query_tokens + maps.key_tokens, families)
    if missing:
        warnings.warn(
            f"draw: no installed font has {''.join(sorted(missing))!r}; those labels show as "
            "boxes (install a font covering them, e.g. Noto Sans CJK for Chinese)", stacklevel=2)
    with plt.rc_context({"font.family": families, "font.size": 8}), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        fig, axes = plt.subplots(rows, cols, figsize=(cols * size + 1.5, rows * size + 1.0),
                                 squeeze=False, sharex=True, sharey=True, layout="constrained")
        image = None
        for r, layer in enumerate(layers):
            for c, head in enumerate(heads):
                ax = axes[r, c]
                image = ax.imshow(shown[r, c], cmap="viridis", vmin=0.0, vmax=vmax,
                                  aspect="auto", interpolation="nearest")
                ax.set_xticks(range(k), maps.key_tokens, rotation=90)
                ax.set_yticks(range(q), maps.query_tokens)
                ax.tick_params(length=0)
                ax.label_outer()
                if r == 0:
                    ax.set_title(f"head {head}")
                if c == 0:
                    ax.set_ylabel(f"layer {layer}\nquery", fontsize=9)
                if r == rows - 1:
                    ax.set_xlabel("key")
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=min(1.0, 0.9 / rows + 0.1),
                     label="attention weight")
        fig.suptitle(_TITLES[maps.kind])
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=100, metadata={
            "Title": _TITLES[maps.kind],
            "Layers": ",".join(map(str, layers)),
            "Heads": ",".join(map(str, heads)),
            "Panels": str(rows * cols),
        })
        plt.close(fig)
    return path


# ---- command line ------------------------------------------------------------------------------


def _flags(argv: Sequence[str]):
    """Parses argv with flags of our own (not absl's global FLAGS), so main can run more than
    once in a process and beside train.py's --config/--workdir."""
    from absl import flags
    from ml_collections import config_flags

    from zoo import cli

    fv = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config", None, "configs/<job>.py[:variant] of the run in --workdir; override keys with "
        "--config.a.b=value exactly as the run did", lock_config=True, flag_values=fv,
        sys_argv=list(argv))  # the overrides are read from argv, not sys.argv
    flags.DEFINE_string("workdir", None, "The trained run whose latest checkpoint to read.",
                        flag_values=fv)
    flags.DEFINE_string("pretrained", None, "Instead of --config/--workdir: a Hugging Face "
                        "BERT / GPT-2 or google-research/bert directory (zoo.hf).",
                        flag_values=fv)
    flags.DEFINE_string("text", None, "The input (the source sentence for translation).",
                        flag_values=fv)
    flags.DEFINE_string("text_b", None, "BERT: the second segment.", flag_values=fv)
    flags.DEFINE_string("target", None, "Translation: the target sentence (default: the model's "
                        "greedy translation).", flag_values=fv)
    flags.DEFINE_string("tokenizer", None, "A .model or vocab.txt replacing the checkpoint's "
                        "tokenizer (needed for GPT-2 directories, which zoo cannot tokenize).",
                        flag_values=fv)
    flags.DEFINE_string("out", None, "Output directory (default <workdir>/attention, or "
                        "./attention with --pretrained).", flag_values=fv)
    flags.DEFINE_list("layers", None, "Layer indices to draw (default all).", flag_values=fv)
    flags.DEFINE_list("heads", None, "Head indices to draw (default all).", flag_values=fv)
    cli.parse_flags(fv, argv)  # a mistake is one UserError, not absl's traceback
    return fv


def _from_workdir(config, workdir: str) -> tuple[nn.Module, Any, Any]:
    """The task's model and tokenizer and the latest checkpoint's params."""
    from zoo.train import loop
    from zoo.train.checkpoint import Checkpointer

    # Checked before building anything: build() and Checkpointer create directories.
    if not os.path.isdir(workdir):
        raise MissingFileError(f"--workdir={workdir} does not exist; give the workdir of a "
                               "trained run")
    directory = os.path.join(workdir, "checkpoints")
    checkpointer = Checkpointer(workdir) if os.path.isdir(directory) else None
    if checkpointer is None or checkpointer.latest_step() is None:
        raise MissingFileError(
            f"--workdir={workdir} holds no checkpoint ({directory}); train first with "
            f"`python train.py --config=... --workdir={workdir}`")
    setup = loop.build(config, workdir)
    try:
        params = checkpointer.restore_params(setup.state.params)
    finally:
        checkpointer.close()
    return setup.task.model, params, setup.task.tokenizer


def _indices(name: str, values: Sequence[str] | None) -> list[int] | None:
    if values is None:
        return None
    try:
        return [int(v) for v in values]
    except ValueError:
        raise ConfigError(f"--{name}={','.join(values)}: give comma-separated integers, e.g. "
                          f"--{name}=0,1") from None


def main(argv: Sequence[str]) -> list[str]:
    """`python -m zoo.attention_maps ...`: writes <out>/<kind>.png for each attention kind the
    model has, prints and returns their paths (see the module docstring for the flags)."""
    fv = _flags(argv)
    if fv.pretrained and (fv.config is not None or fv.workdir):
        raise ConfigError("give either --pretrained=DIR or --config=... --workdir=DIR, not both")
    text = _check_text("--text", fv.text)
    layers, heads = _indices("layers", fv.layers), _indices("heads", fv.heads)
    if fv.pretrained:
        from zoo import hf

        model, params, _, tokenizer = hf.load_pretrained(fv.pretrained)
        out = fv.out or "attention"
    elif fv.config is not None and fv.workdir:
        model, params, tokenizer = _from_workdir(fv.config, fv.workdir)
        out = fv.out or os.path.join(fv.workdir, "attention")
    else:
        raise ConfigError("say which model: --config=configs/<job>.py --workdir=DIR (a trained "
                          "run) or --pretrained=DIR (a Hugging Face or google-research directory)")
    if fv.tokenizer:
        from zoo.data import tokenizers

        tokenizer = tokenizers.load_tokenizer(fv.tokenizer)
    all_maps = maps_for_model(model, params, tokenizer, text, text_b=fv.text_b,
                              target=fv.target)
    if isinstance(model, seq2seq.EncoderDecoder) and fv.target is None:
        pieces = next(m.query_tokens for m in all_maps if m.kind == "cross")[1:]  # after [BOS]
        ids = [tokenizer.token_to_id(t) for t in pieces]
        print(f"translation: {tokenizer.decode(ids)}", flush=True)
    paths = []
    for maps in all_maps:
        try:
            path = draw(maps, os.path.join(out, f"{maps.kind}.png"), layers=layers, heads=heads)
        except OSError as e:  # a file in the way, no permission, a full disk
            raise ConfigError(f"--out={out} cannot be written ({e}); give a directory you can "
                              "write") from e
        print(path, flush=True)
        paths.append(path)
    return paths


if __name__ == "__main__":
    from absl import logging

    logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
    with errors.reported("zoo.attention_maps"):
        main(sys.argv)
