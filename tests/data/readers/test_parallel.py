"""Parallel text: files round-trip, bad input names file and line, and encode_pairs builds
teacher-forcing rows (EOS / BOS placement, shift by one, padding, truncation) on a real joint
SentencePiece model."""

import logging

import numpy as np
import pytest

from zoo.data.readers import parallel
from zoo.data.synthetic import translation as synthetic_translation
from zoo.data.tokenizers import base as tokenizers

PAIRS = [("一加三", "one plus three equals four"),
         ("Er sagt \"hallo\"", "He says \"hello\""),  # quotes are ordinary characters
         ("二十三减四十五", "twenty-three minus forty-five equals negative twenty-two")]


def _write(path, data: bytes):
    path.write_bytes(data)
    return str(path)


# --- round trips -----------------------------------------------------------------------------


def test_tsv_round_trip(tmp_path):
    path = tmp_path / "pairs.tsv"
    parallel.write_parallel_tsv(path, PAIRS)
    assert path.read_text(encoding="utf-8") == "".join(f"{s}\t{t}\n" for s, t in PAIRS)
    assert parallel.read_parallel(path) == PAIRS


def test_two_file_round_trip_allows_tabs(tmp_path):
    pairs = [*PAIRS, ("a\tb", "c")]  # a tab is text in a one-column file
    src, tgt = tmp_path / "train.zh", tmp_path / "train.en"
    parallel.write_parallel_files(src, tgt, pairs)
    assert src.read_text(encoding="utf-8").splitlines() == [s for s, _ in pairs]
    assert parallel.read_parallel(src, target_file=tgt) == pairs


def test_synthetic_splits_round_trip_through_files(tmp_path):
    splits = synthetic_translation.translation_splits(num_pairs=200, max_operand=999)
    for name, pairs in splits.items():
        parallel.write_parallel_tsv(tmp_path / f"{name}.tsv", pairs)
        assert parallel.read_parallel(tmp_path / f"{name}.tsv") == pairs


def test_tsv_columns_crlf_bom_and_whitespace(tmp_path):
    # A Tatoeba-style file: English, French, attribution; CRLF line ends, a byte-order mark.
    path = _write(tmp_path / "fra.txt", "\ufeffGo.\tVa !\tCC-BY 2.0 #1\r\n Hi. \tSalut !\t#2\r\n"
                  .encode("utf-8"))
    assert parallel.read_parallel(path) == [("Go.", "Va !"), ("Hi.", "Salut !")]
    assert parallel.read_parallel(path, source_column=1, target_column=0) == [
        ("Va !", "Go."), ("Salut !", "Hi.")]


# --- bad input -------------------------------------------------------------------------------


def test_aligned_files_of_different_lengths(tmp_path):
    src = _write(tmp_path / "a.zh", "一\n二\n三\n".encode())
    tgt = _write(tmp_path / "a.en", b"one\ntwo\n")
    with pytest.raises(ValueError, match=r"a\.zh has 3 lines but .*a\.en has 2.*line 3"):
        parallel.read_parallel(src, target_file=tgt)


def test_tsv_line_without_a_tab(tmp_path):
    path = _write(tmp_path / "p.tsv", "一\tone\n二 two\n".encode())
    with pytest.raises(ValueError, match=r"p\.tsv:2: no tab"):
        parallel.read_parallel(path)


def test_tsv_line_with_too_few_columns(tmp_path):
    path = _write(tmp_path / "p.tsv", b"a\tb\tc\nd\te\n")
    assert parallel.read_parallel(path) == [("a", "b"), ("d", "e")]  # columns 0, 1 suffice
    with pytest.raises(ValueError, match=r"p\.tsv:2: 2 tab-separated fields.*target_column=2"):
        parallel.read_parallel(path, target_column=2)


