"""The tokenizer kept in a prepared directory: a config.data.tokenizer naming another file is
refused (the examples were made with the saved one), for every job reading such a directory."""

import ml_collections
import pytest

from zoo.data.tokenizers import prepared
from zoo.errors import ConfigError


def _data(tmp_path, tokenizer: str) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({"tokenizer": tokenizer,
                                      "prepared_dir": str(tmp_path / "prepared")})


def test_the_saved_tokenizer_or_none_passes_and_another_is_refused(tmp_path):
    directory = tmp_path / "prepared" / "tokenizer"
    prepared.save(directory, "vocab.txt", b"[PAD]\n[UNK]\nthe\n", lowercase=True)
    same, other = tmp_path / "same.txt", tmp_path / "other.txt"
    same.write_bytes(b"[PAD]\n[UNK]\nthe\n")
    other.write_bytes(b"[PAD]\n[UNK]\na\n")
    prepared.check_given(_data(tmp_path, ""), directory)  # '' uses the saved one
    prepared.check_given(_data(tmp_path, str(same)), directory)  # byte-equal: the same file
    for given in (other, tmp_path / "missing.txt", tmp_path):
        with pytest.raises(ConfigError, match=r"config\.data\.tokenizer=.* is not the tokenizer "
                                              r".*prepared.* was prepared with .*vocab\.txt"):
            prepared.check_given(_data(tmp_path, str(given)), directory)
