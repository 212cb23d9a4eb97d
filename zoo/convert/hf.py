"""Hugging Face checkpoint directories <-> zoo models: `load_pretrained` and `save_pretrained`.

A Hugging Face directory holds config.json, the weights (model.safetensors, or the older
pytorch_model.bin; either may be sharded with a *.index.json) and the tokenizer files. The
config's `architectures` (else its model_type and the weights' names) picks the zoo model:

  BertModel                      zoo.models.bert.BertModel
  BertForPreTraining             zoo.models.bert.BertForPreTraining
  BertForQuestionAnswering       zoo.models.bert.BertForQuestionAnswering
  BertForSequenceClassification  zoo.models.bert.BertForSequenceClassification
  GPT2LMHeadModel, GPT2Model     zoo.models.gpt.GPT (its output layer is tied to wte, so the
                                 bare GPT2Model loads as the full language model)

The tensors go through the rename tables of zoo.convert.bert / zoo.convert.gpt2. safetensors are
read with safetensors.numpy (no torch needed); only pytorch_model.bin needs torch, and is read
with `torch.load(weights_only=True)`.

Tokenizers: BERT's vocab.txt (or, as transformers v5 writes it, a WordPiece tokenizer.json)
becomes a zoo WordPieceTokenizer with the lowercasing / accent / CJK options of
tokenizer_config.json (tokenizer.json's normalizer). GPT-2's vocab.json + merges.txt become
zoo's byte-level BPE (zoo.data.tokenizers.gpt2_bpe.GPT2Tokenizer, the ids of transformers'
GPT2Tokenizer).

google-research/bert directories load too (no TensorFlow needed): bert_config.json (or a
config.json) + one TF checkpoint (bert_model.ckpt.index + .data-*, any prefix, e.g. a training
run's model.ckpt-10000) + vocab.txt. zoo.convert.tf_checkpoint reads the checkpoint, its
optimizer slots and global_step are skipped, and zoo.convert.bert.params_from_tf_variables
converts the rest; the model (pretraining, SQuAD or classifier head, or none) follows from the
variable names. google-research has no tokenizer_config.json (do_lower_case is a command-line
flag there): the vocabulary decides, cased when any token but the [bracketed] specials has an
uppercase letter (as its cased_* vocabularies do). A directory with HF weights is read as HF's.

Example:
  model, params, config, tokenizer = load_pretrained("bert-base-uncased-squad/")
  start, end = model.apply({"params": params}, ids, types, mask)
  save_pretrained("out/", config, params, tokenizer)   # transformers' from_pretrained reads it
"""

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import flax.linen as nn
from safetensors import numpy as safetensors_numpy

from zoo import paths
from zoo.convert import bert as bert_convert
from zoo.convert import gpt2 as gpt2_convert
from zoo.convert import tf_checkpoint
from zoo.convert.hf_files import (CONFIG_FILE, GOOGLE_CONFIG_FILE, SAFETENSORS_FILE,
                                  SUPPORTED_ARCHITECTURES, TF_FILES, TOKENIZER_CONFIG_FILE,
                                  TOKENIZER_FILE, TORCH_FILE, VOCAB_FILE, WEIGHTS_FILES,
                                  bert_head_of)
from zoo.convert.hf_save import save_pretrained
from zoo.data.tokenizers import gpt2_bpe
from zoo.data.tokenizers.wordpiece import CONTINUATION, WordPieceTokenizer
from zoo.errors import DataError, MissingFileError, UserError
from zoo.models import bert, gpt

# save_pretrained (hf_save.py) and the directory's names (hf_files.py) are importable from here,
# their documented path.
__all__ = ["CONFIG_FILE", "GOOGLE_CONFIG_FILE", "SAFETENSORS_FILE", "SUPPORTED_ARCHITECTURES",
           "TOKENIZER_CONFIG_FILE", "TOKENIZER_FILE", "TORCH_FILE", "VOCAB_FILE",
           "load_pretrained", "save_pretrained"]

# ---- loading -----------------------------------------------------------------------------------


def pretrained_params(path: str | os.PathLike) -> dict[str, Any]:
    """The params of a checkpoint directory (load_pretrained's, without the model and the
    tokenizer): the reader zoo.commands.jobs hands to the trainer's config.train.init_from."""
    return load_pretrained(path)[1]


