"""Multiple-choice data: TSV / JSONL reading with errors at file:line; the synthetic set written
and read back."""

import json

import pytest

from zoo.data.readers import multiple_choice
from zoo.data.synthetic import multiple_choice as synthetic_multiple_choice


def test_tsv_and_jsonl_read_the_same_examples(tmp_path):
    tsv = tmp_path / "dev.tsv"
    tsv.write_text("id\tstartphrase\tending0\tending1\tending2\tlabel\n"
                   "a\tShe opened the door.\tShe left.\tHe \"sang\".\tIt rained.\t1\n"
                   "\n"
                   "b\tThe cat sat.\tOn a mat.\tIn a hat.\tOn a bat.\t0\n")
    jsonl = tmp_path / "dev.jsonl"
    jsonl.write_text(
        json.dumps({"id": "a", "context": "She opened the door.",
                    "endings": ["She left.", 'He "sang".', "It rained."], "label": 1}) + "\n"
        + json.dumps({"id": "b", "context": "The cat sat.",
                      "endings": ["On a mat.", "In a hat.", "On a bat."], "label": "0"}) + "\n")
    from_tsv = multiple_choice.read_examples(tsv, choices="ending0,ending1,ending2")
    from_jsonl = multiple_choice.read_examples(jsonl, choices="endings")
    expected = [
        {"id": "a", "context": "She opened the door.",
         "options": ["She left.", 'He "sang".', "It rained."], "label": "1"},
        {"id": "b", "context": "The cat sat.", "options": ["On a mat.", "In a hat.", "On a bat."],
         "label": "0"},
    ]
    assert from_tsv == expected
    assert from_jsonl == expected


@pytest.mark.parametrize("body, choices, match", [
    ("context\te0\te1\tlabel\nx\ty\tz\t2\n", "e0,e1", r"bad\.tsv:2: label '2' is not an option"),
    ("context\te0\te1\tlabel\nx\ty\tz\t0\nx\ty\t1\n", "e0,e1", r"bad\.tsv:3: 3 tab-separated"),
    ("context\te0\tlabel\nx\ty\t0\n", "e0,e9", r"bad\.tsv:1: no column\(s\) \['e9'\]"),
    ("id\tcontext\te0\te1\tlabel\nq\tx\ty\tz\t0\nq\tx\ty\tz\t1\n", "e0,e1",
     r"bad\.tsv:3: duplicate id 'q'"),
])
def test_bad_tsv_rows_are_errors_naming_file_and_line(tmp_path, body, choices, match):
    path = tmp_path / "bad.tsv"
    path.write_text(body)
    with pytest.raises(ValueError, match=match):
        multiple_choice.read_examples(path, choices=choices)


def test_bad_jsonl_lines_are_errors_naming_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = {"context": "x", "options": ["a", "b"], "label": 0}
    path.write_text(json.dumps(good) + "\n" + json.dumps(dict(good, options=["a", 3])) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: the options"):
        multiple_choice.read_examples(path, choices="options")
    path.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2:2: invalid JSON"):
        multiple_choice.read_examples(path, choices="options")


def test_written_synthetic_set_reads_back_equal(tmp_path):
    examples = synthetic_multiple_choice.multiple_choice_splits(0, 100)["validation"]
    path = tmp_path / "validation.jsonl"
    multiple_choice.write_jsonl(str(path), examples)
    assert multiple_choice.read_examples(path, choices="options", context="context") == examples
