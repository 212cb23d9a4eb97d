"""GLUE-style classification data: reading TSV / JSON Lines (column detection, every bad-input
path), the label list, and BERT's classifier featurization against hand-computed rows."""

import logging
import re

import numpy as np
import pytest

from zoo.data.readers import classification
from zoo.data.synthetic.documents import generate_documents
from zoo.data.synthetic.world import make_world
from zoo.data.tokenizers import base as tokenizers


def _write(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return str(path)


class _WordTokenizer:
    """Whitespace words -> ids, [PAD]=0 [CLS]=1 [SEP]=2, words from 3 in vocabulary order."""

    pad_id, cls_id, sep_id = 0, 1, 2

    def __init__(self, words):
        self._ids = {w: i + 3 for i, w in enumerate(words)}
        self.vocab_size = len(words) + 3

    def encode(self, text):
        return [self._ids[w] for w in text.split()]


# a..k -> 3..13
TOK = _WordTokenizer(list("abcdefghijk"))


def _example(a, b=None, label=None, id_="x"):
    return {"id": id_, "text_a": a, "text_b": b, "label": label}


# --- reading ---------------------------------------------------------------------------------


def test_tsv_detects_glue_pair_columns_and_reads_quotes_verbatim(tmp_path):
    # MRPC as HF's GLUE writes it; a field opening with an unbalanced '"' would, under csv's
    # default quoting, swallow the tab and the next line into one field.
    path = _write(tmp_path, "dev.tsv",
                  "label\tidx\tsentence1\tsentence2\n"
                  '1\t7\t"Quoted start, no end\tHe said "yes".\n'
                  "0\t9\tPlain one.\tPlain two.\n")
    assert classification.read_examples(path) == [
        {"id": "7", "text_a": '"Quoted start, no end', "text_b": 'He said "yes".', "label": "1"},
        {"id": "9", "text_a": "Plain one.", "text_b": "Plain two.", "label": "0"},
    ]


def test_single_sentence_tsv_ids_are_file_and_line_and_crlf_bom_are_tolerated(tmp_path):
    path = _write(tmp_path, "train.tsv",
                  "\ufeffsentence\tlabel\r\nit 's a charming journey .\t1\r\n\r\nbland\t0\r\n")
    assert classification.read_examples(path) == [
        {"id": "train.tsv:2", "text_a": "it 's a charming journey .", "text_b": None,
         "label": "1"},
        {"id": "train.tsv:4", "text_a": "bland", "text_b": None, "label": "0"},
    ]


def test_named_columns_original_mrpc_header(tmp_path):
    path = _write(tmp_path, "msr.tsv",
                  "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t11\t12\tOne here.\tTwo here.\n")
    with pytest.raises(ValueError, match=r"msr\.tsv:1: .*'Quality', '#1 ID'.*text_a"):
        classification.read_examples(path)
    (ex,) = classification.read_examples(path, text_a="#1 String", text_b="#2 String",
                                         label="Quality")
    assert (ex["text_a"], ex["text_b"], ex["label"]) == ("One here.", "Two here.", "1")


def test_text_b_none_forces_single_sentence_and_two_text_columns_are_ambiguous(tmp_path):
    pair = _write(tmp_path, "rte.tsv", "sentence1\tsentence2\tlabel\nA.\tB.\tentailment\n")
    (ex,) = classification.read_examples(pair, text_b="none")
    assert ex["text_b"] is None and ex["text_a"] == "A."
    qnli = _write(tmp_path, "qnli.tsv", "index\tquestion\tsentence\tlabel\n0\tQ?\tS.\tentailment\n")
    with pytest.raises(ValueError, match=r"qnli\.tsv:1: both 'sentence' and 'question'"):
        classification.read_examples(qnli)
    (ex,) = classification.read_examples(qnli, text_a="question", text_b="sentence")
    assert (ex["id"], ex["text_a"], ex["text_b"]) == ("0", "Q?", "S.")


def test_unlabelled_test_tsv_reads_with_require_labels_false(tmp_path):
    path = _write(tmp_path, "test.tsv", "index\tsentence\n0\tfirst .\n1\tsecond .\n")
    with pytest.raises(ValueError, match=r"test\.tsv:1: no label column 'label'.*require_labels"):
        classification.read_examples(path)
    examples = classification.read_examples(path, require_labels=False)
    assert [(e["id"], e["text_a"], e["label"]) for e in examples] == [
        ("0", "first .", None), ("1", "second .", None)]


def test_jsonl_keys_ids_and_labels_become_strings(tmp_path):
    path = _write(tmp_path, "boolq.jsonl",
                  '{"idx": 3, "premise": "P.", "hypothesis": "H.", "label": 1}\n'
                  '\n'
                  '{"idx": 4, "premise": "Q.", "hypothesis": "I.", "label": false}\n'
                  '{"premise": "R.", "hypothesis": "J.", "label": "x"}\n')
    assert classification.read_examples(path) == [
        {"id": "3", "text_a": "P.", "text_b": "H.", "label": "1"},
        {"id": "4", "text_a": "Q.", "text_b": "I.", "label": "false"},
        {"id": "boolq.jsonl:4", "text_a": "R.", "text_b": "J.", "label": "x"},
    ]


BAD_INPUTS = [
    # (file name, content, kwargs, the message after "<path>")
    ("a.tsv", "sentence\tlabel\nok\t1\ntoo\tmany\tfields\n", {}, r":3: 3 tab-separated fields"),
    ("a.tsv", "sentence\tlabel\nshort\n", {}, r":2: 1 tab-separated fields.*header has 2"),
    ("a.tsv", "text\tlabel\nok\t1\n", {"text_a": "sentence"},
     r":1: no column 'sentence' \(text_a\).*'text', 'label'"),
    ("a.tsv", "words\tlabel\nok\t1\n", {}, r":1: none of the columns.*'words', 'label'"),
    ("a.tsv", "sentence\tlabel\nok\t1\n", {"text_b": "sentence2"},
     r":1: no column 'sentence2' \(text_b\)"),
    ("a.tsv", "sentence\tgold\nok\t1\n", {}, r":1: no label column 'label'.*'sentence', 'gold'"),
    ("a.tsv", "sentence\tlabel\nok\t1\nno label\t\n", {}, r":3: the label column 'label' is empty"),
    ("a.tsv", "sentence\tsentence\tlabel\na\tb\t1\n", {}, r":1: .*more than once"),
    ("a.tsv", "id\tsentence\tlabel\n1\ta\t0\n1\tb\t0\n", {}, r":3: duplicate id '1'.*line 2"),
    ("a.tsv", b"sentence\tlabel\nok\t1\nbad \xff byte\t0\n", {}, r":3: invalid UTF-8 byte 0xff"),
    ("a.tsv", "", {}, r": the file is empty"),
    ("a.tsv", "sentence\tlabel\n", {}, r": no examples \(0 rows read"),
    ("a.jsonl", '{"text": "a", "label": 1}\n{"text": "b", label: 1}\n', {},
     r":2:\d+: invalid JSON"),
    ("a.jsonl", '[{"text": "a", "label": 1}]\n', {}, r":1: a JSON list, not an object"),
    ("a.jsonl", '{"text": "a", "label": 1}\n{"txt": "b", "label": 1}\n', {},
     r":2: no key 'text'; the keys are 'txt', 'label'"),
    ("a.jsonl", '{"text": "a", "label": 1}\n{"text": 5, "label": 1}\n', {},
     r":2: key 'text' must be a string.*int 5"),
    ("a.jsonl", '{"text": "a", "label": 1}\n{"text": "b"}\n', {},
     r":2: no label under key 'label'"),
    ("a.jsonl", '{"text": "a", "label": [1]}\n', {}, r":1: label key 'label' must be"),
    ("a.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": 2, "id": [1]}\n', {},
     r":2: the id must be"),
    ("a.jsonl", b'{"text": "a", "label": 1}\n{"text": "\xc3(", "label": 1}\n', {},
     r":2: invalid UTF-8 byte 0xc3"),
    ("a.jsonl", "\n\n", {}, r": the file is empty"),
    ("a.csv", "sentence,label\nok,1\n", {}, r": cannot tell the format.*\.tsv.*\.jsonl"),
]