def load_pretrained(path: str | os.PathLike, **overrides: Any
                    ) -> tuple[nn.Module, dict[str, Any], Any,
                               WordPieceTokenizer | gpt2_bpe.GPT2Tokenizer | None]:
    """Loads a Hugging Face BERT or GPT-2 checkpoint directory, or a google-research/bert
    TensorFlow one, as a zoo model.

    Args:
      path: the directory: config.json, model.safetensors or pytorch_model.bin, tokenizer
        files; or google-research's bert_config.json, <prefix>.index + <prefix>.data-*,
        vocab.txt (see the module docstring).
      **overrides: config choices the checkpoint does not make
        (zoo.models.runtime_fields.RUN_CHOICES), as in zoo.convert.bert.config_from_hf /
        zoo.convert.gpt2.config_from_hf.

    Returns:
      (model, params, config, tokenizer): `model.apply({"params": params}, ...)` runs it;
      params are numpy arrays in config.param_dtype; config is a BertConfig or GPTConfig;
      tokenizer a WordPieceTokenizer for BERT, a GPT2Tokenizer (byte-level BPE) for GPT-2,
      None when the directory has no tokenizer files.

    Raises:
      FileNotFoundError: no such directory, no config.json (bert_config.json) or no weights
        file, or a TF checkpoint's missing .data shard.
      ValueError: an unsupported model_type / architecture (the message lists the supported
        ones), a config our models cannot represent, weights that are corrupt or do not fit
        the config (the message names the file), or several TF checkpoints in one directory.
      ImportError: torch is not installed and the weights are a pytorch_model.bin.
    """
    if paths.is_remote(path):
        return _load_remote(os.fspath(path), overrides)
    root = Path(path)
    if not root.is_dir():
        raise MissingFileError(
            f"load_pretrained: {root} is not a directory; give a Hugging Face checkpoint "
            f"directory ({CONFIG_FILE} + {SAFETENSORS_FILE} or {TORCH_FILE})"
        )
    if not any((root / name).is_file() for name in WEIGHTS_FILES):
        tf_indexes = tf_checkpoint.find_tf_checkpoints(root)
        if tf_indexes:
            return _load_google_bert(root, tf_indexes, overrides)
        if (root / GOOGLE_CONFIG_FILE).is_file() and not (root / CONFIG_FILE).is_file():
            raise MissingFileError(
                f"load_pretrained: {root} has google-research/bert's {GOOGLE_CONFIG_FILE} but no "
                "TensorFlow checkpoint (<prefix>.index + <prefix>.data-*, e.g. "
                "bert_model.ckpt.index) and no Hugging Face weights"
            )
    config_path = root / CONFIG_FILE
    hf_config = _read_json(config_path, "the model's Hugging Face config")
    family, head = _architecture(hf_config, config_path)
    state_dict, weights = _read_weights(root)

    if family == "gpt2":
        config = _wrap(config_path, gpt2_convert.config_from_hf, hf_config, **overrides)
        params = _wrap(weights, gpt2_convert.params_from_hf, state_dict, config)
        return gpt.GPT(config), params, config, _gpt2_tokenizer(root)

    config = _wrap(config_path, bert_convert.config_from_hf, hf_config, **overrides)
    num_labels = (bert_convert.num_labels_from_hf(hf_config)
                  if head == "sequence_classification" else None)
    # heads None (no architectures in config.json): the head the weights hold.
    params = _wrap(weights, bert_convert.params_from_hf, state_dict, config,
                   heads=False if head == "none" else head, num_labels=num_labels)
    return _bert_model(config, params, head, hf_config), params, config, _bert_tokenizer(root)


# What load_pretrained reads besides the weights: the configs and every tokenizer's files.
_SMALL_FILES = (CONFIG_FILE, GOOGLE_CONFIG_FILE, VOCAB_FILE, TOKENIZER_FILE,
                TOKENIZER_CONFIG_FILE, gpt2_bpe.VOCAB_FILE, gpt2_bpe.MERGES_FILE)


