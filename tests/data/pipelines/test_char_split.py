"""config.data.char_split: nanoGPT's shakespeare_char split of a text by characters."""

import ml_collections
import pytest

from configs import common
from zoo.data.pipelines import lm_pipeline
from zoo.data.tokenizers import chars
from zoo.errors import ConfigError


def _data(**kw):
    return ml_collections.ConfigDict(dict(common.source_config(), **dict(
        dict(tokenizer_type="chars"), **kw)))


def test_first_fraction_of_characters_trains_and_the_rest_validates(tmp_path):
    text = "ROMEO:\nBut soft!  What light\n\n\tthrough yonder window breaks?\n" * 3
    (tmp_path / "a.txt").write_text(text[:50], encoding="utf-8")
    (tmp_path / "b.txt").write_text(text[50:], encoding="utf-8")  # files joined in sorted order
    data = _data(source="files", train_files=str(tmp_path / "*.txt"), char_split=0.9)
    train, validation = lm_pipeline.load_splits(data)
    cut = int(len(text) * 0.9)
    # Verbatim: line breaks, tabs and runs of spaces survive (one document each).
    assert train == [[text[:cut]]] and validation == [[text[cut:]]]


def test_off_by_default_reads_the_sources_own_splits(tmp_path):
    (tmp_path / "t.txt").write_text("one line\n\nanother document\n", encoding="utf-8")
    data = _data(source="files", train_files=str(tmp_path / "t.txt"),
                 eval_files=str(tmp_path / "t.txt"))
    train, _ = lm_pipeline.load_splits(data)
    assert train == [["one line"], ["another document"]]


@pytest.mark.parametrize("kw, message", [
    (dict(char_split=1.0), "strictly between 0 and 1"),
    (dict(char_split=0.9, source="synthetic"), "set config.data.source='files'"),
    (dict(char_split=0.9, eval_files="v.txt"), "leave config.data.eval_files empty"),
    (dict(char_split=0.9, tokenizer_type="bpe"), "set config.data.tokenizer_type='chars'"),
])
def test_misuse_is_a_config_error_naming_the_key(tmp_path, kw, message):
    (tmp_path / "t.txt").write_text("abcdefghij", encoding="utf-8")
    data = _data(**dict(dict(source="files", train_files=str(tmp_path / "t.txt")), **kw))
    with pytest.raises(ConfigError, match=message):
        lm_pipeline.load_splits(data)


def test_characters_the_training_text_never_had_are_counted():
    tokenizer = chars.train_chars(["abc"])
    assert lm_pipeline.unknown_characters(tokenizer, [["abz"], ["zz\u00e9"]]) == {
        "z": 3, "\u00e9": 1}