@pytest.mark.parametrize("name,content,kwargs,message", BAD_INPUTS,
                         ids=[f"{i}-{m[:24]}" for i, (_, _, _, m) in enumerate(BAD_INPUTS)])
def test_bad_input_names_file_and_line(tmp_path, name, content, kwargs, message):
    path = _write(tmp_path, name, content)
    with pytest.raises(ValueError, match=re.escape(path) + message):
        classification.read_examples(path, **kwargs)


def test_empty_first_text_rows_are_skipped_and_counted_once(tmp_path, caplog):
    path = _write(tmp_path, "a.tsv", "sentence\tlabel\nkept\t1\n\t0\n  \t1\nalso kept\t0\n")
    with caplog.at_level(logging.WARNING, logger="zoo.data.readers.classification"):
        examples = classification.read_examples(path)
    assert [e["text_a"] for e in examples] == ["kept", "also kept"]
    (record,) = caplog.records
    assert "skipped 2 of 4 rows with an empty first text (lines 3, 4)" in record.getMessage()
    only_empty = _write(tmp_path, "b.jsonl", '{"text": "", "label": 1}\n')
    with pytest.raises(ValueError, match=r"b\.jsonl: no examples \(1 rows read, 1 with an empty"):
        classification.read_examples(only_empty)


# --- the label list --------------------------------------------------------------------------


def test_label_vocabulary_explicit_order_or_sorted_found_labels():
    examples = [_example("t", label=x) for x in ("9", "10", "2", "10")] + [_example("u")]
    assert classification.label_vocabulary(examples) == ("2", "9", "10")  # numeric order
    words = [_example("t", label=x) for x in ("neutral", "entailment", "contradiction")]
    assert classification.label_vocabulary(words) == ("contradiction", "entailment", "neutral")
    assert classification.label_vocabulary(words, "neutral, entailment") == ("neutral",
                                                                             "entailment")
    assert classification.label_vocabulary(words, ["b", "a"]) == ("b", "a")
    with pytest.raises(ValueError, match=r"more than once"):
        classification.label_vocabulary(words, "a,b,a")
    with pytest.raises(ValueError, match=r"empty label"):
        classification.label_vocabulary(words, "a,,b")
    with pytest.raises(ValueError, match=r"no labels.*config\.data\.labels"):
        classification.label_vocabulary([_example("t")])


