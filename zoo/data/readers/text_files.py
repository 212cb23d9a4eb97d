"""User text files read the same way by every reader (classification, multiple choice, parallel
text): UTF-8 with an optional BOM, errors naming the file and line, lines split only at \\n.
Also BERT's pretraining text format (the 'files' source of zoo.data.readers.sources): one sentence
per line, a blank line between documents."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence

from zoo import paths
from zoo.data.text_document import TextDocument
from zoo.errors import DataError, MissingFileError


def read_utf8(path: str, what: str) -> str:
    """The whole file as text. `what` names the file in the error a missing one gets (e.g.
    'classification data file')."""
    try:
        raw = paths.as_path(path).read_bytes()  # local or gs://
    except FileNotFoundError:
        raise MissingFileError(f"{what} {path} does not exist") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataError(f"{path}:{line}: invalid UTF-8 byte 0x{raw[e.start]:02x}; the file must "
                        "be UTF-8 text (re-encode it, e.g. `iconv -t UTF-8`)") from None


def split_lines(text: str) -> list[str]:
    """The lines without their ends (\\n or \\r\\n); a final newline ends the last line, it does
    not start another."""
    # split("\n"), not splitlines(): the latter also breaks on \x0c, \u2028, ... inside a text.
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def json_lines(path: str, text: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) per non-blank line of a JSON Lines file's `text`: the one loop of
    every reader taking JSON Lines, so a bad line reads the same error in all of them."""
    for line, raw in enumerate(split_lines(text), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{line}:{e.colno}: invalid JSON: {e.msg}; a JSON Lines file "
                            "holds one JSON object per line") from None
        if not isinstance(obj, dict):
            # A bad file, not a bad argument: ValueError like every other input error.
            raise DataError(  # noqa: TRY004
                f"{path}:{line}: a JSON {type(obj).__name__}, not an object; a JSON "
                "Lines file holds one object per line (not one array of them)")
        yield line, obj


# ---------------------------------------------------------------------------------------------
# BERT pretraining text format: one sentence per line, a blank line between documents.


def _sentences_of(doc: TextDocument | Sequence[str]) -> tuple[str, ...]:
    # A synthetic Document (or any TextDocument) by its `texts`, else the sentences themselves.
    return tuple(doc.texts) if isinstance(doc, TextDocument) else tuple(doc)


def corpus_text(documents: Sequence[TextDocument | Sequence[str]]) -> str:
    """Formats documents as BERT pretraining text (with a trailing newline).

    Raises:
      ValueError: for an empty document or a sentence that is blank, has surrounding whitespace
        or holds a line break, none of which would survive a round trip.
    """
    blocks = []
    for d, doc in enumerate(documents):
        sentences = _sentences_of(doc)
        if not sentences:
            raise ValueError(f"documents[{d}] has no sentences; every document needs at least one")
        for s, sentence in enumerate(sentences):
            well_formed = (isinstance(sentence, str) and sentence.strip()
                           and sentence == sentence.strip() and "\n" not in sentence
                           and "\r" not in sentence)
            if not well_formed:
                raise ValueError(
                    f"documents[{d}] sentence {s} = {sentence!r} must be a non-blank str without "
                    "line breaks or surrounding whitespace (one sentence per line)")
        blocks.append("\n".join(sentences) + "\n")
    return "\n".join(blocks)


def write_text_corpus(path: str | os.PathLike, documents: Sequence[TextDocument | Sequence[str]]
                      ) -> None:
    """Writes documents (or lists of sentence strings) to `path` in BERT's format, UTF-8."""
    paths.as_path(path).write_bytes(corpus_text(documents).encode("utf-8"))


def read_text_corpus(path: str | os.PathLike) -> list[list[str]]:
    """Reads BERT-format text: documents of stripped sentences.

    Tolerates \\r\\n line ends, a UTF-8 byte-order mark, whitespace-only lines and runs of blank
    lines (all treated as one document break).

    Raises:
      ValueError: naming the file and line of the first invalid UTF-8 byte, or the file when it
        holds no sentences.
    """
    data = paths.as_path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataError(
            f"{os.fspath(path)}:{line}: invalid UTF-8 byte 0x{data[e.start]:02x} at column "
            f"{column}; the corpus must be UTF-8 text (re-encode it, e.g. `iconv -t UTF-8`)"
        ) from None
    documents: list[list[str]] = []
    current: list[str] = []
    # split("\n"), not splitlines(): the latter also breaks on \x0c, \u2028, ... inside sentences.
    for line in text.removeprefix("\ufeff").split("\n"):
        line = line.strip()
        if line:
            current.append(line)
        elif current:
            documents.append(current)
            current = []
    if current:
        documents.append(current)
    if not documents:
        raise DataError(
            f"{os.fspath(path)}: the corpus is empty; expected one sentence per line with a blank "
            "line between documents")
    return documents
