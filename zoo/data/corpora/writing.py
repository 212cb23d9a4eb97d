"""Writing a converted corpus: a staging directory renamed into place at the end (so DIR/NAME
either holds a complete corpus with its manifest.json or does not exist), the output formats
and their counts, the manifest, and the text repairs every corpus shares (decoding with a
fallback, control characters), each counted.

Output formats (what the readers take):
* BERT pretraining text (zoo.data.readers.text_files): UTF-8, one sentence per line, a blank
  line between documents.
* Labelled TSV (zoo.data.readers.classification): a header row `text<TAB>label`, then a row
  per example; no tab or line break inside a text.
* Parallel TSV (zoo.data.readers.parallel): `source<TAB>target` lines, no header.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import shutil
import tempfile
import unicodedata
from collections.abc import Iterable, Iterator, Sequence

from zoo.data.readers import text_files
from zoo.errors import ConfigError

MANIFEST = "manifest.json"
SPLITS = ("train", "validation", "test")
_WHITESPACE = re.compile(r"\s+")


def split_of(i: int) -> str:
    """The split of the i-th unit (file, document, message) in sorted order: every tenth from
    the ninth on validates, every tenth from the tenth on tests."""
    return {8: "validation", 9: "test"}.get(i % 10, "train")


class Counts:
    """What was skipped and what was repaired, by reason: the manifest's "skipped" and
    "handled" (nothing is dropped or changed without a count)."""

    def __init__(self):
        self.skipped: collections.Counter = collections.Counter()
        self.handled: collections.Counter = collections.Counter()

    def as_dict(self) -> dict:
        return {"skipped": dict(sorted(self.skipped.items())),
                "handled": dict(sorted(self.handled.items()))}


# Windows-1252's printable characters at 0x80..0x9f (where Latin-1 has C1 controls); its five
# undefined bytes there stay Latin-1's (and are then removed as control characters).
_CP1252 = {b: bytes([b]).decode("cp1252") for b in range(0x80, 0xa0)
           if b not in (0x81, 0x8d, 0x8f, 0x90, 0x9d)}


def cp1252(raw: bytes) -> str:
    """Windows-1252, never failing: what WHATWG (every browser) reads for the labels
    us-ascii, iso-8859-1 and latin1, which mail mislabels most."""
    return raw.decode("latin-1").translate(_CP1252)


def decode(raw: bytes, counts: Counts) -> str:
    """UTF-8 (a BOM dropped), else Windows-1252 (`cp1252`), counted as handled."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        counts.handled["files not UTF-8, decoded as Windows-1252"] += 1
        return cp1252(raw)


def without_controls(text: str, counts: Counts, keep: str = "\n\t") -> str:
    """`text` without control characters (Unicode category Cc: NUL, form feed, DEL, C1, ...)
    other than those in `keep`; \\r is kept too when asked, else removed. Each counted."""
    if text.isprintable():
        return text
    out = []
    for c in text:
        if c in keep or unicodedata.category(c) != "Cc":
            out.append(c)
        else:
            counts.handled["control characters removed (C0 but tab and line ends, DEL, C1)"] += 1
    return "".join(out)


def one_line(text: str) -> str:
    """Every run of whitespace (tabs, line breaks, U+2028, ...) as one space, ends stripped:
    a text a TSV row or a sentence line can hold."""
    return _WHITESPACE.sub(" ", text).strip()


# ---- files and their counts ------------------------------------------------------------------


def write_text(directory: str, file: str, documents: Sequence[Sequence[str]]) -> dict:
    """Documents (lists of one-line sentences) in BERT's format; returns the file's counts."""
    text = text_files.corpus_text(documents) if documents else ""
    _write(directory, file, text)
    return {"file": file, "documents": len(documents),
            "lines": sum(len(d) for d in documents), "characters": len(text),
            "bytes": len(text.encode("utf-8")), "longest_line": _longest(text)}


def write_tsv(directory: str, file: str, rows: Iterable[Sequence[str]],
              header: Sequence[str] | None = None, documents: int | None = None) -> dict:
    """Tab-separated rows (each field already one line, tab-free) under an optional header;
    returns the file's counts (`documents`: how many source documents the rows come from)."""
    lines = ["\t".join(header)] if header else []
    for row in rows:
        for field in row:
            if "\t" in field or "\n" in field or "\r" in field or not field.strip():
                raise ValueError(f"{file}: field {field!r:.80} is blank or holds a tab or line "
                                 "break")
        lines.append("\t".join(row))
    text = "".join(line + "\n" for line in lines)
    _write(directory, file, text)
    counts = {"file": file, "rows": len(lines) - bool(header), "characters": len(text),
              "bytes": len(text.encode("utf-8")), "longest_line": _longest(text)}
    if documents is not None:
        counts["documents"] = documents
    return counts


def write_plain(directory: str, file: str, text: str, documents: int) -> dict:
    _write(directory, file, text)
    return {"file": file, "documents": documents, "lines": text.count("\n"),
            "characters": len(text), "bytes": len(text.encode("utf-8")),
            "longest_line": _longest(text)}


def _longest(text: str) -> int:
    """Characters in the file's longest line: very long lines are seen in the manifest."""
    return max(map(len, text.split("\n")), default=0)


def _write(directory: str, file: str, text: str) -> None:
    with open(os.path.join(directory, file), "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


# ---- the manifest and the directory it completes ----------------------------------------------


def complete_manifest(directory: str) -> dict | None:
    """The manifest of a finished corpus in `directory`: every file it lists is there with its
    recorded size; None when anything is missing."""
    try:
        with open(os.path.join(directory, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
        files = [entry for entries in manifest["splits"].values() for entry in entries]
        files += list(manifest.get("files", []))
        return manifest if all(
            os.path.getsize(os.path.join(directory, entry["file"])) == entry["bytes"]
            for entry in files) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_manifest(directory: str, manifest: dict) -> None:
    _write(directory, MANIFEST, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")


def refuse_incomplete(directory: str) -> None:
    """An error if `directory` exists without a complete manifest: it is not this command's to
    overwrite."""
    if os.path.lexists(directory) and complete_manifest(directory) is None:
        raise ConfigError(f"{directory} exists without a complete {MANIFEST} (not written by "
                          "this command, or changed since): remove it, or fetch into another "
                          "--out")


@contextlib.contextmanager
def staged(out: str, name: str) -> Iterator[str]:
    """A fresh directory beside `out`/`name` to write the corpus in, renamed to `out`/`name`
    when the block finishes; removed (leaving nothing) when it raises."""
    final = os.path.join(out, name)
    refuse_incomplete(final)
    try:
        os.makedirs(out, exist_ok=True)
        staging = tempfile.mkdtemp(dir=out, prefix=f".{name}.partial-")
    except OSError as e:
        raise ConfigError(f"--out={out} cannot be written ({e}); give a directory you can "
                          "write") from None
    try:
        yield staging
        os.chmod(staging, 0o755)  # mkdtemp makes it owner-only; corpora are for sharing
        try:
            os.replace(staging, final)  # atomic: no reader sees half a corpus
        except OSError:
            if complete_manifest(final) is None:
                raise
            shutil.rmtree(staging)  # a fetch beside this one finished first: keep its corpus
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
