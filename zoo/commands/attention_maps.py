"""Attention heat maps per layer and head, for one input, from any checkpoint that has them.

The Wenzhou University Transformer lecture and the lecture notes from NNLM to BERT show what one
encoder layer's heads do with "The animal didn't cross the street because it was too tired":
encoding "it", one head attends mostly to "The animal", another to "tired". This command draws the
same thing for our models: every layer (rows) and head (columns) as a query x key heat map, the
tokens on both axes, so the row of "it" in each panel is that figure's picture for that head. The
classic picture of the course slides on sequence generation and attention, the RNN translator's
alignment of each target word with the source words, is drawn the same way (one panel).

The families that have attention weights, and what is drawn (configs/ naming their jobs):

* BERT (configs/bert_pretrain.py, classify.py, squad.py: a bare BertModel or any model holding
  the encoder as params['bert']): the encoder's self-attention over [CLS] a [SEP] (b [SEP]).
* GPT (configs/gpt.py): the decoder's causal self-attention over [BOS] text (zero above the
  diagonal).
* The GPT classifier (configs/gpt_classify.py): its GPT subtree's causal self-attention over the
  classifier's own input, [start] text ([delim] text_b) [extract]; the [extract] row is what
  the classification head reads.
* Transformer translation (configs/translate.py, an EncoderDecoder): encoder self-attention over
  the source (x [EOS]), decoder self-attention over the decoder input [BOS] y, and
  cross-attention from each decoder position to the source; decoder row t is the position that
  reads y_t (y_0 = BOS) and predicts y_{t+1}.
* RNN seq2seq with attention (configs/rnn_translate.py, attention=additive (Bahdanau), dot or
  general (Luong)): the 'alignment', one map of decoder step x source position: row t is the
  distribution alpha_t the model sowed for the step that produced target token t (the last
  row, [EOS]'s, when the translation ended), the tokens of Bahdanau et al.'s figure.

Without a target, both translators translate greedily first (the command prints `translation:
...`) and one teacher-forced forward over that translation sows the maps.

ELMo (configs/elmo.py), the NNLM (nnlm.py), word2vec (word2vec.py), the RNN language model
(rnnlm.py), the feature classifier (feature_classify.py) and RNN seq2seq with attention=none
have no attention maps: the command says so in one line, before reading any checkpoint.

The weights are what the model computed: rows are softmax distributions over the keys a query
may see (attention dropout is off: deterministic forward). Reading them out of a model is
zoo.eval.attention_maps' (maps_for_model: a library call, no files); drawing is
zoo.commands.attention_plot's.

Command line (one PNG per kind under --out, their paths printed):

    python -m zoo.commands.attention_maps --config=configs/gpt.py:size=tiny --workdir=/tmp/gpt \\
        --text="The animal didn't cross the street because it was too tired"
    python -m zoo.commands.attention_maps --config=configs/rnn_translate.py:attention=general \\
        --workdir=/tmp/s2s --text="二十三减四十五"
    python -m zoo.commands.attention_maps --pretrained=bert-base-uncased/ --text="..." \\
        --text_b="..." --out=/tmp/maps --layers=10,11 --heads=0,1,2
"""

import sys
from collections.abc import Sequence
from typing import Any

import flax.linen as nn

from zoo import errors, paths
from zoo.commands.attention_plot import draw
from zoo.errors import ConfigError, MissingFileError
from zoo.eval.attention_maps import (
    KINDS,
    NO_MAPS,
    SEQ2SEQ_WITHOUT_ATTENTION,
    AttentionMaps,
    alignment_maps,
    bert_maps,
    check_text,
    gpt_classifier_maps,
    gpt_maps,
    maps_for_model,
    no_maps,
    translation_maps,
)
from zoo.models import encoder_decoder, seq2seq

# The extraction lived here before it moved to zoo.eval.attention_maps: its public
# names stay importable from this path.
__all__ = ["AttentionMaps", "KINDS", "alignment_maps", "bert_maps", "gpt_classifier_maps",
           "gpt_maps", "main", "maps_for_model", "translation_maps"]


def _flags(argv: Sequence[str]):
    """Parses argv with flags of our own (not absl's global FLAGS), so main can run more than
    once in a process and beside train.py's --config/--workdir."""
    from absl import flags
    from ml_collections import config_flags

    from zoo.commands import cli

    fv = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config", None, "configs/<job>.py[:variant] of the run in --workdir; override keys with "
        "--config.a.b=value exactly as the run did", lock_config=True, flag_values=fv,
        sys_argv=list(argv))  # the overrides are read from argv, not sys.argv
    flags.DEFINE_string("workdir", None, "The trained run whose latest checkpoint to read.",
                        flag_values=fv)
    flags.DEFINE_string("pretrained", None, "Instead of --config/--workdir: a Hugging Face "
                        "BERT / GPT-2 or google-research/bert directory (zoo.convert.hf).",
                        flag_values=fv)
    flags.DEFINE_string("text", None, "The input (the source sentence for translation).",
                        flag_values=fv)
    flags.DEFINE_string("text_b", None, "BERT and the GPT classifier: the second segment.",
                        flag_values=fv)
    flags.DEFINE_string("target", None, "Translation: the target sentence (default: the model's "
                        "greedy translation).", flag_values=fv)
    flags.DEFINE_string("tokenizer", None, "A .model or vocab.txt replacing the checkpoint's "
                        "tokenizer (needed for GPT-2 directories, which zoo cannot tokenize).",
                        flag_values=fv)
    flags.DEFINE_string("out", None, "Output directory (default <workdir>/attention, or "
                        "./attention with --pretrained).", flag_values=fv)
    flags.DEFINE_list("layers", None, "Layer indices to draw (default all).", flag_values=fv)
    flags.DEFINE_list("heads", None, "Head indices to draw (default all).", flag_values=fv)
    cli.exit_if_help(fv, argv, __doc__)
    cli.parse_flags(fv, argv)  # a mistake is one UserError, not absl's traceback
    return fv


