"""A corpus cut into pieces: wherever the byte cuts fall, every document of the text files is
read by exactly one piece, exactly as the whole-file reader reads it."""

import os

import numpy as np
import pytest

from zoo.data.readers import corpus_pieces, text_files
from zoo.errors import DataError


def _random_corpus(rng, path, bom=False, crlf=False):
    """A BERT-format file with awkward spacing: runs of blank lines, whitespace-only lines
    (ASCII and U+3000), leading blank lines, multi-byte characters, no final newline."""
    words = ["alpha", "béta", "γάμμα", "注意力", "x", "long" * 30]
    blocks = []
    for _ in range(int(rng.integers(5, 40))):
        sentences = [" ".join(rng.choice(words, int(rng.integers(1, 12))))
                     for _ in range(int(rng.integers(1, 6)))]
        blocks.append(sentences)
    end = "\r\n" if crlf else "\n"
    separators = [end, end * 3, end + "   " + end, end + "\u3000" + end]
    text = end * int(rng.integers(0, 3))
    for d, sentences in enumerate(blocks):
        text += end.join(sentences) + end
        if d + 1 < len(blocks):
            text += separators[int(rng.integers(len(separators)))]
    if rng.random() < 0.5:
        text = text.rstrip()
    with open(path, "wb") as f:
        f.write(("\ufeff" if bom else "").encode() + text.encode("utf-8"))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_every_document_is_read_once_wherever_the_cuts_fall(tmp_path, seed):
    rng = np.random.default_rng(seed)
    files = [_random_corpus(rng, str(tmp_path / f"f{i}.txt"), bom=i == 0, crlf=seed % 2 == 1)
             for i in range(3)]
    expected = [doc for f in files for doc in text_files.read_text_corpus(f)]
    total = sum(os.path.getsize(f) for f in files)
    for shard_bytes in sorted({1, 7, 64, int(rng.integers(2, total)), total // 3, total,
                               10 * total}):
        pieces = corpus_pieces.plan_text(files, shard_bytes)
        assert len(pieces) == max(1, -(-total // shard_bytes))
        covered = [s.stop - s.start for p in pieces for s in p.segments]
        assert sum(covered) == total == sum(p.size for p in pieces)
        got = [doc for p in pieces for doc in corpus_pieces.read_piece(p)]
        assert got == expected, f"shard_bytes={shard_bytes}"


def test_a_piece_reads_only_its_own_documents_and_streams(tmp_path):
    path = str(tmp_path / "c.txt")
    text_files.write_text_corpus(path, [[f"doc {d} sentence {s}." for s in range(3)]
                                        for d in range(100)])
    pieces = corpus_pieces.plan_text([path], -(-os.path.getsize(path) // 4))
    per_piece = [list(corpus_pieces.read_piece(p)) for p in pieces]
    counts = [len(docs) for docs in per_piece]
    assert len(counts) == 4 and sum(counts) == 100 and min(counts) >= 20
    assert per_piece[1][0][0] == f"doc {counts[0]} sentence 0."
    # A generator: the first document comes without reading the rest of the file.
    first = next(corpus_pieces.read_piece(pieces[0]))
    assert first == ["doc 0 sentence 0.", "doc 0 sentence 1.", "doc 0 sentence 2."]


def test_document_groups_and_record_ranges():
    docs = [[f"d{i}"] for i in range(100)]
    pieces = corpus_pieces.plan_documents(docs, 4)
    assert [list(corpus_pieces.read_piece(p)) for p in pieces] == [
        docs[0:25], docs[25:50], docs[50:75], docs[75:100]]
    # Never fewer than 16 documents a piece: NotNext pairs need other documents to draw from.
    assert len(corpus_pieces.plan_documents(docs, 64)) == 100 // 16
    assert len(corpus_pieces.plan_documents(docs[:5], 8)) == 1
    ranges = corpus_pieces.plan_tfds("lm1b", "", "train", "text", 1000, 3)
    assert [(p.start, p.stop) for p in ranges] == [(0, 333), (333, 666), (666, 1000)]
    # A piece's identity changes with its text (the cache key and the plan use it).
    other = corpus_pieces.plan_documents([[f"d{i}!"] for i in range(100)], 4)
    assert pieces[0].identity() != other[0].identity()


def test_invalid_utf8_names_the_file_and_byte_offset(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"one sentence.\n\nanother \xff one.\n")
    piece = corpus_pieces.plan_text([str(path)], 1 << 20)[0]
    with pytest.raises(DataError, match=r"bad.txt: invalid UTF-8 byte 0xff at byte offset 23"):
        list(corpus_pieces.read_piece(piece))
