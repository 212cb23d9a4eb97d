"""The character tokenizer (zoo.data.tokenizers.chars): every character a token, nothing
normalised, unseen characters the unknown id, one cached vocabulary file."""

import ml_collections
import pytest

from zoo.data.tokenizers import base, chars
from zoo.errors import DataError, MissingFileError

TEXT = "First Citizen:\nBefore we proceed,  hear me speak.\n\n\tAll: Speak, speak!\n"


def test_vocabulary_is_the_sorted_characters_after_zoos_special_ids():
    tokenizer = chars.train_chars([TEXT[:20], TEXT[20:]])
    assert tokenizer.chars == sorted(set(TEXT))
    assert tokenizer.vocab_size == 7 + len(set(TEXT))
    # The LM pipeline frames documents with base's fixed ids: the specials must be those.
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (
        base.PAD_ID, base.UNK_ID, base.BOS_ID, base.EOS_ID)
    assert (tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id) == (
        base.CLS_ID, base.SEP_ID, base.MASK_ID)
    assert tokenizer.encode("\t\n ") == [7, 8, 9]  # the three lowest code points of TEXT
    assert [tokenizer.id_to_token(i) for i in tokenizer.encode("Speak")] == list("Speak")
    assert tokenizer.token_to_id("[MASK]") == base.MASK_ID
    assert isinstance(tokenizer, base.Tokenizer)


def test_round_trip_keeps_line_breaks_tabs_and_runs_of_spaces():
    tokenizer = chars.train_chars([TEXT])
    ids = tokenizer.encode(TEXT)
    assert len(ids) == len(TEXT) and base.UNK_ID not in ids
    assert tokenizer.decode(ids) == TEXT
    # bos / eos / pad are dropped, as SentencePiece drops its control symbols.
    assert tokenizer.decode([base.BOS_ID, *ids, base.EOS_ID, base.PAD_ID]) == TEXT
    ids, offsets = tokenizer.encode_with_offsets(TEXT)
    assert [TEXT[a:b] for a, b in offsets] == list(TEXT)
    assert tokenizer.encode_batch(["ab", TEXT]) == [tokenizer.encode("ab"), tokenizer.encode(TEXT)]


def test_an_unseen_character_is_the_unknown_id_counted_and_decoded_as_replacement():
    tokenizer = chars.train_chars(["abc \n"])
    ids = tokenizer.encode("a\u00e9b\u00e9z")
    assert ids == [tokenizer.token_to_id("a"), base.UNK_ID, tokenizer.token_to_id("b"),
                   base.UNK_ID, base.UNK_ID]
    assert tokenizer.decode(ids) == "a\ufffdb\ufffd\ufffd"
    assert tokenizer.unknown_characters("a\u00e9b\u00e9z") == {"\u00e9": 2, "z": 1}
    with pytest.raises(KeyError, match="'z' is not in the character vocabulary"):
        tokenizer.token_to_id("z")
    with pytest.raises(IndexError):
        tokenizer.id_to_token(tokenizer.vocab_size)


def test_saved_vocabulary_loads_through_load_tokenizer(tmp_path):
    tokenizer = chars.train_chars([TEXT + "\u00e9\u2014"])
    path = str(tmp_path / "sub" / f"vocab{chars.SUFFIX}")
    tokenizer.save(path)
    again = base.load_tokenizer(path)
    assert isinstance(again, chars.CharTokenizer)
    assert again.chars == tokenizer.chars and again.encode(TEXT) == tokenizer.encode(TEXT)
    (tmp_path / f"bad{chars.SUFFIX}").write_text('{"kind": "bpe"}')
    with pytest.raises(DataError, match=f"bad{chars.SUFFIX} is not a zoo character vocabulary"):
        base.load_tokenizer(str(tmp_path / f"bad{chars.SUFFIX}"))
    with pytest.raises(MissingFileError):
        chars.CharTokenizer.load(str(tmp_path / f"none{chars.SUFFIX}"))
    with pytest.raises(DataError, match="the training text is empty"):
        chars.train_chars(["", ""])


def test_from_config_builds_once_and_reuses_the_cached_file(tmp_path):
    data = ml_collections.ConfigDict(dict(tokenizer="", tokenizer_type="chars", vocab_size=1024))
    first = base.from_config(data, str(tmp_path), [["ab\n", "c"]])
    assert first.chars == ["\n", "a", "b", "c"]
    assert (tmp_path / f"vocab{chars.SUFFIX}").is_file()
    # Other documents, same cache: the cached vocabulary is read, never rebuilt (a resumed run
    # keeps its ids).
    second = base.from_config(data, str(tmp_path), [["xyz"]])
    assert second.chars == first.chars
