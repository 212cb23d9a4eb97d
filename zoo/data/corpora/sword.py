"""Reading SWORD zText Bible modules (as Debian's sword-text-* packages ship them) without the
SWORD library.

A module is `mods.d/<id>.conf` (key=value lines: Versification, Lang, DistributionLicense, ...)
and per testament (`ot`, `nt`) three files in its DataPath:
* `.bzs`: 12-byte records (offset, compressed size, uncompressed size; little-endian u32) of
  zlib-compressed blocks in `.bzz`;
* `.bzv`: 10-byte records (block u32, offset u32, size u16), one per index entry: the entry's
  text is bytes [offset, offset + size) of the decompressed block.
The entries follow the module's versification (zoo.data.corpora.kjv): an empty entry, the
testament heading, then per book a book heading and per chapter a chapter heading followed by
its verses. Headings hold markup (and book introductions), never verse text.

Verse text is OSIS: notes (footnotes, cross references) and titles (section headings) are
dropped with their content, every other tag is removed, entities unescaped, whitespace runs
made one space.
"""

from __future__ import annotations

import html
import re
import struct
import zlib

from zoo.data.corpora import kjv
from zoo.errors import DataError

TESTAMENTS = {"ot": kjv.OLD_TESTAMENT, "nt": kjv.NEW_TESTAMENT}
VERSIFICATIONS = ("KJV", "NRSVA")
DEUTEROCANON = ("deuterocanon", 0, 0)  # the key of every NRSVA entry past Malachi

_NOTE = re.compile(r"<note\b[^>]*(?<!/)>.*?</note\s*>", re.DOTALL)
# Section headings go; a title marked canonical (a psalm's superscription) is verse text.
_TITLE = re.compile(r"<title\b(?![^>]*canonical=\"true\")[^>]*(?<!/)>.*?</title\s*>", re.DOTALL)
# The end of a book: what follows it in the book's last verse (the WEB's glossary) is not verse.
_BOOK_END = re.compile(r"<div\b(?=[^>]*\beID=)(?=[^>]*\btype=\"book\")[^>]*>")
_CHAPTER = re.compile(r"<chapter\b[^>]*\bsID=\"([^\"]+)\"")
# Tags that part words (paragraphs, line groups, milestones) become a space; inline ones (<w>,
# <transChange>, <hi>, ...) vanish, so "God</w>," stays "God,".
_SPACING = re.compile(r"<\s*/?\s*(div|p|l|lg|lb|milestone|chapter|verse|br)\b[^>]*>")
_TAG = re.compile(r"<[^>]*>")
_NOTE_MARK = re.compile(r"(?<=[\w,.;:!?’”)\]])\0+(?=[\w“‘(])")
_WHITESPACE = re.compile(r"\s+")


def read_conf(text: str) -> dict[str, str]:
    """The conf file's keys (the first value of a repeated key) and "id" (its [section])."""
    conf: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            conf.setdefault("id", line[1:-1])
        elif "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            conf.setdefault(key.strip(), value.strip())
    return conf


def keys(versification: str, testament: str, where: str) -> list[tuple[str, int, int] | None]:
    """Per index entry, (book OSIS id, chapter, verse): verse 0 for a chapter heading, chapter
    0 for a book heading; None for the two entries before the first book; DEUTEROCANON for
    NRSVA's deuterocanon entries (after Malachi)."""
    if versification not in VERSIFICATIONS:
        raise DataError(f"{where}: Versification={versification}; zoo reads "
                        f"{' and '.join(VERSIFICATIONS)} modules only")
    extra = kjv.NRSVA_EXTRA_VERSES if versification == "NRSVA" else {}
    out: list[tuple[str, int, int] | None] = [None, None]
    for book, _, verses in TESTAMENTS[testament]:
        out.append((book, 0, 0))
        for chapter, count in enumerate(verses.split(), start=1):
            out.append((book, chapter, 0))
            count = extra.get((book, chapter), int(count))
            out += [(book, chapter, verse) for verse in range(1, count + 1)]
    if versification == "NRSVA" and testament == "ot":
        out += [DEUTEROCANON] * kjv.NRSVA_DEUTEROCANON_ENTRIES
    return out


def entries(bzs: bytes, bzv: bytes, bzz: bytes, where: str) -> list[bytes]:
    """The raw bytes of every index entry of one testament (`where` names its files)."""
    if len(bzs) % 12 or len(bzv) % 10:
        raise DataError(f"{where}: .bzs is {len(bzs)} bytes and .bzv {len(bzv)}; their records "
                        "are 12 and 10 bytes: the files are truncated")
    blocks = list(struct.iter_unpack("<III", bzs))
    decompressed: dict[int, bytes] = {}
    out = []
    for record, (block, offset, size) in enumerate(struct.iter_unpack("<IIH", bzv)):
        if size == 0:
            out.append(b"")
            continue
        if block not in decompressed:
            if block >= len(blocks):
                raise DataError(f"{where}: .bzv record {record} names block {block}; the .bzs "
                                f"has {len(blocks)}")
            start, length, expected = blocks[block]
            try:
                data = zlib.decompress(bzz[start:start + length])
            except zlib.error as e:
                raise DataError(f"{where}: block {block} of the .bzz is not zlib data ({e})"
                                ) from None
            if len(data) != expected:
                raise DataError(f"{where}: block {block} decompresses to {len(data)} bytes, the "
                                f".bzs says {expected}")
            decompressed[block] = data
        data = decompressed[block]
        if offset + size > len(data):
            raise DataError(f"{where}: .bzv record {record} reads past the end of block {block}")
        out.append(data[offset:offset + size])
    return out


def check_chapters(index_keys: list, markup: list[str], where: str) -> None:
    """Every chapter heading that names its chapter (<chapter sID="Gen.2"/>) names the one
    the versification puts there: else the module is not in the versification it claims."""
    for key, text in zip(index_keys, markup):
        if key and key is not DEUTEROCANON and key[1] and not key[2]:
            found = _CHAPTER.search(text)
            if found and found.group(1) != f"{key[0]}.{key[1]}":
                raise DataError(f"{where}: the heading of {key[0]} {key[1]} is "
                                f"{found.group(1)}'s: the index does not follow the "
                                "versification its conf names")


def verse_text(markup: str) -> tuple[str, bool]:
    """Plain text of one verse's OSIS markup, and whether text after its book's end was cut."""
    end = _BOOK_END.search(markup)
    if end:
        markup, cut = markup[:end.start()], bool(_TAG.sub("", markup[end.end():]).strip())
    else:
        cut = False
    # A note leaves a mark (NUL: control characters are gone by now) that becomes a space only
    # between a word (or its closing punctuation) and the next word: the WEB has
    # "God</w><note>...</note><w>created" and "Yahweh,<note>...</note>Yahweh".
    text = _TITLE.sub("", _NOTE.sub("\0", markup.replace("\0", "")))
    text = html.unescape(_TAG.sub("", _SPACING.sub(" ", text)))
    text = _NOTE_MARK.sub(" ", text).replace("\0", "")
    return _WHITESPACE.sub(" ", text).strip(), cut