def test_empty_sides_are_skipped_with_one_warning(tmp_path, caplog):
    path = _write(tmp_path / "p.tsv", "一\tone\n\n二\t \n\t\n三\tthree\n".encode())
    with caplog.at_level(logging.WARNING, logger="zoo.data.readers.parallel"):
        assert parallel.read_parallel(path) == [("一", "one"), ("三", "three")]
    assert len(caplog.records) == 1
    assert "skipped 3 of 5 lines" in caplog.text and "lines 2, 3, 4" in caplog.text
    caplog.clear()
    src = _write(tmp_path / "b.zh", "一\n\n三\n".encode())
    tgt = _write(tmp_path / "b.en", b"one\ntwo\n\n")
    with caplog.at_level(logging.WARNING, logger="zoo.data.readers.parallel"):
        assert parallel.read_parallel(src, target_file=tgt) == [("一", "one")]
    assert len(caplog.records) == 1 and "skipped 2 of 3 lines with an empty source or target (lines 2, 3)" in caplog.text


def test_invalid_utf8_names_the_line(tmp_path):
    path = _write(tmp_path / "p.tsv", "一\tone\n二\ttwo\n".encode() + b"\xff\tthree\n")
    with pytest.raises(ValueError, match=r"p\.tsv:3: invalid UTF-8 byte 0xff"):
        parallel.read_parallel(path)
    src = _write(tmp_path / "c.zh", "一加三\n".encode("gbk"))  # a GBK file, not UTF-8
    tgt = _write(tmp_path / "c.en", b"one\n")
    with pytest.raises(ValueError, match=r"c\.zh:1: invalid UTF-8"):
        parallel.read_parallel(src, target_file=tgt)


def test_empty_and_missing_files(tmp_path):
    empty = _write(tmp_path / "empty.tsv", b"")
    with pytest.raises(ValueError, match=r"empty\.tsv: the file is empty"):
        parallel.read_parallel(empty)
    blank = _write(tmp_path / "blank.tsv", b"\n \n\t\n")
    with pytest.raises(ValueError, match=r"blank\.tsv: no sentence pairs \(3 lines"):
        parallel.read_parallel(blank)
    with pytest.raises(FileNotFoundError, match=r"missing\.en"):
        parallel.read_parallel(_write(tmp_path / "p.zh", "一\n".encode()),
                               target_file=tmp_path / "missing.en")


@pytest.mark.parametrize("kwargs, match", [
    ({"source_column": -1}, "source_column"),
    ({"target_column": 0}, "both 0"),
    ({"target_file": "x.en", "target_column": 2}, "TSV file only"),
])
def test_bad_column_arguments(tmp_path, kwargs, match):
    path = _write(tmp_path / "p.tsv", b"a\tb\n")
    with pytest.raises(ValueError, match=match):
        parallel.read_parallel(path, **kwargs)


@pytest.mark.parametrize("pairs, match", [
    ([("a\tb", "c")], r"'\\t'.*write_parallel_files"),
    ([("a", "b\nc")], "line"),
    ([("a", " ")], "target"),
    ([(" a", "b")], "surrounding whitespace"),
    ([], "no pairs"),
])
def test_writers_refuse_what_would_not_read_back(tmp_path, pairs, match):
    with pytest.raises(ValueError, match=match):
        parallel.write_parallel_tsv(tmp_path / "out.tsv", pairs)


# --- features --------------------------------------------------------------------------------

NUMERAL_CHARACTERS = "零一二三四五六七八九十百千万加减乘除以"


@pytest.fixture(scope="module")
def pairs():
    return synthetic_translation.translation_pairs(seed=0, num_pairs=400, max_operand=99_999,
                                                   operations=("+", "-", "*", "/"))


@pytest.fixture(scope="module")
def tokenizer(pairs):
    return tokenizers.train_sentencepiece(parallel.joint_tokenizer_texts(pairs), vocab_size=200)


def test_joint_texts_hold_both_sides_in_order():
    assert list(parallel.joint_tokenizer_texts(PAIRS[:2])) == [
        PAIRS[0][0], PAIRS[0][1], PAIRS[1][0], PAIRS[1][1]]


