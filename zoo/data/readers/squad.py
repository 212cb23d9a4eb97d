"""SQuAD v1.1 / v2.0: loading (official JSON files or TFDS offline) and BERT-style featurization.

Examples are plain dicts, one per question::

    {"id", "title", "context", "question", "answers": [{"text", "answer_start"}], "is_impossible"}

`featurize` turns them into fixed-length windows exactly as google-research/bert's run_squad.py
does: `[CLS] question [SEP] context-window [SEP]`, long contexts cut into windows `doc_stride`
tokens apart, each context token flagged in the one window where it has the most context
(`_check_is_max_context`), training labels pointing at [CLS] (position 0) when the window misses
the answer or the question is impossible. Two things differ from run_squad, both for the better:
the context is tokenized once with character offsets (any `Tokenizer`, SentencePiece or WordPiece)
instead of whitespace words re-tokenized piece by piece, so an answer's token span is simply the
tokens overlapping its characters; and every window carries those offsets, so post-processing
(zoo/eval/squad_postprocess.py) maps a predicted token span straight back to context text.

Bad input never ends in a bare stack trace: malformed JSON names file, line and column; a
missing or mistyped field names the field and question; duplicate ids are errors. As in
run_squad, questions whose `answer_start` does not point at the answer text are skipped with a
warning and counted; so are questions about empty contexts.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence

import numpy as np

import ml_collections

from zoo import paths
from zoo.data.readers import data_source
from zoo.data.synthetic import squad as synthetic_squad
from zoo.errors import ConfigError, DataError, MissingFileError

_log = logging.getLogger(__name__)

# Feature name -> dtype; every array has a leading window axis N (L = max_seq_length).
FEATURE_DTYPES = {
    "input_ids": np.int32,             # [N, L]
    "token_type_ids": np.int32,        # [N, L] 0 for [CLS] question [SEP], 1 for context [SEP]
    "attention_mask": np.int32,        # [N, L] 1 for real tokens, 0 for padding
    "example_index": np.int32,         # [N] index into the examples
    "offsets": np.int32,               # [N, L, 2] context character span; (-1, -1) elsewhere
    "token_is_max_context": np.bool_,  # [N, L] True where this window is the token's best
    "start_positions": np.int32,       # [N] training only: answer start token, 0 = [CLS]
    "end_positions": np.int32,         # [N] training only: answer end token (inclusive)
}
_MAX_IDS_SHOWN = 5  # question ids named in one summary warning
_READ_CHUNK = 4096  # TFDS records per batched read


# ---------------------------------------------------------------------------------------------
# Loading


def load_squad(source: str | os.PathLike, split: str = "train", data_dir: str = "") -> list[dict]:
    """Examples of an official SQuAD JSON file or a prepared TFDS `squad` dataset.

    Args:
      source: a `.json` file (or any existing file), e.g. 'dev-v2.0.json'; anything else is a
        TFDS name such as 'squad/v1.1' or 'squad/v2.0:3.0.0', read offline from `data_dir`.
      split: TFDS only: 'train', 'validation' or a TFDS slice ('train[:1000]').
      data_dir: TFDS only: the data dir holding the prepared (array_record) dataset; '' means
        TFDS's default.

    Returns:
      One dict per usable question: id, title, context, question, answers (list of {text,
      answer_start}), is_impossible (False throughout for v1.1).

    Raises:
      ValueError: malformed JSON, a missing or mistyped field, a duplicate id, an answerable
        question without answers, or no usable question at all.
      FileNotFoundError: the file, or the TFDS dataset in `data_dir`, does not exist.
    """
    path = os.fspath(source)
    target = paths.as_path(path)  # a TFDS name ('squad/v2.0') is neither a dir nor a file
    if target.is_dir():
        raise ConfigError(f"SQuAD source {path} is a directory; pass one JSON file (e.g. "
                          f"{os.path.join(path, 'dev-v2.0.json')}) or a TFDS name ('squad/v2.0')")
    if path.endswith(".json") or target.is_file():
        return read_squad_json(path)
    return read_squad_tfds(path, split, data_dir)


def load_split(data: ml_collections.ConfigDict, split: str, cache_dir: str) -> list[dict]:
    """Examples of `split` ('train' | 'validation') from config.data.source: the synthetic
    world's questions (written once into cache_dir as official JSON), the JSON file
    config.data.train_file / eval_file names, or TFDS's squad/v<config.data.version>."""
    def synthetic():
        stem = f"squad-v{data.version}-seed{data.seed}-{data.synthetic_entities}"
        return load_squad(data_source.synthetic_file(
            cache_dir, stem, split, ".json",
            lambda: synthetic_squad.squad_splits(data.seed, data.version,
                                                 data.synthetic_entities),
            synthetic_squad.write_squad_json))

    return data_source.load_split(
        data, synthetic=synthetic,
        files=lambda: load_squad(data_source.split_file(data, split, "a SQuAD JSON file")),
        tfds=lambda: load_squad(f"squad/v{data.version}", split, data_dir=data.tfds_data_dir))