def _load_remote(path: str, overrides: Mapping[str, Any]):
    """load_pretrained of a gs:// directory. Its readers open local files (safetensors, torch,
    the TF bundle reader), so the files they read are downloaded to a temporary directory
    that goes once everything returned (all in memory) is made. Only those: a hub directory
    often holds its weights three or four times over (model.safetensors, pytorch_model.bin,
    tf_model.h5, flax_model.msgpack, onnx/), and one copy is read."""
    names = paths.list_names(path)
    if not names:
        raise MissingFileError(f"load_pretrained: {path} is not a directory (no files directly "
                               "under it); give a Hugging Face checkpoint directory")
    weights = _weights_to_read(path, names)
    if not weights and any(name in names for name in TF_FILES):
        raise _no_weights_error(path, [name for name in TF_FILES if name in names])
    wanted = [name for name in _SMALL_FILES if name in names] + weights
    with paths.local_tree(path, wanted) as local:
        return load_pretrained(local, **overrides)


def _weights_to_read(path: str, names: list[str]) -> list[str]:
    """The weight files of the directory `path` holding `names` that load_pretrained reads:
    the first of WEIGHTS_FILES (HF's preference) with the shards its index names, else every
    TensorFlow checkpoint's .index and .data-* files (several are an error the reader names);
    [] when it has none."""
    found = [name for name in WEIGHTS_FILES if name in names]
    if not found:
        return [name for name in names if name.endswith(".index") or ".data-" in name]
    if not found[0].endswith(".index.json"):
        return found[:1]
    try:
        weight_map = json.loads(paths.read_bytes(paths.join(path, found[0]))).get("weight_map")
        shards = sorted({shard for shard in weight_map.values() if shard in names})
    except (ValueError, AttributeError, TypeError):
        shards = []  # a broken index: the local reader names what is wrong with it
    return found[:1] + shards


def _no_weights_error(root: str | Path, other: list[str]) -> MissingFileError:
    """No weights file in `root`, whose `other` (TF_FILES) weights zoo does not read."""
    hint = (f" It has {', '.join(other)}: Keras (TF2) / Flax weights are not read here; "
            "google-research/bert's TF1 checkpoints (<prefix>.index + <prefix>.data-*, "
            "through zoo.convert.bert.params_from_tf_variables) are." if other else "")
    return MissingFileError(
        f"load_pretrained: {root} has no weights file: expected {SAFETENSORS_FILE} or "
        f"{TORCH_FILE} (or a sharded *.index.json).{hint}")


def _gpt2_tokenizer(root: Path) -> gpt2_bpe.GPT2Tokenizer | None:
    """GPT-2's byte-level BPE from the directory's vocab.json + merges.txt; None without them."""
    if not all((root / name).is_file() for name in (gpt2_bpe.VOCAB_FILE, gpt2_bpe.MERGES_FILE)):
        return None
    return gpt2_bpe.GPT2Tokenizer.from_directory(str(root))


def _bert_model(config: bert.BertConfig, params: Mapping[str, Any], head: str | None,
                hf_config: Mapping[str, Any]) -> nn.Module:
    """The zoo BERT model of `head` (None: the head the params hold)."""
    if head is None:
        head = bert_head_of(params)
    if head == "none":
        return bert.BertModel(config)
    if head == "pretraining":
        return bert.BertForPreTraining(config)
    if head == "question_answering":
        return bert.BertForQuestionAnswering(config)
    return bert.BertForSequenceClassification(
        config, params["classifier"]["bias"].shape[0],
        dropout_rate=hf_config.get("classifier_dropout"),
    )


