"""The BERT encoder a fine-tuning task (SQuAD, classification) builds: its BertConfig and its
tokenizer, from config.model.size and config.data, or from the pretrained checkpoint directory
that config.train.init_from names (Hugging Face: config.json; google-research/bert:
bert_config.json; either with its vocab.txt), so a local bert-base-uncased fine-tunes with the
architecture and vocabulary it was trained with.
"""

import json

import ml_collections

from zoo import paths
from zoo.convert import bert as bert_convert
from zoo.data.tokenizers import base as tokenizers
from zoo.errors import ConfigError, DataError, MissingFileError
from zoo.models import bert
from zoo.models.runtime_fields import run_choices

PRETRAINED_CONFIG_FILES = ("config.json", "bert_config.json")


def pretrained_directory(config: ml_collections.ConfigDict) -> str | None:
    """config.train.init_from when it is a pretrained checkpoint directory (not a zoo workdir);
    an error naming it when its config.json is another model family's."""
    path = config.train.get("init_from", "")
    if not path:
        return None
    paths.check_remote(path, "config.train.init_from")
    found = [f for f in PRETRAINED_CONFIG_FILES if (paths.as_path(path) / f).is_file()]
    if not found:
        return None
    name = found[0]
    model_type = read_pretrained_config(paths.join(path, name)).get("model_type", "bert")
    if model_type != "bert":
        raise ConfigError(
            f"config.train.init_from={path!r} is not a checkpoint of this model: its "
            f"{name} says model_type={model_type!r}, and this task fine-tunes BERT; point "
            "init_from at a BERT checkpoint (a Hugging Face BERT directory, a google-research/"
            "bert one with bert_config.json, or a zoo BERT run)")
    return path


def read_pretrained_config(path: str) -> dict:
    """A checkpoint's config.json / bert_config.json as a dict; a malformed one is an error
    naming the file."""
    try:
        with paths.as_path(path).open(encoding="utf-8") as f:
            hf_config = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: not a readable JSON checkpoint config ({e}); restore the file "
                        "from the checkpoint's release") from None
    if not isinstance(hf_config, dict):
        # A bad file, not a bad argument: ValueError like every other input error.
        raise DataError(  # noqa: TRY004
            f"{path}: a checkpoint config must be a JSON object, found "
            f"{type(hf_config).__name__}")
    return hf_config


def tokenizer(config: ml_collections.ConfigDict, cache_dir: str, texts) -> tokenizers.Tokenizer:
    """config.data.tokenizer if given; else the pretrained directory's vocab.txt; else a
    SentencePiece model trained on `texts` (cached in cache_dir, see tokenizers.from_config)."""
    directory = pretrained_directory(config)
    if directory and not config.data.tokenizer:
        vocab = paths.join(directory, "vocab.txt")
        if not paths.as_path(vocab).is_file():
            raise MissingFileError(
                f"config.train.init_from={directory!r} has no vocab.txt; the fine-tuning data "
                "must be tokenized with the checkpoint's vocabulary: set config.data.tokenizer "
                "to its vocab.txt"
            )
        return tokenizers.load_tokenizer(vocab, lowercase=config.data.get("lowercase", True))
    return tokenizers.from_config(config.data, cache_dir, [texts])


def encoder_config(config: ml_collections.ConfigDict, vocab_size: int) -> bert.BertConfig:
    """The BertConfig for `vocab_size` tokens and config.data.seq_len positions."""
    seq_len = config.data.seq_len
    model_kw = {k: v for k, v in config.model.to_dict().items() if k != "size"}
    directory = pretrained_directory(config)
    if directory is None:
        return bert.config_for_size(
            config.model.size, vocab_size=vocab_size,
            max_position_embeddings=max(seq_len, model_kw.pop("max_position_embeddings")),
            **model_kw)
    name = next(f for f in PRETRAINED_CONFIG_FILES if (paths.as_path(directory) / f).is_file())
    path = paths.join(directory, name)
    hf_config = read_pretrained_config(path)
    result = bert_convert.config_from_hf(hf_config, **run_choices(model_kw))
    if result.vocab_size != vocab_size:
        raise ConfigError(
            f"{path}: vocab_size {result.vocab_size} differs from the tokenizer's {vocab_size}; "
            "fine-tune with the checkpoint's own vocab.txt (leave config.data.tokenizer empty)"
        )
    if seq_len > result.max_position_embeddings:
        raise ConfigError(
            f"config.data.seq_len={seq_len} exceeds the checkpoint's max_position_embeddings="
            f"{result.max_position_embeddings} ({path}); lower config.data.seq_len"
        )
    return result