def read_squad_json(path: str | os.PathLike) -> list[dict]:
    """Examples of one official-format SQuAD JSON file (see `load_squad`)."""
    path = os.fspath(path)
    try:
        raw = paths.as_path(path).read_bytes()  # local or gs://
    except FileNotFoundError:
        raise MissingFileError(f"SQuAD file {path} does not exist") from None
    try:
        dataset = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: invalid UTF-8 byte 0x{raw[e.start]:02x} at byte {e.start}; "
                        "SQuAD files are UTF-8 JSON") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}:{e.colno}: malformed JSON: {e.msg}; a SQuAD file is "
                        "one JSON object in the official format (fix the file there, or "
                        "re-export it)") from None
    return _checked(_json_examples(dataset, path), path)


_REQUIRED = object()


def _field(record: dict, key: str, types: type | tuple[type, ...], path: str, where: str,
           default=_REQUIRED):
    if not isinstance(record, dict):
        raise DataError(f"{path}: {where} must be a JSON object, found {type(record).__name__}")
    if key not in record:
        if default is not _REQUIRED:
            return default
        raise DataError(f"{path}: {where} has no field {key!r}; the official SQuAD format "
                        "needs it (see https://rajpurkar.github.io/SQuAD-explorer/)")
    value = record[key]
    # bool is an int subclass, but `"answer_start": true` is a broken file, not offset 1.
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _tuple(types)):
        names = " or ".join(t.__name__ for t in _tuple(types))
        raise DataError(f"{path}: field {key!r} of {where} must be {names}, found "
                        f"{type(value).__name__} {value!r:.60}")
    return value


def _tuple(types) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _json_examples(dataset, path: str) -> Iterable[tuple[str, dict]]:
    """(location, example) per question, structure checked field by field."""
    for a, article in enumerate(_field(dataset, "data", list, path, "the top level")):
        where = f"data[{a}]"
        title = _field(article, "title", str, path, where, default="")
        for p, paragraph in enumerate(_field(article, "paragraphs", list, path, where)):
            where = f"data[{a}].paragraphs[{p}] (title {title!r})"
            context = _field(paragraph, "context", str, path, where)
            for q, qa in enumerate(_field(paragraph, "qas", list, path, where)):
                where = f"data[{a}].paragraphs[{p}].qas[{q}]"
                qid = _field(qa, "id", (str, int), path, where)
                where = f"question {str(qid)!r} ({where})"
                example = {
                    "id": str(qid),
                    "title": title,
                    "context": context,
                    "question": _field(qa, "question", str, path, where),
                    "answers": [],
                    "is_impossible": _field(qa, "is_impossible", bool, path, where,
                                            default=False),
                }
                for i, answer in enumerate(_field(qa, "answers", list, path, where)):
                    answer_where = f"answers[{i}] of {where}"
                    example["answers"].append({
                        "text": _field(answer, "text", str, path, answer_where),
                        "answer_start": _field(answer, "answer_start", int, path, answer_where),
                    })
                yield where, example


def read_squad_tfds(name: str, split: str = "train", data_dir: str = "") -> list[dict]:
    """Examples of a TFDS SQuAD dataset ('squad/v1.1', 'squad/v2.0') prepared in `data_dir`.

    Read without TensorFlow and without downloading, through the array_record data source (see
    zoo/data/readers/tfds_source.py for how to prepare one).
    """
    from zoo.data.readers import tfds_source  # TFDS is slow to import; JSON users never pay for it

    builder = tfds_source.open_builder(name, data_dir)
    features = builder.info.features
    missing = [k for k in ("id", "title", "context", "question", "answers") if k not in features]
    if missing:
        raise ConfigError(f"TFDS dataset {name!r} is not SQuAD-shaped: it lacks the feature(s) "
                          f"{', '.join(missing)}; its features are {', '.join(sorted(features))}")
    source = tfds_source.open_split(builder, name, split)
    where = f"TFDS dataset {name!r} split {split!r}"
    return _checked(_tfds_examples(source, where), where)


def _text(value, where: str) -> str:
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: invalid UTF-8 ({e}); rebuild the dataset") from None