def _check_family(config, where: str) -> None:
    """Refuses a job whose model has no attention maps, before any workdir, data or checkpoint
    is read (maps_for_model says the same of the model itself)."""
    task = config.get("task")
    if task == "rnn_translate" and config.get("model", {}).get("attention") == "none":
        raise no_maps(where, SEQ2SEQ_WITHOUT_ATTENTION)
    if task in NO_MAPS:
        raise no_maps(where, NO_MAPS[task])


def _from_workdir(config, workdir: str) -> tuple[nn.Module, Any, Any]:
    """The task's model and tokenizer and the latest checkpoint's params."""
    from zoo.commands import jobs
    from zoo.checkpoints.checkpoint import Checkpointer

    # Checked before building anything: build() and Checkpointer create directories.
    paths.check_remote(workdir, "--workdir")
    if not paths.as_path(workdir).is_dir():
        raise MissingFileError(f"--workdir={workdir} does not exist; give the workdir of a "
                               "trained run")
    directory = paths.join(workdir, "checkpoints")
    checkpointer = Checkpointer(workdir) if paths.as_path(directory).is_dir() else None
    if checkpointer is None or checkpointer.latest_step() is None:
        raise MissingFileError(
            f"--workdir={workdir} holds no checkpoint ({directory}); train first with "
            f"`python train.py --config=... --workdir={workdir}`")
    setup = jobs.build(config, workdir)
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


def _translation(model: nn.Module, all_maps: list[AttentionMaps], tokenizer: Any) -> str:
    """The target the maps were drawn for, as text (the greedy translation without --target)."""
    maps = next(m for m in all_maps if m.kind in ("cross", "alignment"))
    # cross: rows are the decoder inputs [BOS] y; alignment: the tokens produced, y ([EOS]).
    pieces = maps.query_tokens[1:] if maps.kind == "cross" else maps.query_tokens
    ids = [tokenizer.token_to_id(t) for t in pieces]
    if ids and ids[-1] == model.config.eos_id:
        ids = ids[:-1]
    return tokenizer.decode(ids)


def main(argv: Sequence[str]) -> list[str]:
    """`python -m zoo.commands.attention_maps ...`: writes <out>/<kind>.png for each attention
    kind the model has, prints and returns their paths (see the module docstring for the
    flags)."""
    from ml_collections import config_flags

    fv = _flags(argv)
    if fv.pretrained and (fv.config is not None or fv.workdir):
        raise ConfigError("give either --pretrained=DIR or --config=... --workdir=DIR, not both")
    text = check_text("--text", fv.text)
    layers, heads = _indices("layers", fv.layers), _indices("heads", fv.heads)
    if fv.pretrained:
        from zoo.convert import hf

        model, params, _, tokenizer = hf.load_pretrained(fv.pretrained)
        out = fv.out or "attention"
    elif fv.config is not None and fv.workdir:
        _check_family(fv.config, f"--config={config_flags.get_config_filename(fv['config'])}")
        model, params, tokenizer = _from_workdir(fv.config, fv.workdir)
        out = fv.out or paths.join(fv.workdir, "attention")
    else:
        raise ConfigError("say which model: --config=configs/<job>.py --workdir=DIR (a trained "
                          "run) or --pretrained=DIR (a Hugging Face or google-research directory)")
    if fv.tokenizer:
        from zoo.data.tokenizers import base as tokenizers

        tokenizer = tokenizers.load_tokenizer(fv.tokenizer)
    all_maps = maps_for_model(model, params, tokenizer, text, text_b=fv.text_b,
                              target=fv.target)
    if isinstance(model, (encoder_decoder.EncoderDecoder, seq2seq.Seq2Seq)) and fv.target is None:
        print(f"translation: {_translation(model, all_maps, tokenizer)}", flush=True)
    written = []
    for maps in all_maps:
        try:
            path = draw(maps, paths.join(out, f"{maps.kind}.png"), layers=layers, heads=heads)
        except OSError as e:  # a file in the way, no permission, a full disk
            raise ConfigError(f"--out={out} cannot be written ({e}); give a directory you can "
                              "write") from e
        print(path, flush=True)
        written.append(path)
    return written


if __name__ == "__main__":
    from absl import logging

    logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
    with errors.reported("zoo.commands.attention_maps"):
        main(sys.argv)