def test_joint_vocabulary_covers_chinese_and_english(tokenizer, pairs):
    for c in NUMERAL_CHARACTERS:
        ids = tokenizer.encode(c)
        assert tokenizer.unk_id not in ids and tokenizer.decode(ids) == c, c
    for word in ("plus", "minus", "times", "equals", "thousand"):
        assert tokenizer.token_to_id("\u2581" + word) > tokenizers.MASK_ID  # a whole-word piece
    for text in parallel.joint_tokenizer_texts(pairs):
        ids = tokenizer.encode(text)
        assert tokenizer.unk_id not in ids and tokenizer.decode(ids) == text


def test_encode_pairs_teacher_forcing_layout(tokenizer, pairs):
    S, T = 40, 60
    f = parallel.encode_pairs(pairs, tokenizer, max_source_len=S, max_target_len=T)
    n = len(pairs)
    for key, shape, dtype in [("source_ids", (n, S), np.int32),
                              ("target_input_ids", (n, T), np.int32),
                              ("target_ids", (n, T), np.int32), ("source_lengths", (n,), np.int32),
                              ("target_lengths", (n,), np.int32),
                              ("target_weights", (n, T), np.float32)]:
        assert f[key].shape == shape and f[key].dtype == dtype, key
    bos, eos, pad = tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id
    for row, (src, tgt) in enumerate(pairs):
        x, y = tokenizer.encode(src), tokenizer.encode(tgt)
        ls, lt = f["source_lengths"][row], f["target_lengths"][row]
        assert (ls, lt) == (len(x) + 1, len(y) + 1)
        np.testing.assert_array_equal(f["source_ids"][row], x + [eos] + [pad] * (S - ls))
        np.testing.assert_array_equal(f["target_input_ids"][row], [bos] + y + [pad] * (T - lt))
        np.testing.assert_array_equal(f["target_ids"][row], y + [eos] + [pad] * (T - lt))
        # Shifted by one: the token read at t + 1 is the one predicted at t.
        np.testing.assert_array_equal(f["target_ids"][row, :lt - 1],
                                      f["target_input_ids"][row, 1:lt])
        np.testing.assert_array_equal(f["target_weights"][row], [1.0] * lt + [0.0] * (T - lt))
    assert (f["source_lengths"] < S).all() and (f["target_lengths"] < T).all()  # none truncated


def test_truncation_keeps_eos_and_warns_once(tokenizer, pairs, caplog):
    S, T = 4, 5
    with caplog.at_level(logging.WARNING, logger="zoo.data.readers.parallel"):
        f = parallel.encode_pairs(pairs, tokenizer, max_source_len=S, max_target_len=T)
    n_src = sum(len(tokenizer.encode(s)) > S - 1 for s, _ in pairs)
    n_tgt = sum(len(tokenizer.encode(t)) > T - 1 for _, t in pairs)
    assert n_src > 0 and n_tgt == len(pairs)
    assert len(caplog.records) == 1
    assert f"truncated {n_src} of {len(pairs)} sources" in caplog.text
    assert f"{n_tgt} targets to max_target_len={T}" in caplog.text
    for row, (src, tgt) in enumerate(pairs):
        x, y = tokenizer.encode(src), tokenizer.encode(tgt)
        if len(x) > S - 1:
            np.testing.assert_array_equal(f["source_ids"][row], x[:S - 1] + [tokenizer.eos_id])
        np.testing.assert_array_equal(f["target_ids"][row], y[:T - 1] + [tokenizer.eos_id])
        np.testing.assert_array_equal(f["target_input_ids"][row], [tokenizer.bos_id] + y[:T - 1])
    assert (f["target_weights"] == 1).all()


def test_encode_pairs_bad_arguments(tokenizer):
    with pytest.raises(ValueError, match="max_source_len"):
        parallel.encode_pairs(PAIRS, tokenizer, max_source_len=1, max_target_len=8)
    with pytest.raises(ValueError, match="max_target_len"):
        parallel.encode_pairs(PAIRS, tokenizer, max_source_len=8, max_target_len=1)

    class NoBos:
        pad_id = 0

        def encode_batch(self, texts):
            return [[7] for _ in texts]

    with pytest.raises(ValueError, match="bos_id, eos_id"):
        parallel.encode_pairs(PAIRS, NoBos(), max_source_len=8, max_target_len=8)
