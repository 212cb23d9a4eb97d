"""BERT's pretraining text format (the 'text' source): written and read back unchanged, messy
files tolerated, bad input named by file and line."""

import re

import pytest

from zoo.data.readers import text_files
from zoo.data.synthetic.documents import generate_documents
from zoo.data.synthetic.world import make_world


@pytest.fixture(scope="module")
def documents():
    return generate_documents(make_world(seed=0), seed=0)


def test_write_then_read_round_trips(tmp_path, documents):
    path = tmp_path / "corpus.txt"
    text_files.write_text_corpus(path, documents)
    raw = path.read_bytes()
    assert raw.endswith(b".\n") and b"\n\n\n" not in raw and b"\r" not in raw
    assert raw.count(b"\n\n") == len(documents) - 1
    assert text_files.read_text_corpus(path) == [list(d.texts) for d in documents]
    # Plain lists of strings (and non-ASCII text) round-trip too.
    plain = [["Überall ist es schön.", "第二句。"], ["One."]]
    text_files.write_text_corpus(path, plain)
    assert text_files.read_text_corpus(path) == plain


def test_read_tolerates_crlf_bom_and_extra_blank_lines(tmp_path):
    path = tmp_path / "messy.txt"
    path.write_bytes(b"\xef\xbb\xbf\r\n\r\nA one.\r\nA two.  \r\n\r\n \r\n\t\n\nB one.")
    assert text_files.read_text_corpus(path) == [["A one.", "A two."], ["B one."]]


def test_read_names_file_and_line_of_invalid_utf8(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("First.\n\nSecond.\nCaf\u00e9 au lait.\n".encode("latin-1"))
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}:4: invalid UTF-8.*column 4"):
        text_files.read_text_corpus(path)


@pytest.mark.parametrize("content", [b"", b"\n\n \r\n"])
def test_read_rejects_empty_file(tmp_path, content):
    path = tmp_path / "empty.txt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: the corpus is empty"):
        text_files.read_text_corpus(path)


@pytest.mark.parametrize("bad", [[[]], [["two\nlines."]], [[" padded."]], [["   "]]])
def test_write_rejects_documents_that_would_not_round_trip(tmp_path, bad):
    with pytest.raises(ValueError, match=r"documents\[0\]"):
        text_files.write_text_corpus(tmp_path / "x.txt", bad)


# The one JSON Lines loop (classification and multiple-choice readers): a bad line reads the
# same in both, blank lines are skipped and line numbers count them.
@pytest.mark.parametrize("text, match", [
    ('{"a": 1}\n{"a": \n', r"f\.jsonl:2:\d+: invalid JSON: .*one JSON object per line"),
    ('{"a": 1}\n\n[1, 2]\n', r"f\.jsonl:3: a JSON list, not an object; .*not one array of them"),
])
def test_json_lines_name_the_file_and_line_of_a_bad_record(text, match):
    with pytest.raises(ValueError, match=match):
        list(text_files.json_lines("f.jsonl", text))


def test_json_lines_skip_blank_lines_and_keep_numbers():
    text = '{"a": 1}\n\n  \n{"a": "ü"}\r\n'
    assert list(text_files.json_lines("f.jsonl", text)) == [(1, {"a": 1}), (4, {"a": "ü"})]
