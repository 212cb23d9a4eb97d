"""Sentence(-pair) classification data, GLUE-style: loading TSV / JSON Lines files and BERT's
classifier featurization.

Examples are plain dicts, one per row::

    {"id": str, "text_a": str, "text_b": str | None, "label": str | None}

`read_examples` reads the files GLUE ships (a header row, tab-separated fields, no quoting: a
`"` is an ordinary character, as in run_classifier.py's `_read_tsv`) and JSON Lines (SuperGLUE,
HF `datasets.to_json`). Columns are named by the caller or detected from GLUE's usual names.
Labels stay strings ("0", "entailment"); `label_vocabulary` fixes their order and `featurize`
turns them into indices.

`featurize` is run_classifier.py's `convert_single_example`: `[CLS] a [SEP]` or
`[CLS] a [SEP] b [SEP]`, segment 0 up to and including the first [SEP], a pair cut longest-first
one token at a time (`_truncate_seq_pair`), padded to `max_seq_length`.

Bad input never ends in a bare stack trace: every error names the file and line (and the column
or key) and says what to do. Rows with an empty first text are skipped and counted in one
warning, as run_squad skips answers it cannot find.
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Sequence

import ml_collections
import numpy as np

from zoo.data.readers import data_source, text_files
from zoo.data.synthetic import classification as synthetic_classification
from zoo.errors import ConfigError, DataError

_log = logging.getLogger(__name__)

# Auto-detection order of the text columns (GLUE / SuperGLUE / HF datasets names).
TEXT_A_COLUMNS = ("sentence", "sentence1", "question", "question1", "premise", "text", "text_a")
TEXT_B_COLUMNS = ("sentence2", "question2", "hypothesis", "text_b")
# A row's own id, first found wins; else "<file name>:<line>". GLUE's test files number their
# rows in an "index" column, which is what a submission must echo back.
_ID_COLUMNS = ("id", "idx", "index")
_NO_TEXT_B = "none"
_FORMATS = {".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}
_MAX_SHOWN = 5  # line numbers / ids named in one summary warning


def _resolve_columns(path: str, line: int, found: Sequence[str], text_a: str, text_b: str,
                     label: str, require_labels: bool, what: str) -> tuple[str, str, str]:
    """(text_a, text_b, label) column names; '' for text_b / label when there is none."""
    listed = ", ".join(repr(c) for c in found)
    if text_a:
        if text_a not in found:
            raise DataError(f"{path}:{line}: no {what} {text_a!r} (text_a); the {what}s found "
                            f"are {listed}; pass the name of the first text's {what} as text_a "
                            "(config.data.text_a)")
    else:
        present = [c for c in TEXT_A_COLUMNS if c in found]
        if not present:
            hint = (" (is the header row missing? GLUE's CoLA files have none: add one)"
                    if what == "column" else "")
            raise DataError(f"{path}:{line}: none of the {what}s {', '.join(TEXT_A_COLUMNS)} "
                            f"is present{hint}; the {what}s found are {listed}; name the first "
                            "text's with text_a (config.data.text_a)")
        text_a = present[0]
    if text_b.lower() == _NO_TEXT_B:
        text_b = ""
    elif text_b:
        if text_b not in found:
            raise DataError(f"{path}:{line}: no {what} {text_b!r} (text_b); the {what}s found "
                            f"are {listed}; pass the second text's {what} as text_b "
                            "(config.data.text_b), or text_b='none' for single-sentence tasks")
    else:
        text_b = next((c for c in TEXT_B_COLUMNS if c in found and c != text_a), "")
        others = [c for c in TEXT_A_COLUMNS if c in found and c != text_a]
        if not text_b and others:
            # QNLI has "question" and "sentence": taking one as a single text would silently
            # drop the other.
            raise DataError(
                f"{path}:{line}: both {text_a!r} and {others[0]!r} could be the text; name them "
                f"with text_a and text_b (QNLI: text_a='question', text_b='sentence'), or pass "
                "text_b='none' for a single-sentence task")
    if label not in found:
        if require_labels:
            raise DataError(f"{path}:{line}: no label {what} {label!r}; the {what}s found are "
                            f"{listed}; name the label's {what} with label (config.data.label; "
                            "an unlabelled test file needs require_labels=False)")
        label = ""
    return text_a, text_b, label


def _tsv_records(path: str, text: str, text_a: str, text_b: str, label: str,
                 require_labels: bool):
    """(line, record) per data row, with record keys text_a / text_b / label / id."""
    lines = text_files.split_lines(text)
    if not lines or not lines[0].strip():
        raise DataError(f"{path}: the file is empty; a TSV file needs a header row naming its "
                        "columns, then one example per line")
    # QUOTE_NONE, as GLUE's processors read: a '"' is an ordinary character of a sentence.
    rows = csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)
    header = next(rows)
    duplicated = sorted({c for c in header if header.count(c) > 1})
    if duplicated:
        raise DataError(f"{path}:1: the header names column(s) {duplicated} more than once; "
                        "column names must be unique")
    text_a, text_b, label = _resolve_columns(path, 1, header, text_a, text_b, label,
                                             require_labels, "column")
    index = {c: i for i, c in enumerate(header)}
    id_column = next((c for c in _ID_COLUMNS if c in index), "")
    for line, fields in enumerate(rows, start=2):
        if not fields:
            continue  # a blank line
        if len(fields) != len(header):
            raise DataError(
                f"{path}:{line}: {len(fields)} tab-separated fields, the header has "
                f"{len(header)} ({', '.join(header)}); a text holding a tab or newline breaks a "
                "TSV row: remove it from the text, or write the file as JSON Lines")
        record = {"text_a": fields[index[text_a]],
                  "text_b": fields[index[text_b]] if text_b else None,
                  "label": (fields[index[label]] or None) if label else None,
                  "id": fields[index[id_column]] if id_column else ""}
        if record["label"] is None and require_labels:
            raise DataError(f"{path}:{line}: the label column {label!r} is empty; every row "
                            "needs a label (an unlabelled test file needs require_labels=False)")
        yield line, record


def _json_text(path: str, line: int, obj: dict, key: str) -> str:
    if key not in obj:
        raise DataError(f"{path}:{line}: no key {key!r}; the keys are "
                        f"{', '.join(repr(k) for k in obj)}; every line needs the same keys")
    value = obj[key]
    if not isinstance(value, str):
        # A bad file, not a bad argument: ValueError like every other input error.
        raise DataError(  # noqa: TRY004
            f"{path}:{line}: key {key!r} must be a string (a text), found "
            f"{type(value).__name__} {value!r:.60}")
    return value


def _json_label(path: str, line: int, obj: dict, key: str, require_labels: bool) -> str | None:
    value = obj.get(key) if key else None
    if value is None:
        if require_labels:
            raise DataError(f"{path}:{line}: no label under key {key!r}; every line needs one "
                            "(an unlabelled test file needs require_labels=False)")
        return None
    if isinstance(value, bool):  # before int: bool is an int subclass, and str(True) is "True"
        return "true" if value else "false"
    if isinstance(value, (str, int)):
        return str(value)
    raise DataError(f"{path}:{line}: label key {key!r} must be a string or an integer class, "
                    f"found {type(value).__name__} {value!r:.60}")


def _jsonl_records(path: str, text: str, text_a: str, text_b: str, label: str,
                   require_labels: bool):
    columns = None
    for line, obj in text_files.json_lines(path, text):
        if columns is None:  # the first record's keys name the fields of every record
            columns = _resolve_columns(path, line, list(obj), text_a, text_b, label,
                                       require_labels, "key")
        key_a, key_b, key_label = columns
        own_id = next((obj[k] for k in _ID_COLUMNS if k in obj), "")
        if not isinstance(own_id, (str, int)) or isinstance(own_id, bool):
            # A bad file, not a bad argument: ValueError like every other input error.
            raise DataError(  # noqa: TRY004
                f"{path}:{line}: the id must be a string or integer, found "
                f"{type(own_id).__name__} {own_id!r:.60}")
        yield line, {"text_a": _json_text(path, line, obj, key_a),
                     "text_b": _json_text(path, line, obj, key_b) if key_b else None,
                     "label": _json_label(path, line, obj, key_label, require_labels),
                     "id": str(own_id)}
    if columns is None:
        raise DataError(f"{path}: the file is empty; a JSON Lines file holds one JSON object "
                        "per line")


def read_examples(path: str | os.PathLike, *, text_a: str = "", text_b: str = "",
                  label: str = "label", require_labels: bool = True) -> list[dict]:
    """Examples of a GLUE-style `.tsv` file or a JSON Lines file (`.jsonl` / `.json`).

    Args:
      path: a TSV file with a header row (fields split on tabs, no quoting, as GLUE's
        processors read), or JSON Lines (one object per line; the first line's keys are used for
        detection).
      text_a: the first text's column / key; '' picks the first of `TEXT_A_COLUMNS` present.
      text_b: the second text's; '' picks the first of `TEXT_B_COLUMNS` present (none present:
        a single-sentence task); 'none' forces a single-sentence task.
      label: the label's column / key.
      require_labels: False for unlabelled (test) files: a missing label column or value gives
        label None instead of an error.

    Returns:
      {"id", "text_a", "text_b" (None for single sentences), "label" (a string, or None)} per
      row; the id is the row's own "id" / "idx" / "index" field if it has one, else
      "<file name>:<line>". Rows whose text_a is blank are skipped, with one warning.

    Raises:
      ValueError: naming the file and line, for an unknown extension, invalid UTF-8, a missing
        column or key, a row with the wrong number of fields, invalid JSON, a non-string text,
        a missing label (when required), a duplicate id, or no rows.
    """
    path = os.fspath(path)
    text_a, text_b = text_a or "", text_b or ""  # None from a config means "detect"
    kind = _FORMATS.get(os.path.splitext(path)[1].lower())
    if kind is None:
        raise DataError(f"{path}: cannot tell the format from the extension; name the file "
                        ".tsv (GLUE-style, with a header row) or .jsonl (JSON Lines)")
    text = text_files.read_utf8(path, "classification data file")
    reader = _tsv_records if kind == "tsv" else _jsonl_records
    basename = os.path.basename(path)
    examples: list[dict] = []
    seen: dict[str, int] = {}
    empty: list[int] = []
    total = 0
    for line, record in reader(path, text, text_a, text_b, label, require_labels):
        total += 1
        if not record["text_a"].strip():
            empty.append(line)
            continue
        example_id = record["id"] or f"{basename}:{line}"
        if example_id in seen:
            raise DataError(f"{path}:{line}: duplicate id {example_id!r}, first seen on line "
                            f"{seen[example_id]}; ids must be unique (predictions are keyed "
                            "by them)")
        seen[example_id] = line
        examples.append({"id": example_id, "text_a": record["text_a"],
                         "text_b": record["text_b"], "label": record["label"]})
    if empty:
        _log.warning("%s: skipped %d of %d rows with an empty first text (lines %s%s)", path,
                     len(empty), total, ", ".join(map(str, empty[:_MAX_SHOWN])),
                     ", ..." if len(empty) > _MAX_SHOWN else "")
    if not examples:
        raise DataError(f"{path}: no examples ({total} rows read, {len(empty)} with an empty "
                        "first text); the file needs at least one row after the header")
    return examples


def load_split(data: ml_collections.ConfigDict, split: str, cache_dir: str) -> list[dict]:
    """Labelled examples of `split` ('train' | 'validation') from config.data.source: the
    synthetic world's config.data.synthetic_task (written once into cache_dir as TSV), or the
    GLUE-style file config.data.train_file / eval_file names."""
    def synthetic():
        stem = f"classify-{data.synthetic_task}-seed{data.seed}-{data.synthetic_entities}"
        return data_source.synthetic_file(
            cache_dir, stem, split, ".tsv",
            lambda: synthetic_classification.classification_splits(
                data.seed, data.synthetic_task, data.synthetic_entities),
            synthetic_classification.write_examples)

    def files():
        return data_source.split_file(data, split, "a GLUE-style .tsv or .jsonl file")

    path = data_source.load_split(data, synthetic=synthetic, files=files)
    return read_examples(path, text_a=data.text_a, text_b=data.text_b, label=data.label)


def label_vocabulary(examples: Sequence[dict], labels: str | Sequence[str] = ""
                     ) -> tuple[str, ...]:
    """The label list, whose order defines the class indices.

    Args:
      examples: from `read_examples`; used only when `labels` is empty.
      labels: the labels in order, as a comma-separated string ("entailment,neutral,
        contradiction") or a sequence; '' / () takes the labels found in `examples`, sorted
        (numerically when all are integers, so "10" comes after "9").
    """
    if isinstance(labels, str):
        given = [x.strip() for x in labels.split(",")] if labels.strip() else []
    else:
        given = [str(x) for x in labels]
    if given:
        if any(not x for x in given):
            raise ConfigError(f"labels={labels!r} holds an empty label; list them separated by "
                              "commas, e.g. 'entailment,neutral,contradiction'")
        duplicated = sorted({x for x in given if given.count(x) > 1})
        if duplicated:
            raise ConfigError(f"labels={labels!r} lists {duplicated} more than once")
        return tuple(given)
    found = {ex["label"] for ex in examples if ex["label"] is not None}
    if not found:
        raise ConfigError("the examples have no labels to build the label list from; pass the "
                          "labels explicitly (config.data.labels)")
    try:
        return tuple(sorted(found, key=int))
    except ValueError:
        return tuple(sorted(found))


def _truncate_pair(a: list[int], b: list[int], max_length: int) -> bool:
    """run_classifier's _truncate_seq_pair: drop the last token of the longer text (of b on a
    tie) until both fit; True if anything was dropped."""
    truncated = False
    while len(a) + len(b) > max_length:
        (a if len(a) > len(b) else b).pop()
        truncated = True
    return truncated


def featurize(examples: Sequence[dict], tokenizer, max_seq_length: int,
              label_list: Sequence[str]) -> dict[str, np.ndarray]:
    """BERT run_classifier features, one row per example.

    Args:
      examples: from `read_examples` (dicts with id, text_a, text_b, label).
      tokenizer: a zoo.data.tokenizers.base.Tokenizer (needs encode, cls_id, sep_id, pad_id).
      max_seq_length: L, the row length, [CLS] and [SEP]s included.
      label_list: from `label_vocabulary`; a label's index is its class.

    Returns:
      int32 `input_ids`, `token_type_ids` (0 for [CLS] a [SEP], 1 for b [SEP]) and
      `attention_mask` of shape [N, L]; int32 `label` [N] (-1 for an unlabelled example); bool
      `truncated` [N] (the texts did not fit and lost their last tokens).
    """
    pairs = any(ex["text_b"] is not None for ex in examples)
    low = 4 if pairs else 3
    if not isinstance(max_seq_length, (int, np.integer)) or max_seq_length < low:
        raise ConfigError(
            f"max_seq_length={max_seq_length!r} must be an int >= {low}: [CLS] and "
            f"{'two [SEP]' if pairs else '[SEP]'} leave no room for text below that")
    L = int(max_seq_length)
    index = {label: i for i, label in enumerate(label_list)}
    n = len(examples)
    input_ids = np.full((n, L), tokenizer.pad_id, np.int32)
    token_type_ids = np.zeros((n, L), np.int32)
    attention_mask = np.zeros((n, L), np.int32)
    labels = np.full(n, -1, np.int32)
    truncated = np.zeros(n, np.bool_)
    for row, example in enumerate(examples):
        label = example["label"]
        if label is not None:
            if label not in index:
                raise DataError(
                    f"example {example['id']!r} has label {label!r}, which is not among the "
                    f"known labels {list(label_list)}; list every label in config.data.labels")
            labels[row] = index[label]
        a = list(tokenizer.encode(example["text_a"]))
        if example["text_b"] is None:
            truncated[row] = len(a) > L - 2
            tokens, first = [tokenizer.cls_id, *a[:L - 2], tokenizer.sep_id], L
        else:
            b = list(tokenizer.encode(example["text_b"]))
            truncated[row] = _truncate_pair(a, b, L - 3)
            tokens = [tokenizer.cls_id, *a, tokenizer.sep_id, *b, tokenizer.sep_id]
            first = len(a) + 2  # [CLS] a [SEP] is segment 0
        input_ids[row, :len(tokens)] = tokens
        token_type_ids[row, first:len(tokens)] = 1
        attention_mask[row, :len(tokens)] = 1
    if truncated.any():
        ids = [examples[i]["id"] for i in np.flatnonzero(truncated)[:_MAX_SHOWN]]
        _log.warning("%d of %d examples were longer than max_seq_length=%d tokens and were "
                     "truncated (%s%s)", int(truncated.sum()), n, L, ", ".join(ids),
                     ", ..." if truncated.sum() > _MAX_SHOWN else "")
    return {"input_ids": input_ids, "token_type_ids": token_type_ids,
            "attention_mask": attention_mask, "label": labels, "truncated": truncated}
