"""BERT's WordPiece tokenizer: basic tokenization + greedy longest-match-first subwords.

Reads a BERT `vocab.txt` (one token per line, the line number is the id) and tokenizes exactly
like Hugging Face's fast `BertWordPieceTokenizer` (its Rust `BertNormalizer`,
`BertPreTokenizer` and `WordPiece` model, with `add_special_tokens=False`):

1. Clean: drop NUL, U+FFFD and control/format/private-use/surrogate characters (categories Cc,
   Cf, Co, Cs, except tab, newline and carriage return); map every other whitespace character to
   a space. Unassigned code points (Cn) are kept, as HF does.
2. Surround CJK ideographs with spaces, so each becomes its own word.
3. If `strip_accents` (defaults to `lowercase`): NFD, then drop nonspacing marks (Mn).
4. If `lowercase`: lowercase each character (full Unicode case mapping, so one character can
   become two, e.g. 'İ' -> 'i' + U+0307 without accent stripping).
5. Split on whitespace (dropped) and around every punctuation character: Unicode category P*
   plus all ASCII non-alphanumeric symbols such as '$', '+', '^', '|'.
6. Each word of at most `max_input_chars_per_word` characters is split greedily into the
   longest vocabulary entries, continuations prefixed with '##'; a longer word, or one that
   cannot be split, becomes a single [UNK].

Every step works character by character, so each normalized character remembers the index of
the original character it came from (as the fast tokenizer's alignments do); a token's offsets
are (origin of its first character, origin of its last character + 1), so `text[start:end]` is
its span in the ORIGINAL text even after lowercasing, accent stripping or dropped characters.

Where HF's fast tokenizer and google-research/bert's Python differ, this follows HF: U+2028/2029
are whitespace, unassigned characters are kept, and the CJK range U+2B820-U+2B91F is not split.
Literal "[MASK]" etc. in the text are tokenized as text ('[', 'mask', ']'), never as specials.
"""

from __future__ import annotations

import functools
import itertools
import re
import unicodedata
from collections.abc import Iterable, Sequence

import numpy as np

from zoo import paths
from zoo.errors import DataError, MissingFileError

CONTINUATION = "##"
# The specials a BERT vocab.txt must hold, in the order of (pad, unk, cls, sep, mask)_id.
_REQUIRED_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# HF's is_chinese_char (the CJK Unified Ideographs blocks and extensions, compatibility
# ideographs). Its fourth extension range starts at U+2B920, where BERT's Python has U+2B820.
_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)
# HF's decoder cleanup, applied to each token after it has been given its leading space.
_DECODE_CLEANUP = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
    (" 'm", "'m"), (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
)

# ASCII text the rules treat simply: letters and digits form words, every other printable
# character is a one-character word, tab/newline/return separate. The other ASCII controls are
# dropped (joining their neighbours), which this pattern cannot say: _ASCII_DROPPED finds them.
_ASCII_WORDS = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]")
_ASCII_DROPPED = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _is_control(c: str) -> bool:
    if c in "\t\n\r":  # technically controls, but BERT treats them as whitespace
        return False
    return unicodedata.category(c) in ("Cc", "Cf", "Co", "Cs")


def _is_cjk(c: str) -> bool:
    cp = ord(c)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


@functools.cache
def _is_punctuation(c: str) -> bool:
    cp = ord(c)
    # BERT counts every ASCII non-letter/digit as punctuation, though "$+<=>^`|~" are not P*.
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(c).startswith("P")