# --- featurization ---------------------------------------------------------------------------


def test_pair_rows_segments_padding_and_longest_first_truncation():
    examples = [
        # 7 + 4 tokens into a budget of 10 - 3 = 7: a loses 3 (7>4, 6>4, 5>4), then on the tie
        # 4 = 4 b loses its last one, as _truncate_seq_pair pops b when neither is longer.
        _example("a b c d e f g", "h i j k", "yes", "cut"),
        _example("a b", "c", "no", "fits"),
        _example("k", "k", None, "unlabelled"),
    ]
    f = classification.featurize(examples, TOK, 10, ["no", "yes"])
    #                                [CLS] a  b  c  d [SEP] h   i   j [SEP]
    np.testing.assert_array_equal(f["input_ids"], [[1, 3, 4, 5, 6, 2, 10, 11, 12, 2],
                                                   [1, 3, 4, 2, 5, 2, 0, 0, 0, 0],
                                                   [1, 13, 2, 13, 2, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(f["token_type_ids"], [[0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
                                                        [0, 0, 0, 0, 1, 1, 0, 0, 0, 0],
                                                        [0, 0, 0, 1, 1, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(f["attention_mask"], [[1] * 10, [1] * 6 + [0] * 4,
                                                        [1] * 5 + [0] * 5])
    np.testing.assert_array_equal(f["label"], [1, 0, -1])
    np.testing.assert_array_equal(f["truncated"], [True, False, False])
    assert {k: (v.dtype, v.shape[0]) for k, v in f.items()} == {
        "input_ids": (np.int32, 3), "token_type_ids": (np.int32, 3),
        "attention_mask": (np.int32, 3), "label": (np.int32, 3), "truncated": (np.bool_, 3)}


def test_pair_truncation_takes_from_the_longer_text_only():
    # 2 + 6 into 5: only b (always the longer) loses tokens.
    f = classification.featurize([_example("a b", "c d e f g h")], TOK, 8, [])
    np.testing.assert_array_equal(f["input_ids"], [[1, 3, 4, 2, 5, 6, 7, 2]])


def test_single_text_rows_are_cut_at_the_end():
    examples = [_example("a b c d e", label="1"), _example("f", label="0")]
    f = classification.featurize(examples, TOK, 5, ["0", "1"])
    np.testing.assert_array_equal(f["input_ids"], [[1, 3, 4, 5, 2], [1, 8, 2, 0, 0]])
    np.testing.assert_array_equal(f["token_type_ids"], np.zeros((2, 5)))
    np.testing.assert_array_equal(f["attention_mask"], [[1] * 5, [1, 1, 1, 0, 0]])
    np.testing.assert_array_equal(f["truncated"], [True, False])
    np.testing.assert_array_equal(f["label"], [1, 0])


def test_featurize_errors():
    with pytest.raises(ValueError, match=r"example 'x' has label 'maybe'.*\['no', 'yes'\].*"
                                         r"config\.data\.labels"):
        classification.featurize([_example("a", label="maybe")], TOK, 8, ["no", "yes"])
    with pytest.raises(ValueError, match=r"max_seq_length=3 must be an int >= 4"):
        classification.featurize([_example("a", "b")], TOK, 3, [])
    with pytest.raises(ValueError, match=r"max_seq_length=2 must be an int >= 3"):
        classification.featurize([_example("a")], TOK, 2, [])
    f = classification.featurize([_example("a b")], TOK, 3, [])
    np.testing.assert_array_equal(f["input_ids"], [[1, 3, 2]])


def test_sentencepiece_rows_hold_the_encoded_texts_between_specials():
    world = make_world(seed=0, num_entities=40)
    documents = generate_documents(world, seed=0)
    sentences = [s for d in documents for s in d.texts]
    tok = tokenizers.train_sentencepiece(sentences, vocab_size=200)
    examples = [_example(sentences[i], sentences[i + 1], id_=str(i)) for i in range(0, 20, 2)]
    L = 80
    f = classification.featurize(examples, tok, L, [])
    for row, ex in enumerate(examples):
        a, b = tok.encode(ex["text_a"]), tok.encode(ex["text_b"])
        assert len(a) + len(b) + 3 <= L  # short synthetic sentences: nothing is cut
        expected = [tok.cls_id, *a, tok.sep_id, *b, tok.sep_id]
        n = len(expected)
        np.testing.assert_array_equal(f["input_ids"][row, :n], expected)
        assert (f["input_ids"][row, n:] == tok.pad_id).all()
        np.testing.assert_array_equal(f["token_type_ids"][row],
                                      [0] * (len(a) + 2) + [1] * (len(b) + 1) + [0] * (L - n))
        np.testing.assert_array_equal(f["attention_mask"][row], [1] * n + [0] * (L - n))
    assert not f["truncated"].any()