def _load_google_bert(root: Path, indexes: list[Path], overrides: Mapping[str, Any]
                      ) -> tuple[nn.Module, dict[str, Any], bert.BertConfig,
                                 WordPieceTokenizer | None]:
    """load_pretrained of a google-research/bert directory (see the module docstring)."""
    if len(indexes) > 1:
        raise DataError(
            f"load_pretrained: {root} holds {len(indexes)} TensorFlow checkpoints "
            f"({', '.join(p.name for p in indexes)}); keep one in the directory (e.g. the "
            "latest training step) or move the others out"
        )
    index = indexes[0]
    config_path = next((root / name for name in (GOOGLE_CONFIG_FILE, CONFIG_FILE)
                        if (root / name).is_file()), None)
    if config_path is None:
        raise MissingFileError(
            f"load_pretrained: {root} holds the TensorFlow checkpoint {index.name} but no "
            f"{GOOGLE_CONFIG_FILE} (or {CONFIG_FILE}) describing its model; add the "
            f"{GOOGLE_CONFIG_FILE} it was trained with"
        )
    hf_config = _read_json(config_path, "the model's BERT config")
    head = None  # google-research's bert_config.json names no model: the variables decide
    if hf_config.get("model_type") or hf_config.get("architectures"):
        family, head = _architecture(hf_config, config_path)
        if family != "bert":
            raise DataError(f"load_pretrained: {config_path} describes a {family} model, but "
                            f"TensorFlow checkpoints ({index.name}) are read for BERT only")
    config = _wrap(config_path, bert_convert.config_from_hf, hf_config, **overrides)
    try:
        # Adam slots and global_step would double or triple what is read, for nothing.
        names = [name for name in tf_checkpoint.list_tf_checkpoint(index)
                 if not bert_convert.TF_OPTIMIZER_VARIABLES.fullmatch(name)]
        variables = tf_checkpoint.read_tf_checkpoint(index, names)
    except FileNotFoundError as e:  # the reader's messages name the file
        raise MissingFileError(f"load_pretrained: {e}") from e
    except ValueError as e:
        raise _same_kind(e)(f"load_pretrained: {e}") from e
    num_labels = (bert_convert.num_labels_from_hf(hf_config)
                  if head == "sequence_classification" else None)
    params = _wrap(index, bert_convert.params_from_tf_variables, variables, config,
                   heads=False if head == "none" else head, num_labels=num_labels)
    vocab = root / VOCAB_FILE
    lowercase = None
    if vocab.is_file() and not (root / TOKENIZER_CONFIG_FILE).is_file():
        lowercase = not _vocab_is_cased(vocab)
    return (_bert_model(config, params, head, hf_config), params, config,
            _bert_tokenizer(root, lowercase))


def _vocab_is_cased(path: Path) -> bool:
    """Whether a vocab.txt keeps case: any token besides [PAD]-style specials with a letter
    that lowercasing changes."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            token = line.strip()
            if not (token.startswith("[") and token.endswith("]")) and token != token.lower():
                return True
    return False


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissingFileError(f"load_pretrained: {path} does not exist ({what})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"load_pretrained: {path} is not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise DataError(f"load_pretrained: {path} holds a {type(value).__name__}, not an object")
    return value


def _architecture(hf_config: Mapping[str, Any], config_path: Path) -> tuple[str, Any]:
    """(model_type, head: SUPPORTED_ARCHITECTURES' second item, None to detect it from the
    weights)."""
    supported = f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
    architectures = hf_config.get("architectures") or []
    arch = architectures[0] if architectures else None
    if arch is not None and arch not in SUPPORTED_ARCHITECTURES:
        raise DataError(f"load_pretrained: {config_path}: architecture {arch!r} is not "
                        f"supported; {supported}")
    model_type = hf_config.get("model_type") or (arch and SUPPORTED_ARCHITECTURES[arch][0])
    if model_type not in ("bert", "gpt2"):
        raise DataError(f"load_pretrained: {config_path}: model_type {model_type!r} is not "
                        f"supported (bert, gpt2); {supported}")
    if arch is None:  # a config without architectures: the weights' names decide
        return model_type, None if model_type == "bert" else True
    family, head = SUPPORTED_ARCHITECTURES[arch]
    if family != model_type:
        raise DataError(f"load_pretrained: {config_path}: architecture {arch!r} does not "
                        f"belong to model_type {model_type!r}")
    return family, head


def _wrap(where: Path | str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs), with the file named in any ValueError it raises."""
    try:
        return fn(*args, **kwargs)
    except ValueError as e:
        raise _same_kind(e)(f"load_pretrained: {where}: {e}") from e


def _same_kind(error: ValueError) -> type[ValueError]:
    """DataError for what the files got wrong; a plain ValueError (a bug) stays one."""
    return DataError if isinstance(error, UserError) else ValueError