def _tfds_examples(source, where: str) -> Iterable[tuple[str, dict]]:
    records = (record for start in range(0, len(source), _READ_CHUNK)
               # Batched reads: several times faster than one record at a time.
               for record in source.__getitems__(
                   list(range(start, min(len(source), start + _READ_CHUNK)))))
    for index, record in enumerate(records):
        qid = _text(record["id"], f"{where} record {index}")
        location = f"question {qid!r} (record {index})"
        answers = record["answers"]
        yield location, {
            "id": qid,
            "title": _text(record["title"], location),
            "context": _text(record["context"], location),
            "question": _text(record["question"], location),
            "answers": [{"text": _text(t, location), "answer_start": int(s)}
                        for t, s in zip(answers["text"], answers["answer_start"])],
            # v1.1 has no such feature: every question is answerable.
            "is_impossible": bool(record.get("is_impossible", False)),
        }


def _checked(examples: Iterable[tuple[str, dict]], source: str) -> list[dict]:
    """The checks every source shares: duplicates, empty contexts, answers that miss."""
    out: list[dict] = []
    seen: dict[str, str] = {}
    empty_context: list[str] = []
    misaligned: list[str] = []
    total = 0
    for where, example in examples:
        total += 1
        qid = example["id"]
        if qid in seen:
            raise DataError(f"{source}: duplicate question id {qid!r} at {where}, first seen at "
                            f"{seen[qid]}; ids must be unique (predictions are keyed by id)")
        seen[qid] = where
        context = example["context"]
        if not context.strip():
            _log.warning("%s: %s of title %r has an empty context; skipping it", source, where,
                         example["title"])
            empty_context.append(qid)
            continue
        if not example["is_impossible"] and not example["answers"]:
            raise DataError(f"{source}: {where} has no answers but is not marked "
                            "is_impossible; add its answer or set \"is_impossible\": true")
        bad = [a for a in example["answers"]
               if context[a["answer_start"]:a["answer_start"] + len(a["text"])] != a["text"]
               or a["answer_start"] < 0]
        if bad:
            a = bad[0]
            found = context[a["answer_start"]:a["answer_start"] + len(a["text"])]
            _log.warning("%s: %s: could not find answer %r at answer_start %d (the context "
                         "there reads %r); skipping the question", source, where, a["text"],
                         a["answer_start"], found)
            misaligned.append(qid)
            continue
        out.append(example)
    for ids, why in ((misaligned, "whose answer_start does not match the answer text"),
                     (empty_context, "with an empty context")):
        if ids:
            _log.warning("%s: skipped %d of %d questions %s (%s%s)", source, len(ids), total, why,
                         ", ".join(ids[:_MAX_IDS_SHOWN]), ", ..." if len(ids) > _MAX_IDS_SHOWN
                         else "")
    if not out:
        raise DataError(f"{source}: no usable questions ({total} read, "
                        f"{len(misaligned) + len(empty_context)} skipped: the warnings above name "
                        "them); each needs a non-empty context and answers whose answer_start is "
                        "the character offset of their text in it")
    return out


# ---------------------------------------------------------------------------------------------
# Featurization


def _doc_spans(num_tokens: int, max_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) windows over the context tokens, as run_squad's sliding window."""
    spans, start = [], 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens)
        spans.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, doc_stride)
    return spans or [(0, 0)]  # a context of no tokens still gets a window (predicts no answer)


def _max_context_span(spans: Sequence[tuple[int, int]], num_tokens: int) -> np.ndarray:
    """For each context token, the index of the window where it has the most context.

    run_squad's _check_is_max_context, vectorised: score = min(tokens left, tokens right) +
    0.01 * window length; the first window wins ties.
    """
    starts = np.array([s for s, _ in spans], np.float64)[:, None]    # (S, 1)
    lengths = np.array([n for _, n in spans], np.float64)[:, None]   # (S, 1)
    position = np.arange(num_tokens, dtype=np.float64)[None, :]     # (1, T)
    left, right = position - starts, starts + lengths - 1 - position   # (S, T)
    score = np.minimum(left, right) + 0.01 * lengths
    score = np.where((left >= 0) & (right >= 0), score, -np.inf)
    return np.argmax(score, axis=0)                                    # (T,) first max wins


def _answer_tokens(example: dict, offsets: np.ndarray) -> tuple[int, int] | None:
    """First and last context token overlapping the first answer's characters (None if none)."""
    answer = example["answers"][0]
    start = answer["answer_start"]
    end = start + len(answer["text"])
    if not 0 <= start <= end <= len(example["context"]):
        raise ValueError(f"example {example['id']!r}: answer span [{start}, {end}) lies outside "
                         f"its context of {len(example['context'])} characters")
    overlapping = np.flatnonzero((offsets[:, 1] > start) & (offsets[:, 0] < end))
    if not len(overlapping):
        return None
    return int(overlapping[0]), int(overlapping[-1])