class WordPieceTokenizer:
    """BERT's tokenizer over a fixed vocabulary (see the module docstring for the exact rules).

    Args:
      vocab: the tokens; a token's position is its id. Must hold [PAD], [UNK], [CLS], [SEP] and
        [MASK]; a token listed twice maps to its last id, as in HF and BERT.
      lowercase: lowercase the text (uncased models).
      strip_accents: NFD + drop nonspacing marks; None follows `lowercase`, as in HF.
      tokenize_chinese_chars: make every CJK ideograph its own word.
      max_input_chars_per_word: longer words become a single [UNK].
      source: where the vocabulary came from, for error messages.
    """

    def __init__(
        self,
        vocab: Sequence[str],
        *,
        lowercase: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
        max_input_chars_per_word: int = 100,
        source: str = "<memory>",
    ):
        if max_input_chars_per_word < 1:
            raise ValueError(
                f"max_input_chars_per_word must be >= 1, got {max_input_chars_per_word}"
            )
        if not vocab:
            raise DataError(f"vocabulary {source} is empty; give a BERT vocab.txt")
        self.source = source
        self.lowercase = lowercase
        self.strip_accents = lowercase if strip_accents is None else strip_accents
        self.tokenize_chinese_chars = tokenize_chinese_chars
        self.max_input_chars_per_word = max_input_chars_per_word
        self._tokens = list(vocab)
        self._ids = {tok: i for i, tok in enumerate(self._tokens)}
        missing = [t for t in _REQUIRED_TOKENS if t not in self._ids]
        if missing:
            raise DataError(
                f"vocabulary {source} lacks the special token(s) {', '.join(missing)}; a BERT "
                f"vocab.txt needs all of {', '.join(_REQUIRED_TOKENS)} (one per line)"
            )
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            self._ids[t] for t in _REQUIRED_TOKENS
        )
        # [UNK] stands for real text, so it may be masked like any word; the rest never are.
        self.special_ids = tuple(sorted({self.pad_id, self.cls_id, self.sep_id, self.mask_id}))
        # No match is longer than the longest entry: bounds the greedy search per position.
        self._max_piece_chars = max(len(t) for t in self._tokens)
        self._make_caches()

    def _make_caches(self) -> None:
        # Per-instance caches (the rules depend on the flags); words repeat a lot in corpora.
        self._normalize_char = functools.cache(self._normalize_char_uncached)
        self._word_pieces = functools.lru_cache(maxsize=1 << 16)(self._word_pieces_uncached)
        self._chunk = functools.lru_cache(maxsize=1 << 17)(self._chunk_uncached)
        self._chunk_ids = functools.lru_cache(maxsize=1 << 17)(
            lambda chunk: self._chunk_uncached(chunk)[0])

    def __getstate__(self) -> dict:
        # Pickled for preparation worker processes: the caches (bound to this instance) stay.
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_normalize_char", "_word_pieces", "_chunk", "_chunk_ids")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._make_caches()

    @classmethod
    def from_vocab_file(
        cls,
        path: str,
        lowercase: bool = True,
        strip_accents: bool | None = None,
        tokenize_chinese_chars: bool = True,
        max_input_chars_per_word: int = 100,
    ) -> WordPieceTokenizer:
        """Loads a BERT `vocab.txt` (UTF-8, one token per line, id = line number)."""
        try:
            raw = paths.as_path(path).read_bytes()
        except FileNotFoundError:
            raise MissingFileError(f"WordPiece vocabulary {path} does not exist") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(
                f"WordPiece vocabulary {path} is not UTF-8 text ({e}); give a BERT vocab.txt"
            ) from None
        # Lines end at '\n' only (not at the other characters str.splitlines breaks on); trailing
        # whitespace such as '\r' is dropped, as HF does.
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()
        vocab = [line.rstrip() for line in lines]
        if not any(vocab):
            raise DataError(f"WordPiece vocabulary {path} is empty; give a BERT vocab.txt")
        return cls(
            vocab,
            lowercase=lowercase,
            strip_accents=strip_accents,
            tokenize_chinese_chars=tokenize_chinese_chars,
            max_input_chars_per_word=max_input_chars_per_word,
            source=path,
        )

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def encode(self, text: str) -> list[int]:
        ids = []
        for chunk in text.split(" "):
            ids.extend(self._chunk_ids(chunk))
        return ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """encode_batch as one int32 array of every text's ids after another, and int64 [len
        (texts)] each text's count: what preparation keeps, without a list per text (the
        chunks' cache is looked up by map, in C)."""
        # Joined by single spaces, the texts split into exactly their own chunks in order.
        per_text = 1 + np.fromiter(map(str.count, texts, itertools.repeat(" ")), np.int64,
                                   count=len(texts))
        per_chunk = list(map(self._chunk_ids, " ".join(texts).split(" ")))
        lengths = np.fromiter(map(len, per_chunk), np.int64, count=len(per_chunk))
        ids = np.fromiter(itertools.chain.from_iterable(per_chunk), np.int32,
                          count=int(lengths.sum()))
        ends = np.cumsum(per_text)
        total = np.concatenate([[0], np.cumsum(lengths)])
        return ids, total[ends] - total[ends - per_text]

    def word_starts(self) -> list[bool]:
        """is_word_start of every id, in id order (for the whole vocabulary at once)."""
        specials = set(self.special_ids)
        return [i in specials or not t.startswith(CONTINUATION) for i, t in
                enumerate(self._tokens)]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and, per id, the (start, end) character span of `text` it came from."""
        ids, offsets, at = [], [], 0
        for chunk in text.split(" "):
            if chunk:
                chunk_ids, chunk_offsets = self._chunk(chunk)
                ids.extend(chunk_ids)
                offsets.extend((at + start, at + end) for start, end in chunk_offsets)
            at += len(chunk) + 1
        return ids, offsets

    def tokenize(self, text: str) -> list[str]:
        return [self._tokens[i] for i in self.encode(text)]

    def decode(self, ids: Iterable[int]) -> str:
        """Joins tokens with spaces, '##' pieces onto the previous one; drops `special_ids`.

        Matches HF's WordPiece decoder (cleanup on): no space before . ? ! , tokens.
        """
        out = []
        for i in ids:
            i = int(i)
            if i in self.special_ids:
                continue
            token = self.id_to_token(i)
            if out:
                token = (
                    token[len(CONTINUATION):] if token.startswith(CONTINUATION) else " " + token
                )
            for dirty, clean in _DECODE_CLEANUP:
                token = token.replace(dirty, clean)
            out.append(token)
        return "".join(out)

    def id_to_token(self, i: int) -> str:
        if not 0 <= int(i) < len(self._tokens):
            raise IndexError(f"token id {i} is outside the vocabulary [0, {len(self._tokens)})")
        return self._tokens[int(i)]

    def token_to_id(self, token: str) -> int:
        try:
            return self._ids[token]
        except KeyError:
            raise KeyError(f"token {token!r} is not in the vocabulary {self.source}") from None

    def is_word_start(self, i: int) -> bool:
        """False only for '##' continuation pieces (whole-word masking groups them)."""
        return int(i) in self.special_ids or not self.id_to_token(i).startswith(CONTINUATION)

    # -- basic tokenization -------------------------------------------------------------------

    def _chunk_uncached(self, chunk: str) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
        """Ids and offsets (into `chunk`) of one space-free run of the text.

        Every rule above looks at one character at a time, and a space always ends a word, so
        the text's tokens are its space-separated chunks' tokens one after another. Chunks
        (mostly words with their punctuation) repeat throughout a corpus, so encode caches them:
        preparation then runs the character-by-character rules once per distinct chunk.
        """
        ids, offsets = [], []
        if chunk.isascii() and not _ASCII_DROPPED.search(chunk):
            # The same rules without the per-character walk: no accents, one-to-one case.
            for match in _ASCII_WORDS.finditer(chunk):
                word, at = match.group(), match.start()
                for i, start, end in self._word_pieces(word.lower() if self.lowercase else word):
                    ids.append(i)
                    offsets.append((at + start, at + end))
            return tuple(ids), tuple(offsets)
        for word, origins in self._words(chunk):
            for i, start, end in self._word_pieces(word):
                ids.append(i)
                offsets.append((origins[start], origins[end - 1] + 1))
        return tuple(ids), tuple(offsets)

    def _normalize_char_uncached(self, c: str) -> str:
        """What one original character becomes after steps 1-4 ('' when dropped)."""
        if c in ("\x00", "\ufffd") or _is_control(c):
            return ""
        if c.isspace():  # after the control filter, exactly Unicode's White_Space set
            return " "
        out = f" {c} " if self.tokenize_chinese_chars and _is_cjk(c) else c
        if self.strip_accents:
            decomposed = unicodedata.normalize("NFD", out)
            out = "".join(d for d in decomposed if unicodedata.category(d) != "Mn")
        if self.lowercase:
            out = "".join(d.lower() for d in out)  # per character, as HF (no final-sigma rule)
        return out

    def _words(self, text: str) -> list[tuple[str, tuple[int, ...]]]:
        """Words of the normalized text, each with the original index of every character."""
        words, chars, origins = [], [], []

        def flush():
            if chars:
                words.append(("".join(chars), tuple(origins)))
                chars.clear()
                origins.clear()

        for index, c in enumerate(text):
            for n in self._normalize_char(c):
                if n == " ":
                    flush()
                elif _is_punctuation(n):
                    flush()
                    words.append((n, (index,)))
                else:
                    chars.append(n)
                    origins.append(index)
        flush()
        return words

    def _word_pieces_uncached(self, word: str) -> tuple[tuple[int, int, int], ...]:
        """(id, start, end) per piece, start/end indexing `word`; one [UNK] if unsplittable."""
        unknown = ((self.unk_id, 0, len(word)),)
        if len(word) > self.max_input_chars_per_word:
            return unknown
        pieces, start = [], 0
        while start < len(word):
            for end in range(min(len(word), start + self._max_piece_chars), start, -1):
                piece = word[start:end] if start == 0 else CONTINUATION + word[start:end]
                if piece in self._ids:
                    pieces.append((self._ids[piece], start, end))
                    break
            else:
                return unknown
            start = end
        return tuple(pieces)
