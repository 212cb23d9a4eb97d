"""A tokenizer file kept inside a prepared data directory (local or gs://), beside the examples
it made, so training reads the exact tokenizer the data was prepared with.

    <directory>/<file>            a SentencePiece .model or a WordPiece vocab.txt
    <directory>/tokenizer.json    {"file": ..., "lowercase": ..., and for a trained model
                                  "trained_on": {"sample_sentences", "seed", "sentences",
                                  "corpus_sentences"}}, written last
"""

import json

import ml_collections

from zoo import paths
from zoo.data.tokenizers import base as tokenizers
from zoo.errors import ConfigError

INFO = "tokenizer.json"


def save(directory, name: str, content: bytes, lowercase: bool,
         trained_on: dict | None = None) -> None:
    """Writes the tokenizer file, then the record naming it (its presence means complete);
    `trained_on` says what a trained model saw (the sample's bound and seed)."""
    directory = paths.as_path(directory)
    paths.write_atomic(directory / name, content)
    info = {"file": name, "lowercase": bool(lowercase)}
    if trained_on is not None:
        info["trained_on"] = trained_on
    paths.write_atomic(directory / INFO, json.dumps(info, indent=1, sort_keys=True))


def exists(directory) -> bool:
    return (paths.as_path(directory) / INFO).exists()


def file_of(directory):
    """The saved tokenizer file's path."""
    directory = paths.as_path(directory)
    return directory / json.loads(paths.read_bytes(directory / INFO))["file"]


def load(directory) -> tokenizers.Tokenizer:
    """The saved tokenizer (through a local copy when the directory is in a bucket:
    SentencePiece reads only local files; both kinds read their file whole when loaded)."""
    directory = paths.as_path(directory)
    info = json.loads(paths.read_bytes(directory / INFO))
    with paths.local_copy(directory / info["file"]) as local:
        return tokenizers.load_tokenizer(local, lowercase=info["lowercase"])


def check_given(data: ml_collections.ConfigDict, directory) -> None:
    """A config.data.tokenizer that is not the file saved in `directory` (a prepared
    directory's tokenizer/, config.data.prepared_dir) is a ConfigError: the examples there were
    made with the saved one. '' (use the saved one) always passes. Every job that reads a
    prepared directory (BERT pretraining, SQuAD) checks through here."""
    if not data.get("tokenizer", ""):
        return
    prepared, given = file_of(directory), paths.as_path(data.tokenizer)
    if not given.is_file() or given.read_bytes() != prepared.read_bytes():
        raise ConfigError(
            f"config.data.tokenizer={data.tokenizer!r} is not the tokenizer "
            f"{data.prepared_dir} was prepared with ({prepared}); set config.data.tokenizer='' "
            "to use the prepared one, or prepare again")
