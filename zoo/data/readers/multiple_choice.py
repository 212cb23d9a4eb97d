"""Multiple-choice data (SWAG / RACE / story-cloze shaped): a context, K options, and the index
of the right one. Read from TSV / JSON Lines files (the synthetic set,
zoo.data.synthetic.multiple_choice, is written as JSON Lines and read back the same way).

Examples are plain dicts::

    {"id": str, "context": str, "options": [str, ...], "label": "0" .. "K-1"}

Files: a TSV with a header row (fields split on tabs, no quoting, as zoo.data.readers.classification
reads GLUE) whose option columns are named by `choices` ("ending0,ending1,ending2,ending3"), or
JSON Lines whose `choices` is either one key holding the list of options or several keys each
holding one. The label is the right option's 0-based index (an integer, or its decimal string).
Every error names the file and line.
"""

from __future__ import annotations

import csv
import json
import os

import ml_collections

from zoo.data.readers import data_source, text_files
from zoo.data.synthetic import multiple_choice as synthetic_multiple_choice
from zoo.errors import ConfigError, DataError

CONTEXT_COLUMNS = ("context", "premise", "question", "sentence", "text", "startphrase")
_FORMATS = {".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}
_ID_COLUMNS = ("id", "idx", "index")


def _label(path: str, line: int, value, k: int) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise DataError(  # noqa: TRY004  (a bad file, not a bad argument)
            f"{path}:{line}: the label must be the right option's index, found "
            f"{type(value).__name__} {value!r:.60}")
    text = str(value).strip()
    if not text.isdigit() or int(text) >= k:
        raise DataError(f"{path}:{line}: label {value!r} is not an option index 0..{k - 1}; "
                        "the label names the right option by its 0-based position")
    return str(int(text))


def _context_key(path: str, line: int, found: list[str], context: str) -> str:
    if context:
        if context not in found:
            raise DataError(f"{path}:{line}: no column/key {context!r} (the context); found "
                            f"{found}")
        return context
    present = [c for c in CONTEXT_COLUMNS if c in found]
    if not present:
        raise DataError(f"{path}:{line}: none of {', '.join(CONTEXT_COLUMNS)} is present; "
                        f"found {found}; name the context's column/key with text_a")
    return present[0]


def _tsv(path: str, text: str, context: str, choices: list[str], label: str):
    lines = text_files.split_lines(text)
    if not lines or not lines[0].strip():
        raise DataError(f"{path}: the file is empty; a TSV file needs a header row, then one "
                        "example per line")
    rows = csv.reader(lines, delimiter="\t", quoting=csv.QUOTE_NONE)
    header = next(rows)
    context = _context_key(path, 1, header, context)
    missing = [c for c in choices + [label] if c not in header]
    if missing:
        raise DataError(f"{path}:1: no column(s) {missing}; the columns are {header}; name the "
                        "options with choices='a,b,...' and the answer's index with label")
    index = {c: i for i, c in enumerate(header)}
    id_column = next((c for c in _ID_COLUMNS if c in index), "")
    for line, fields in enumerate(rows, start=2):
        if not fields:
            continue
        if len(fields) != len(header):
            raise DataError(f"{path}:{line}: {len(fields)} tab-separated fields, the header has "
                            f"{len(header)}; a text holding a tab breaks a TSV row (use JSONL)")
        yield line, {"id": fields[index[id_column]] if id_column else "",
                     "context": fields[index[context]],
                     "options": [fields[index[c]] for c in choices],
                     "label": _label(path, line, fields[index[label]], len(choices))}


def _jsonl(path: str, text: str, context: str, choices: list[str], label: str):
    key = None
    for line, obj in text_files.json_lines(path, text):
        if key is None:
            key = _context_key(path, line, list(obj), context)
        missing = [k for k in [key, *choices, label] if k not in obj]
        if missing:
            raise DataError(f"{path}:{line}: no key(s) {missing}; the keys are {list(obj)}")
        options = obj[choices[0]] if len(choices) == 1 else [obj[c] for c in choices]
        if (not isinstance(options, list) or len(options) < 2
                or not all(isinstance(o, str) for o in options)):
            raise DataError(f"{path}:{line}: the options ({', '.join(choices)}) must be two or "
                            f"more strings, found {options!r:.80}")
        if not isinstance(obj[key], str):
            raise DataError(f"{path}:{line}: the context {key!r} must be a string")  # noqa: TRY004
        own_id = next((obj[k] for k in _ID_COLUMNS if k in obj), "")
        yield line, {"id": str(own_id), "context": obj[key], "options": options,
                     "label": _label(path, line, obj[label], len(options))}


def read_examples(path: str | os.PathLike, *, choices: str, context: str = "",
                  label: str = "label") -> list[dict]:
    """Multiple-choice examples of a `.tsv` (header row) or `.jsonl` file.

    Args:
      path: the file.
      choices: comma-separated option columns (TSV) or keys (JSONL); one JSONL key may hold
        the whole list.
      context: the context's column / key; '' picks the first of CONTEXT_COLUMNS present.
      label: the column / key of the right option's 0-based index.

    Returns:
      {"id", "context", "options", "label"} per row; the id is the row's own id / idx / index
      field, else "<file name>:<line>".

    Raises:
      ValueError: naming the file and line: unknown extension, missing column or key, a bad
        label, options that are not strings, a duplicate id, or no rows.
    """
    path = os.fspath(path)
    names = [c.strip() for c in choices.split(",") if c.strip()]
    if not names:
        raise ConfigError("choices is empty; name the option columns ('ending0,ending1') or the "
                          "JSONL key holding the list of options")
    kind = _FORMATS.get(os.path.splitext(path)[1].lower())
    if kind is None:
        raise DataError(f"{path}: cannot tell the format from the extension; name the file "
                        ".tsv or .jsonl")
    if kind == "tsv" and len(names) < 2:
        raise ConfigError(f"{path}: a TSV file needs two or more option columns in choices, got "
                          f"{names}")
    text = text_files.read_utf8(path, "multiple-choice data file")
    reader = _tsv if kind == "tsv" else _jsonl
    examples, seen = [], {}
    for line, record in reader(path, text, context, names, label):
        record["id"] = record["id"] or f"{os.path.basename(path)}:{line}"
        if record["id"] in seen:
            raise DataError(f"{path}:{line}: duplicate id {record['id']!r}, first seen on line "
                            f"{seen[record['id']]}")
        seen[record["id"]] = line
        examples.append(record)
    if not examples:
        raise DataError(f"{path}: no examples; the file needs at least one row")
    return examples


def load_split(data: ml_collections.ConfigDict, split: str, cache_dir: str) -> list[dict]:
    """Multiple-choice examples of `split` ('train' | 'validation') from config.data.source:
    the synthetic fact_check options (written once into cache_dir as JSON Lines), or the file
    config.data.train_file / eval_file names (options config.data.choices, context
    config.data.text_a, label config.data.label)."""
    def synthetic():
        path = data_source.synthetic_file(
            cache_dir, f"multiple_choice-seed{data.seed}-{data.synthetic_entities}", split,
            ".jsonl", lambda: synthetic_multiple_choice.multiple_choice_splits(
                data.seed, data.synthetic_entities), write_jsonl)
        return read_examples(path, choices="options", context="context")

    def files():
        return read_examples(data_source.split_file(data, split, "a .tsv or .jsonl file"),
                             choices=data.choices, context=data.text_a, label=data.label)

    return data_source.load_split(data, synthetic=synthetic, files=files)


def write_jsonl(path: str, examples: list[dict]) -> None:
    """Writes examples as JSON Lines that `read_examples(path, choices='options')` reads back."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines(json.dumps({"id": ex["id"], "context": ex["context"],
                                 "options": ex["options"], "label": int(ex["label"])},
                                ensure_ascii=False) + "\n" for ex in examples)
