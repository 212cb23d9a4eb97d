"""GPT-2's byte-level BPE vocabulary, offline: OpenAI's own copy of it ships in the
`openai-whisper` sdist on the Python package index (`whisper/assets/gpt2.tiktoken`, MIT), in
tiktoken's format: one line per token, its bytes in base64 and its rank, 50,256 tokens whose
ranks are GPT-2's ids (tiktoken's "gpt2" encoding; <|endoftext|>, 50256, is not in the file).

Writes into DIR/gpt2_bpe Hugging Face's layout of a GPT-2 tokenizer, which
zoo.data.tokenizers.load_tokenizer reads as a directory (zoo.data.tokenizers.gpt2_bpe):
* vocab.json: every token spelt as GPT-2 spells it (each byte as its bytes_to_unicode
  character, so a leading space is 'Ġ') -> its rank, and <|endoftext|> -> the next id.
* merges.txt: `#version: 0.2`, then one merge per token of two or more bytes, in rank order:
  the two parts byte-pair encoding of the token's bytes reaches using only the tokens ranked
  below it (how a rank table is built, merge by merge). A token that does not come out as
  exactly two parts is not a BPE rank table, and stops the conversion naming it.
"""

from __future__ import annotations

import base64
import binascii
import json
import re

from zoo.data.corpora import fetching, writing
from zoo.data.tokenizers.gpt2_bpe import ENDOFTEXT, MERGES_FILE, VOCAB_FILE, bytes_to_unicode
from zoo.errors import DataError

DESCRIPTION = ("GPT-2's byte-level BPE tokenizer (vocab.json + merges.txt), from OpenAI's "
               "gpt2.tiktoken in the openai-whisper sdist, MIT")
PACKAGES = (fetching.Package("pip", "openai-whisper", "20250625",
                             "openai_whisper-20250625.tar.gz"),)
_RANKS = re.compile(r"^[^/]+/whisper/assets/gpt2\.tiktoken$")


def read_ranks(text: str, source: str) -> list[bytes]:
    """The tokens of a tiktoken rank file, index = rank; ranks must run 0, 1, 2, ... and the
    256 single bytes must all be there (a byte-level vocabulary spells every string)."""
    tokens: list[bytes] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split()
        try:
            if len(fields) != 2:
                raise ValueError("two fields")
            token, rank = base64.b64decode(fields[0], validate=True), int(fields[1])
        except (ValueError, binascii.Error):
            raise DataError(f"{source}:{number}: a rank line is the token's bytes in base64 "
                            f"and its rank, got {line[:60]!r}") from None
        if rank != len(tokens):
            raise DataError(f"{source}:{number}: rank {rank} where {len(tokens)} was due; "
                            "ranks must run 0, 1, 2, ... without gaps")
        tokens.append(token)
    missing = {bytes([b]) for b in range(256)} - set(tokens)
    if missing:
        raise DataError(f"{source}: {len(missing)} of the 256 single bytes have no rank (e.g. "
                        f"{min(missing)!r}); this is not a byte-level BPE table")
    return tokens


def _split(token: bytes, ranks: dict[bytes, int], below: int) -> list[bytes]:
    """Byte-pair encoding of `token` using only the tokens ranked below `below`."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 1:
        best, at = below, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1], below)
            if rank < best:
                best, at = rank, i
        if at < 0:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return parts


def merges_of(tokens: list[bytes], source: str) -> list[tuple[bytes, bytes]]:
    """The merge that makes each multi-byte token, in rank order (module docstring)."""
    ranks = {token: rank for rank, token in enumerate(tokens)}
    merges = []
    for rank, token in enumerate(tokens):
        if len(token) < 2:
            continue
        parts = _split(token, ranks, rank)
        if len(parts) != 2:
            raise DataError(f"{source}: token {rank} ({token!r}) is not the merge of two "
                            f"tokens ranked below it (BPE stops at {len(parts)} parts); this "
                            "is not a BPE rank table")
        merges.append((parts[0], parts[1]))
    return merges


def convert(packages: dict[str, str], out: str, counts: writing.Counts, report) -> dict:
    (path,) = packages.values()
    found = dict(fetching.tar_members(path, lambda name: bool(_RANKS.match(name))))
    if not found:
        raise DataError(f"{path}: no whisper/assets/gpt2.tiktoken; is it the openai-whisper "
                        f"{PACKAGES[0].version} sdist?")
    ((member, raw),) = found.items()
    source = f"{path}:{member}"
    tokens = read_ranks(raw.decode("ascii", errors="replace"), source)
    merges = merges_of(tokens, source)
    spell = bytes_to_unicode()

    def spelt(token: bytes) -> str:
        return "".join(spell[b] for b in token)

    vocab = {spelt(token): rank for rank, token in enumerate(tokens)}
    vocab[ENDOFTEXT] = len(tokens)
    merges_text = "#version: 0.2\n" + "".join(f"{spelt(a)} {spelt(b)}\n" for a, b in merges)
    report(f"gpt2_bpe: {len(vocab):,} tokens, {len(merges):,} merges")
    return {
        "licence": "MIT (openai-whisper's LICENSE, Copyright (c) 2022 OpenAI)",
        "split_rule": "none: a tokenizer, not a text",
        "splits": {},
        "files": [writing.write_plain(out, VOCAB_FILE, json.dumps(vocab, ensure_ascii=False),
                                      documents=1),
                  writing.write_plain(out, MERGES_FILE, merges_text, documents=1)],
        "notes": {"tokens": len(vocab), "merges": len(merges),
                  "endoftext_id": len(tokens),
                  "how": "tiktoken ranks -> vocab.json (bytes_to_unicode spelling) and "
                         "merges.txt (each multi-byte token's last merge, in rank order)"},
    }
