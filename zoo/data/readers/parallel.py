"""Parallel text for translation: reading and writing sentence pairs, and seq2seq features.

Two file layouts, both UTF-8 with one sentence per line and no header:

* one TSV file, `source<TAB>target` per line (or any two columns of a wider file, e.g. the
  Tatoeba / Anki exports `English<TAB>French<TAB>attribution`); no quoting, a '"' is an
  ordinary character;
* two aligned plain-text files, line i of one translating line i of the other (WMT, OPUS).

Texts are stripped of surrounding whitespace. A pair with an empty side is skipped with one
warning counting them; every other bad input is a ValueError naming the file and line and
saying what to do.

`encode_pairs` builds teacher-forcing features for an encoder-decoder: the source ends in EOS;
the decoder reads `[BOS] y` and predicts `y [EOS]`, the same tokens shifted by one. Source and
target share one tokenizer (`joint_tokenizer_texts` trains it on both sides), so one vocabulary
and, if the model wants, one embedding serve both.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence

import ml_collections
import numpy as np

from zoo.data.readers import data_source, text_files
from zoo.data.synthetic import translation as synthetic_translation
from zoo.errors import ConfigError, DataError

_log = logging.getLogger(__name__)

_MAX_SHOWN = 5  # line numbers named in one summary warning
_LINE_BREAKS = ("\n", "\r")


def _decoded_lines(path: str) -> list[str]:
    """The file's lines, without line ends; an empty file is an error."""
    lines = text_files.split_lines(text_files.read_utf8(path, "parallel text file"))
    if not lines:
        raise DataError(f"{path}: the file is empty; expected one sentence (pair) per line")
    return lines


def _tsv_pairs(path: str, source_column: int, target_column: int
               ) -> Iterator[tuple[int, str, str]]:
    needed = max(source_column, target_column) + 1
    for line, text in enumerate(_decoded_lines(path), start=1):
        if not text.strip():
            yield line, "", ""  # a blank line: skipped and counted, not an error
            continue
        fields = text.split("\t")
        if len(fields) < needed:
            what = "no tab" if len(fields) == 1 else f"{len(fields)} tab-separated fields"
            raise DataError(
                f"{path}:{line}: {what}, but source_column={source_column} and "
                f"target_column={target_column} need {needed} fields; write one pair per line "
                "as source<TAB>target (a text holding a tab breaks the row: write two aligned "
                "files instead and pass target_file)")
        yield line, fields[source_column], fields[target_column]


def _two_file_pairs(source: str, target: str) -> Iterator[tuple[int, str, str]]:
    source_lines, target_lines = _decoded_lines(source), _decoded_lines(target)
    if len(source_lines) != len(target_lines):
        raise DataError(
            f"{source} has {len(source_lines)} lines but {target} has {len(target_lines)}; "
            "aligned files need one line per sentence in both (line "
            f"{min(len(source_lines), len(target_lines)) + 1} is the first without a partner)")
    yield from zip(range(1, len(source_lines) + 1), source_lines, target_lines)