def featurize(
    examples: Sequence[dict],
    tokenizer,
    *,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
    is_training: bool,
) -> dict[str, np.ndarray]:
    """BERT run_squad features: one row per (example, context window).

    Each row is `[CLS] question [SEP] context-window [SEP]` padded to `max_seq_length`; the
    question is cut to `max_query_length` tokens (with one warning counting them), the context
    is tokenized once and cut into windows of `max_seq_length - len(question) - 3` tokens that
    start `doc_stride` tokens apart, so every context token is in at least one window.

    Args:
      examples: from `load_squad` (or dicts with the same keys).
      tokenizer: a zoo.data.tokenizers.base.Tokenizer (SentencePiece or WordPiece).
      max_seq_length: L, the row length.
      doc_stride: tokens between the starts of consecutive windows.
      max_query_length: longer questions keep their first tokens.
      is_training: add `start_positions`/`end_positions`: the first answer's first and last
        token in the row when the window holds all of it, else 0 ([CLS]); 0 for impossible
        questions.

    Returns:
      numpy arrays keyed as `FEATURE_DTYPES` (the labels only when `is_training`).
    """
    for name, value, low in (("max_seq_length", max_seq_length, 4), ("doc_stride", doc_stride, 1),
                             ("max_query_length", max_query_length, 1)):
        if not isinstance(value, (int, np.integer)) or value < low:
            raise ConfigError(f"{name}={value!r} must be an int >= {low}")
    if max_seq_length <= max_query_length + 3:
        raise ConfigError(
            f"max_seq_length={max_seq_length} leaves no room for context after a question of up "
            f"to max_query_length={max_query_length} tokens plus [CLS] and two [SEP]; make "
            "max_seq_length larger than max_query_length + 3")
    L = int(max_seq_length)
    rows = {k: [] for k in FEATURE_DTYPES if is_training or "positions" not in k}
    tokenized: dict[str, tuple[list[int], np.ndarray]] = {}  # context -> ids, offsets (T, 2)
    truncated: list[str] = []
    unfindable: list[str] = []
    for index, example in enumerate(examples):
        question = tokenizer.encode(example["question"])
        if len(question) > max_query_length:
            truncated.append(example["id"])
            question = question[:max_query_length]
        context = example["context"]
        if context not in tokenized:  # several questions share a paragraph
            ids, offsets = tokenizer.encode_with_offsets(context)
            tokenized[context] = (ids, np.asarray(offsets, np.int32).reshape(-1, 2))
        ids, offsets = tokenized[context]

        answer = None
        if is_training and not example.get("is_impossible", False):
            answer = _answer_tokens(example, offsets)
            if answer is None:
                unfindable.append(example["id"])

        spans = _doc_spans(len(ids), L - len(question) - 3, doc_stride)
        best = _max_context_span(spans, len(ids))
        doc_offset = len(question) + 2  # row position of the window's first context token
        for span_index, (start, length) in enumerate(spans):
            tokens = ([tokenizer.cls_id, *question, tokenizer.sep_id, *ids[start:start + length],
                       tokenizer.sep_id])
            context_rows = slice(doc_offset, doc_offset + length)
            input_ids = np.full(L, tokenizer.pad_id, np.int32)
            input_ids[:len(tokens)] = tokens
            token_type_ids = np.zeros(L, np.int32)
            token_type_ids[doc_offset:len(tokens)] = 1
            attention_mask = np.zeros(L, np.int32)
            attention_mask[:len(tokens)] = 1
            row_offsets = np.full((L, 2), -1, np.int32)
            row_offsets[context_rows] = offsets[start:start + length]
            max_context = np.zeros(L, np.bool_)
            max_context[context_rows] = best[start:start + length] == span_index

            rows["input_ids"].append(input_ids)
            rows["token_type_ids"].append(token_type_ids)
            rows["attention_mask"].append(attention_mask)
            rows["example_index"].append(index)
            rows["offsets"].append(row_offsets)
            rows["token_is_max_context"].append(max_context)
            if is_training:
                # The answer must lie wholly inside the window, else the label is [CLS].
                inside = answer is not None and start <= answer[0] and answer[1] < start + length
                rows["start_positions"].append(answer[0] - start + doc_offset if inside else 0)
                rows["end_positions"].append(answer[1] - start + doc_offset if inside else 0)

    too_long = f"longer than max_query_length={max_query_length} tokens were truncated to it"
    for ids, why in ((truncated, too_long),
                     (unfindable, "have an answer that covers no token (labelled [CLS])")):
        if ids:
            _log.warning("%d of %d questions %s (%s%s)", len(ids), len(examples), why,
                         ", ".join(ids[:_MAX_IDS_SHOWN]),
                         ", ..." if len(ids) > _MAX_IDS_SHOWN else "")
    shapes = {"example_index": (), "start_positions": (), "end_positions": (), "offsets": (L, 2)}
    return {k: (np.stack(v).astype(FEATURE_DTYPES[k]) if v
                else np.zeros((0, *shapes.get(k, (L,))), FEATURE_DTYPES[k]))
            for k, v in rows.items()}
