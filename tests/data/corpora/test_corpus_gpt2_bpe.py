"""`corpus fetch gpt2_bpe`: a tiktoken rank table (OpenAI's gpt2.tiktoken ships in the
openai-whisper sdist) converted to GPT-2's vocab.json + merges.txt. Outside judge: tiktoken
itself, whose Rust BPE encodes with the rank table directly, must give the ids zoo's GPT-2
tokenizer gives from the converted files. The fixture's table is learnt here, merge by merge,
from a few sentences (the real one is 50,256 tokens; benchmarks.quality_gpt checks it on all of
Shakespeare)."""

import json
import os

import pytest

from tests.data.corpora import fake_packages
from zoo.commands import corpus as command
from zoo.data import corpora
from zoo.data.tokenizers.base import load_tokenizer
from zoo.errors import DataError

tiktoken = pytest.importorskip("tiktoken")  # the parity extra installs it

TRAIN_TEXT = ("The king's men said that the king and the queen had gone to the north. "
              "Then the men went after them, and they said: 'We'll follow the king!' " * 3)
PROBES = ["the king and the queen", "They'll say it's the north, 2026.",
          "  naïve café — “quoted”\n\n\tend 🙂", "zzz qqq unseen words"]


def fetched(tmp_path, monkeypatch, ranks: bytes) -> str:
    sdist = fake_packages.whisper_sdist(tmp_path, ranks)
    fake_packages.pin(monkeypatch, sdist)
    corpora.fetch("gpt2_bpe", str(tmp_path / "out"), [sdist], report=lambda line: None)
    return str(tmp_path / "out" / "gpt2_bpe")


def test_converted_files_encode_as_tiktoken_does_with_the_rank_table(tmp_path, monkeypatch):
    tokens = fake_packages.learnt_ranks(TRAIN_TEXT, merges=40)
    directory = fetched(tmp_path, monkeypatch, fake_packages.rank_file(tokens))
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["notes"]["merges"] == len(tokens) - 256 == 40
    assert {e["file"]: e["bytes"] for e in manifest["files"]} == {
        name: os.path.getsize(os.path.join(directory, name)) for name in os.listdir(directory)
        if name != "manifest.json"}
    tokenizer = load_tokenizer(directory)
    assert tokenizer.eos_id == len(tokens) and tokenizer.vocab_size == len(tokens) + 1
    judge = tiktoken.Encoding(
        "fixture", pat_str=fake_packages.GPT2_PATTERN,
        special_tokens={"<|endoftext|>": len(tokens)},
        mergeable_ranks={t: rank for rank, t in enumerate(tokens)})
    for text in [TRAIN_TEXT] + PROBES:
        ids = list(tokenizer.encode(text))
        assert ids == judge.encode_ordinary(text), text
        assert tokenizer.decode(ids) == text
    assert len(tokenizer.encode(TRAIN_TEXT)) < len(TRAIN_TEXT.encode()) / 2  # merges were used


def test_a_token_that_is_no_merge_of_lower_ranks_is_named(tmp_path, monkeypatch):
    tokens = [bytes([b]) for b in range(256)] + [b"abc"]  # needs "ab" or "bc" ranked first
    with pytest.raises(DataError, match=r"gpt2\.tiktoken: token 256 \(b'abc'\) is not the merge"):
        fetched(tmp_path, monkeypatch, fake_packages.rank_file(tokens))
    assert not os.path.exists(tmp_path / "out" / "gpt2_bpe")  # nothing half-written


def test_bad_rank_lines_name_the_line(tmp_path, monkeypatch):
    good = fake_packages.rank_file([bytes([b]) for b in range(256)])
    with pytest.raises(DataError, match=r"gpt2\.tiktoken:257: rank 300 where 256 was due"):
        fetched(tmp_path, monkeypatch, good + b"YWI= 300\n")
    with pytest.raises(DataError, match=r"gpt2\.tiktoken:1: a rank line is"):
        fetched(tmp_path, monkeypatch, b"not-base64!! 0\n" + good)
    with pytest.raises(DataError, match=r"1 of the 256 single bytes have no rank"):
        fetched(tmp_path, monkeypatch, fake_packages.rank_file([bytes([b]) for b in range(255)]))


def test_command_fetches_from_the_given_sdist(tmp_path, monkeypatch, capsys):
    ranks = fake_packages.rank_file(fake_packages.learnt_ranks(TRAIN_TEXT, 5))
    sdist = fake_packages.whisper_sdist(tmp_path, ranks)
    fake_packages.pin(monkeypatch, sdist)
    command.main(["fetch", "gpt2_bpe", "--out", str(tmp_path / "out"), "--from", sdist])
    assert "gpt2_bpe: 262 tokens, 5 merges" in capsys.readouterr().out
    merges = (tmp_path / "out" / "gpt2_bpe" / "merges.txt").read_text().splitlines()
    assert merges[0] == "#version: 0.2" and len(merges) == 6
