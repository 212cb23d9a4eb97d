"""GPT-2 byte-level BPE: ids equal Hugging Face's GPT2Tokenizer on a vocabulary trained here."""

import json
import os
import random

import pytest

from zoo.data.tokenizers import base as tokenizers
from zoo.data.tokenizers import gpt2_bpe

TEXTS = [
    "Hello world! It's a test, isn't it? They've said we'll see what'd happen.",
    "Numbers 12345 and 3.14159, prices $9.99; dates 2026-11-21.",
    "  leading spaces,\ttabs\nnewlines\n\n and   runs of   spaces  ",
    "Unicode: café naïve Zürich — 東京 北京 😀👍 ﬁ ①",
    "MiXeD CaSe wOrDs and CamelCaseIdentifiers_with_underscores",
    "",
    " ",
    "'s 's'S",
]
CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's the dog's day; they'll say it's fine.",
    "Numbers like 2026 and 42 appear, as do prices: $12.50, €7 and ¥300.",
    "Unicode text: café, naïve, Zürich, 東京, emoji 😀 and more.",
] * 20


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    """A GPT-2-format vocab.json + merges.txt, trained by Hugging Face's tokenizers library."""
    hf_tokenizers = pytest.importorskip(
        "tokenizers", reason="trains the reference files; comes with the parity extra "
        "(pip install -e '.[parity]')")
    ByteLevelBPETokenizer = hf_tokenizers.ByteLevelBPETokenizer

    path = tmp_path_factory.mktemp("gpt2")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=400, min_frequency=2,
                            special_tokens=[gpt2_bpe.ENDOFTEXT])
    bpe.save_model(str(path))
    return str(path)


@pytest.fixture(scope="module")
def reference(directory):
    transformers = pytest.importorskip("transformers")
    return transformers.GPT2Tokenizer(os.path.join(directory, "vocab.json"),
                                      os.path.join(directory, "merges.txt"))


def test_ids_equal_hugging_face_gpt2_tokenizer(directory, reference):
    ours = tokenizers.load_tokenizer(directory)
    assert isinstance(ours, gpt2_bpe.GPT2Tokenizer)
    assert isinstance(ours, tokenizers.Tokenizer)
    for text in TEXTS + CORPUS[:3]:
        assert ours.encode(text) == reference.encode(text), text
    assert ours.vocab_size == len(reference)
    assert ours.eos_id == ours.bos_id == reference.convert_tokens_to_ids(gpt2_bpe.ENDOFTEXT)


def test_random_text_equals_hugging_face_and_the_offsets_path(directory, reference):
    # encode looks pieces up in a cache, encode_with_offsets walks bytes: both against HF.
    ours = tokenizers.load_tokenizer(directory)
    rng = random.Random(0)
    alphabet = list("the quick brown fox 's'll 12 3.5 $€ ,;!?\t\n  éü東😀-_") + ["'s", " 's"]
    for _ in range(500):
        text = "".join(rng.choices(alphabet, k=rng.randint(0, 25)))
        want = reference.encode(text)
        assert ours.encode(text) == want, repr(text)
        assert ours.encode_with_offsets(text)[0] == want, repr(text)


def test_decode_round_trips_every_text_and_drops_endoftext(directory):
    ours = gpt2_bpe.GPT2Tokenizer.from_directory(directory)
    for text in TEXTS:
        assert ours.decode(ours.encode(text)) == text
    ids = ours.encode("ab")
    assert ours.decode([ours.eos_id, *ids, ours.eos_id]) == "ab"
    # A literal "<|endoftext|>" in text is characters, never the special id.
    assert ours.eos_id not in ours.encode("a <|endoftext|> b")


def test_offsets_point_at_the_characters_each_token_came_from(directory):
    ours = gpt2_bpe.GPT2Tokenizer.from_directory(directory)
    text = "café 東京 😀 it's"
    ids, offsets = ours.encode_with_offsets(text)
    assert len(ids) == len(offsets)
    for i, (start, end) in zip(ids, offsets):
        assert 0 <= start < end <= len(text)
        raw = bytes(ours._char_to_byte[c] for c in ours.id_to_token(i))
        span = text[start:end].encode("utf-8")
        # A token of whole characters is exactly its span; one holding part of a multi-byte
        # character (an emoji split in two) spans that whole character.
        assert raw == span or (raw in span and raw.decode("utf-8", "replace") != span.decode())
    # Spans cover the text in order without gaps between pieces of one word.
    assert offsets[0][0] == 0 and offsets[-1][1] == len(text)
    assert all(a[1] <= b[1] and a[0] <= b[0] for a, b in zip(offsets, offsets[1:]))


def test_word_starts_are_tokens_after_a_space(directory):
    ours = gpt2_bpe.GPT2Tokenizer.from_directory(directory)
    ids = ours.encode("the quick brown")
    starts = [ours.is_word_start(i) for i in ids]
    pieces = [ours.id_to_token(i) for i in ids]
    assert starts == [p.startswith("\u0120") for p in pieces]
    assert sum(starts) == 2  # " quick", " brown"; "the" opens the text with no space before it


def test_bad_directories_name_the_file_and_the_fix(tmp_path, directory):
    with pytest.raises(FileNotFoundError, match="merges.txt"):
        gpt2_bpe.GPT2Tokenizer.from_directory(str(tmp_path))
    (tmp_path / "vocab.json").write_text("{not json", encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"vocab.json: not valid JSON"):
        gpt2_bpe.GPT2Tokenizer.from_directory(str(tmp_path))
    vocab = json.load(open(os.path.join(directory, "vocab.json"), encoding="utf-8"))
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b c\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"merges.txt:2: a merge is two symbols"):
        gpt2_bpe.GPT2Tokenizer.from_directory(str(tmp_path))
    del vocab[gpt2_bpe.ENDOFTEXT]
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not a GPT-2 vocabulary"):
        gpt2_bpe.GPT2Tokenizer.from_directory(str(tmp_path))