def read_parallel(source: str | os.PathLike, *, target_file: str | os.PathLike = "",
                  source_column: int = 0, target_column: int = 1) -> list[tuple[str, str]]:
    """(source, target) sentence pairs of a TSV file or of two aligned text files.

    Args:
      source: a TSV file of pairs, or (with `target_file`) the source-language text file.
      target_file: the target-language file aligned line by line with `source`; '' reads
        `source` as TSV.
      source_column: TSV only: the 0-based column of the source text.
      target_column: TSV only: the column of the target text; extra columns are ignored.

    Returns:
      The pairs in file order, texts stripped; pairs with an empty side are skipped, with one
      warning naming how many and where.

    Raises:
      FileNotFoundError: a file does not exist.
      ValueError: naming the file (and line) for invalid UTF-8, an empty file, a TSV line with
        too few fields, aligned files of different line counts, or no pairs at all.
    """
    path = os.fspath(source)
    target_path = os.fspath(target_file) if target_file else ""
    for name, value in (("source_column", source_column), ("target_column", target_column)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{name}={value!r} must be a column index >= 0")
    if source_column == target_column:
        raise ConfigError(f"source_column and target_column are both {source_column}; a pair "
                          "needs two different columns")
    if target_path:
        if (source_column, target_column) != (0, 1):
            raise ConfigError("source_column / target_column apply to a TSV file only; with "
                              "target_file each file holds one text per line")
        rows, where = _two_file_pairs(path, target_path), f"{path} / {target_path}"
    else:
        rows, where = _tsv_pairs(path, source_column, target_column), path
    pairs, empty, total = [], [], 0
    for line, src, tgt in rows:
        total += 1
        src, tgt = src.strip(), tgt.strip()
        if src and tgt:
            pairs.append((src, tgt))
        else:
            empty.append(line)
    if empty:
        _log.warning("%s: skipped %d of %d lines with an empty source or target (lines %s%s)",
                     where, len(empty), total, ", ".join(map(str, empty[:_MAX_SHOWN])),
                     ", ..." if len(empty) > _MAX_SHOWN else "")
    if not pairs:
        raise DataError(f"{where}: no sentence pairs ({total} lines, all with an empty source "
                        "or target)")
    return pairs


def load_split(data: ml_collections.ConfigDict, split: str, cache_dir: str
               ) -> list[tuple[str, str]]:
    """(source, target) pairs of `split` ('train' | 'validation') from config.data.source: the
    synthetic arithmetic task (written once into cache_dir as TSV), config.data.train_file /
    eval_file (a TSV, or the source side with train_target_file / eval_target_file), or the
    TFDS dataset config.data.tfds_name."""
    def synthetic():
        operations = "".join(data.synthetic_operations)
        stem = (f"arith-seed{data.seed}-{data.synthetic_pairs}-max{data.synthetic_max_operand}-"
                f"{operations.replace('/', 'd').replace('*', 'x')}")
        return read_parallel(data_source.synthetic_file(
            cache_dir, stem, split, ".tsv",
            lambda: synthetic_translation.translation_splits(
                data.seed, data.synthetic_pairs, data.synthetic_max_operand,
                tuple(data.synthetic_operations)),
            write_parallel_tsv))

    def files():
        prefix = "train" if split == "train" else "eval"
        path = data_source.split_file(
            data, split, f"a TSV of source<TAB>target lines, or the source side with "
            f"config.data.{prefix}_target_file")
        return read_parallel(path, target_file=data[f"{prefix}_target_file"])

    def tfds():
        key = "tfds_train_split" if split == "train" else "tfds_validation_split"
        return read_parallel_tfds(data.tfds_name, data[key], data.tfds_data_dir,
                                  source_lang=data.source_lang, target_lang=data.target_lang,
                                  max_records=data.tfds_max_records)

    return data_source.load_split(data, synthetic=synthetic, files=files, tfds=tfds)


def read_parallel_tfds(name: str, split: str, data_dir: str = "", *, source_lang: str = "",
                       target_lang: str = "", max_records: int = 0) -> list[tuple[str, str]]:
    """(source, target) pairs of a TFDS translation dataset prepared in a local `data_dir`
    (e.g. 'wmt14_translate/de-en', 'wmt_t2t_translate/de-en'), read without TensorFlow.

    Args:
      name: the dataset ('name/config[:version]').
      split: a split name or TFDS slicing ('validation', 'train[:1%]').
      data_dir: the TFDS data dir; '' = TFDS's default.
      source_lang, target_lang: the features (languages) to pair; '' = the dataset's
        supervised keys (wmt14_translate/de-en: 'de' -> 'en').
      max_records: 0 = all; N = the first N records.

    Raises:
      FileNotFoundError: the dataset is not prepared there (the message says how).
      ValueError: a language the dataset lacks (the message lists its features), or a split
        it cannot read.
    """
    from zoo.data.readers import tfds_source  # TFDS is slow to import; file users never pay for it

    builder = tfds_source.open_builder(name, data_dir)
    supervised = builder.info.supervised_keys or ("", "")
    source_lang, target_lang = source_lang or supervised[0], target_lang or supervised[1]
    features = sorted(builder.info.features.keys())
    for key, lang in (("source_lang", source_lang), ("target_lang", target_lang)):
        if lang not in features:
            raise ConfigError(f"TFDS dataset {name!r} has no language feature {lang!r}; its "
                              f"features are {', '.join(features)}: set config.data.{key}")
    records = tfds_source.open_split(builder, name, split)
    count = len(records) if not max_records else min(max_records, len(records))
    pairs, skipped = [], 0
    for i in range(count):
        record = records[i]
        src, tgt = (record[k].decode("utf-8") if isinstance(record[k], bytes) else str(record[k])
                    for k in (source_lang, target_lang))
        src, tgt = src.strip(), tgt.strip()
        if src and tgt and not any(c in t for t in (src, tgt) for c in _LINE_BREAKS):
            pairs.append((src, tgt))
        else:
            skipped += 1
    if skipped:
        _log.warning("TFDS dataset %r split %r: skipped %d of %d records with an empty side or "
                     "a line break", name, split, skipped, count)
    if not pairs:
        raise DataError(f"TFDS dataset {name!r} split {split!r}: no sentence pairs")
    return pairs


def _checked_pairs(pairs: Sequence[tuple[str, str]], path: str, forbidden: tuple[str, ...]):
    if not pairs:
        raise ValueError(f"{path}: no pairs to write; a file needs at least one")
    for i, pair in enumerate(pairs):
        if len(pair) != 2:
            raise ValueError(f"{path}: pairs[{i}] = {pair!r:.80} is not a (source, target) pair")
        for side, text in zip(("source", "target"), pair):
            if not isinstance(text, str) or not text.strip() or text != text.strip():
                raise ValueError(f"{path}: pairs[{i}] has {side} {text!r:.80}; texts must be "
                                 "non-blank strings without surrounding whitespace (the reader "
                                 "strips and skips those, so they would not read back equal)")
            if any(c in text for c in forbidden):
                raise ValueError(
                    f"{path}: pairs[{i}] has a {' or '.join(map(repr, forbidden))} in its {side} "
                    f"{text!r:.80}, which a line of this file cannot hold"
                    + ("; texts with tabs can go in two aligned files (write_parallel_files)"
                       if "\t" in forbidden else ""))


def _write_lines(path: str, lines: Iterable[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(line + "\n" for line in lines))


def write_parallel_tsv(path: str | os.PathLike, pairs: Sequence[tuple[str, str]]) -> None:
    """Writes pairs as `source<TAB>target` lines, UTF-8; `read_parallel(path)` reads them back.

    Raises:
      ValueError: no pairs, or a text that is blank, has surrounding whitespace, or holds a tab
        or line break (none of which would read back equal).
    """
    path = os.fspath(path)
    _checked_pairs(pairs, path, ("\t", *_LINE_BREAKS))
    _write_lines(path, (f"{src}\t{tgt}" for src, tgt in pairs))


def write_parallel_files(source_path: str | os.PathLike, target_path: str | os.PathLike,
                         pairs: Sequence[tuple[str, str]]) -> None:
    """Writes pairs as two aligned text files, UTF-8; `read_parallel(source_path,
    target_file=target_path)` reads them back. Texts may hold tabs, not line breaks."""
    source_path, target_path = os.fspath(source_path), os.fspath(target_path)
    _checked_pairs(pairs, source_path, _LINE_BREAKS)
    _write_lines(source_path, (src for src, _ in pairs))
    _write_lines(target_path, (tgt for _, tgt in pairs))


def joint_tokenizer_texts(pairs: Iterable[tuple[str, str]]) -> Iterator[str]:
    """Both sides of every pair (source, then target), to train ONE joint vocabulary on."""
    for src, tgt in pairs:
        yield src
        yield tgt


def encode_pairs(pairs: Sequence[tuple[str, str]], tokenizer, max_source_len: int,
                 max_target_len: int) -> dict[str, np.ndarray]:
    """Teacher-forcing features for an encoder-decoder, one row per pair.

    The source is `x [EOS]`; the decoder reads `target_input_ids = [BOS] y` and predicts
    `target_ids = y [EOS]`, so `target_ids[:, t] == target_input_ids[:, t + 1]` on real tokens.
    A text too long keeps its first tokens and its EOS (x[:S-1] [EOS], [BOS] y[:T-1] /
    y[:T-1] [EOS]); the truncated rows are counted in one warning.

    Args:
      pairs: (source, target) texts, e.g. from `read_parallel`.
      tokenizer: a SentencePiece `Tokenizer` (needs encode_batch, pad_id, bos_id, eos_id).
      max_source_len: S, source row length, EOS included.
      max_target_len: T, target row length, BOS (input) / EOS (target) included.

    Returns:
      int32 `source_ids` [N, S], `target_input_ids` [N, T], `target_ids` [N, T] (padded with
      pad_id), `source_lengths` [N] and `target_lengths` [N] (real tokens, EOS included), and
      float32 `target_weights` [N, T]: 1 on the target's real tokens (its EOS too), 0 on padding.
    """
    for name, value in (("max_source_len", max_source_len), ("max_target_len", max_target_len)):
        if not isinstance(value, (int, np.integer)) or value < 2:
            raise ConfigError(f"{name}={value!r} must be an int >= 2: one token plus "
                              f"{'EOS' if name == 'max_source_len' else 'BOS / EOS'}")
    missing = [a for a in ("encode_batch", "pad_id", "bos_id", "eos_id")
               if not hasattr(tokenizer, a)]
    if missing:
        raise ConfigError(f"tokenizer {type(tokenizer).__name__} has no {', '.join(missing)}; "
                          "translation needs BOS/EOS ids: use a SentencePiece model "
                          "(zoo.data.tokenizers.base.train_sentencepiece / load_tokenizer)")
    S, T = int(max_source_len), int(max_target_len)
    n = len(pairs)
    pad, bos, eos = tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
    sources = tokenizer.encode_batch([src for src, _ in pairs])
    targets = tokenizer.encode_batch([tgt for _, tgt in pairs])
    source_ids = np.full((n, S), pad, np.int32)
    target_input_ids = np.full((n, T), pad, np.int32)
    target_ids = np.full((n, T), pad, np.int32)
    source_lengths = np.zeros(n, np.int32)
    target_lengths = np.zeros(n, np.int32)
    source_cut = target_cut = 0
    for row, (x, y) in enumerate(zip(sources, targets)):
        x, y = x[:S - 1], y[:T - 1]  # room for EOS (and BOS on the decoder input)
        source_cut += len(x) < len(sources[row])
        target_cut += len(y) < len(targets[row])
        source_ids[row, :len(x) + 1] = [*x, eos]
        target_input_ids[row, :len(y) + 1] = [bos, *y]
        target_ids[row, :len(y) + 1] = [*y, eos]
        source_lengths[row], target_lengths[row] = len(x) + 1, len(y) + 1
    if source_cut or target_cut:
        _log.warning("encode_pairs: truncated %d of %d sources to max_source_len=%d and %d "
                     "targets to max_target_len=%d tokens (EOS kept); raise the limits to keep "
                     "whole sentences", source_cut, n, S, target_cut, T)
    target_weights = (np.arange(T)[None, :] < target_lengths[:, None]).astype(np.float32)
    return {"source_ids": source_ids, "target_input_ids": target_input_ids,
            "target_ids": target_ids, "source_lengths": source_lengths,
            "target_lengths": target_lengths, "target_weights": target_weights}