def _read_weights(root: Path) -> tuple[dict[str, Any], str]:
    """(HF name -> array, the file(s) read) from the directory's weights file."""
    found = [name for name in WEIGHTS_FILES if (root / name).is_file()]
    if not found:
        raise _no_weights_error(root, [name for name in TF_FILES if (root / name).exists()])
    name = found[0]
    if not name.endswith(".index.json"):
        return _read_weights_file(root / name), str(root / name)
    index_path = root / name
    index = _read_json(index_path, "the index of a sharded checkpoint")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise DataError(f"load_pretrained: {index_path} has no weight_map")
    state_dict: dict[str, Any] = {}
    for shard in sorted(set(weight_map.values())):
        state_dict.update(_read_weights_file(root / shard))
    absent = sorted(set(weight_map) - set(state_dict))
    if absent:
        raise DataError(f"load_pretrained: {index_path} lists tensors no shard holds: "
                        f"{', '.join(absent[:10])}")
    return state_dict, str(index_path)


def _read_weights_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise MissingFileError(f"load_pretrained: weights file {path} does not exist")
    if path.name.endswith(".safetensors"):
        try:
            # bf16 tensors load as ml_dtypes.bfloat16, which importing jax has registered.
            return safetensors_numpy.load_file(str(path))
        except Exception as e:  # safetensors raises its own SafetensorError (an Exception)
            raise DataError(f"load_pretrained: {path} is not a readable safetensors file "
                            f"({type(e).__name__}: {e}); re-download or re-save it") from e
    try:
        import torch
    except ImportError:
        raise ImportError(f"load_pretrained: {path} is a PyTorch pickle and reading it needs "
                          "torch (pip install torch); or convert it to model.safetensors") from None
    try:
        # weights_only: a pickle can run code on load; tensors and containers are all we need.
        state_dict = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:
        raise DataError(f"load_pretrained: {path} is not a readable PyTorch state dict "
                        f"({type(e).__name__}: {e}); re-download or re-save it") from e
    if not isinstance(state_dict, Mapping):
        raise DataError(f"load_pretrained: {path} holds a {type(state_dict).__name__}, not a "
                        "state dict (name -> tensor)")
    return dict(state_dict)


def _bert_tokenizer(root: Path, lowercase: bool | None = None) -> WordPieceTokenizer | None:
    """The directory's WordPiece tokenizer: vocab.txt (+ tokenizer_config.json), else a
    WordPiece tokenizer.json; None when it has neither. `lowercase` replaces HF's default
    (True) when tokenizer_config.json does not say."""
    options_path = root / TOKENIZER_CONFIG_FILE
    options = _read_json(options_path, "tokenizer options") if options_path.is_file() else {}
    if (root / VOCAB_FILE).is_file():
        # HF's BertTokenizer defaults: uncased, accents follow lowercasing, CJK split.
        return WordPieceTokenizer.from_vocab_file(
            str(root / VOCAB_FILE),
            lowercase=bool(options.get("do_lower_case",
                                       True if lowercase is None else lowercase)),
            strip_accents=options.get("strip_accents"),
            tokenize_chinese_chars=bool(options.get("tokenize_chinese_chars", True)),
        )
    if not (root / TOKENIZER_FILE).is_file():
        return None
    path = root / TOKENIZER_FILE
    spec = _read_json(path, "the tokenizer")
    model, normalizer = spec.get("model") or {}, spec.get("normalizer") or {}
    if model.get("type") != "WordPiece" or normalizer.get("type") != "BertNormalizer":
        raise DataError(
            f"load_pretrained: {path} is a {model.get('type')} tokenizer with a "
            f"{normalizer.get('type')} normalizer; only BERT's (WordPiece + BertNormalizer) is "
            f"read, or give a {VOCAB_FILE}"
        )
    prefix = model.get("continuing_subword_prefix", CONTINUATION)
    if prefix != CONTINUATION:
        raise DataError(f"load_pretrained: {path}: continuing_subword_prefix {prefix!r} is not "
                        f"BERT's {CONTINUATION!r}")
    by_id = {int(i): token for token, i in model.get("vocab", {}).items()}
    if sorted(by_id) != list(range(len(by_id))):
        raise DataError(f"load_pretrained: {path}: the vocabulary's ids are not 0 .. n-1")
    return WordPieceTokenizer(
        [by_id[i] for i in range(len(by_id))],
        lowercase=bool(normalizer.get("lowercase", True)),
        strip_accents=normalizer.get("strip_accents"),
        tokenize_chinese_chars=bool(normalizer.get("handle_chinese_chars", True)),
        max_input_chars_per_word=int(model.get("max_input_chars_per_word", 100)),
        source=str(path),
    )
