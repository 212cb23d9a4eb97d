"""Character-level tokenizer (nanoGPT's shakespeare_char): every character is a token, and the
vocabulary is the sorted set of characters of the training text.

Ids 0..6 are zoo's fixed special ids (pad, unk, bos, eos, [CLS], [SEP], [MASK]: the ids
SentencePiece models trained here carry, zoo.data.tokenizers.base), so the LM pipeline's
[bos] ... [eos] framing works unchanged; the characters follow from id 7 in code-point order.
Nothing is normalised: a newline, a tab or a run of spaces is a token like any other, which a
character LM of plays needs (SentencePiece would map every whitespace to ' ' and collapse runs).

A character the training text never held (met at eval time, or in a sampling prompt) encodes
to the unknown id 1 and decodes to U+FFFD '\ufffd'; `unknown_characters(text)` counts them, so
a job can say how many it met instead of dropping them silently.

The vocabulary is saved as JSON (`{"kind": "chars", "chars": [...]}`, a list because a
newline cannot sit on a line of its own) in a file named `*.chars.json`, which
`zoo.data.tokenizers.base.load_tokenizer` recognises.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable, Sequence

from zoo import paths
from zoo.errors import DataError, MissingFileError

SUFFIX = ".chars.json"
# The specials at ids 0..6, as SentencePiece names them (zoo.data.tokenizers.base fixes the ids).
SPECIALS = ("<pad>", "<unk>", "<s>", "</s>", "[CLS]", "[SEP]", "[MASK]")
PAD_ID, UNK_ID, BOS_ID, EOS_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIALS))
UNKNOWN_TEXT = "\ufffd"  # what decode writes for the unknown id


class CharTokenizer:
    """One id per character of a fixed alphabet, after the seven special ids."""

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID
    cls_id, sep_id, mask_id = CLS_ID, SEP_ID, MASK_ID
    special_ids = (PAD_ID, BOS_ID, EOS_ID, CLS_ID, SEP_ID, MASK_ID)

    def __init__(self, chars: Iterable[str], source: str = "<memory>"):
        chars = list(chars)
        bad = [c for c in chars if not isinstance(c, str) or len(c) != 1]
        if bad or len(set(chars)) != len(chars) or chars != sorted(chars):
            raise DataError(f"character vocabulary {source}: must be distinct single characters "
                            f"in sorted order; {'found ' + repr(bad[:3]) if bad else 'it is not'}")
        self.source = source
        self.chars = chars
        self._ids = {c: i for i, c in enumerate(chars, start=len(SPECIALS))}

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + len(self.chars)

    def encode(self, text: str) -> list[int]:
        get = self._ids.get
        return [get(c, UNK_ID) for c in text]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        return self.encode(text), [(i, i + 1) for i in range(len(text))]

    def decode(self, ids: Iterable[int]) -> str:
        """The characters of `ids`; the special ids are dropped (as SentencePiece drops its
        control symbols) and the unknown id is written as U+FFFD."""
        first = len(SPECIALS)
        out = []
        for i in ids:
            i = int(i)
            if i >= first:
                out.append(self.chars[i - first])
            elif i == UNK_ID:
                out.append(UNKNOWN_TEXT)
        return "".join(out)

    def id_to_token(self, i: int) -> str:
        i = int(i)
        if not 0 <= i < self.vocab_size:
            raise IndexError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
        return SPECIALS[i] if i < len(SPECIALS) else self.chars[i - len(SPECIALS)]

    def token_to_id(self, token: str) -> int:
        if token in self._ids:
            return self._ids[token]
        if token in SPECIALS:
            return SPECIALS.index(token)
        raise KeyError(f"{token!r} is not in the character vocabulary of {self.source}")

    def is_word_start(self, i: int) -> bool:
        """True for every id: a character is a unit of its own (no piece continues another)."""
        if not 0 <= int(i) < self.vocab_size:
            raise IndexError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
        return True

    def unknown_characters(self, text: str) -> collections.Counter:
        """How often each character of `text` outside the vocabulary occurs."""
        return collections.Counter(c for c in text if c not in self._ids)

    def save(self, path: str) -> None:
        blob = json.dumps({"kind": "chars", "chars": self.chars}, ensure_ascii=True)
        paths.write_atomic(path, blob.encode("utf-8"))

    @classmethod
    def load(cls, path: str) -> CharTokenizer:
        try:
            raw = paths.as_path(path).read_bytes()
        except FileNotFoundError:
            raise MissingFileError(f"character vocabulary {path} does not exist") from None
        try:
            blob = json.loads(raw.decode("utf-8"))
            chars = blob["chars"] if blob.get("kind") == "chars" else None
        except (ValueError, AttributeError, KeyError):
            chars = None
        if not isinstance(chars, list):
            raise DataError(f"character vocabulary {path} is not a zoo character vocabulary "
                            '(JSON {"kind": "chars", "chars": [...]}); delete it to rebuild it '
                            "from the corpus")
        return cls(chars, source=path)


def train_chars(texts: Iterable[str]) -> CharTokenizer:
    """The tokenizer whose vocabulary is every character of `texts`, sorted."""
    seen: set[str] = set()
    for text in texts:
        seen.update(text)
    if not seen:
        raise DataError("the training text is empty: no characters to build a character "
                        "vocabulary from (check the data source)")
    return CharTokenizer(sorted(seen))


def load_or_train(path: str, texts_fn) -> CharTokenizer:
    """The vocabulary cached at `path`, or one built from `texts_fn()` and cached there."""
    if paths.as_path(path).exists():
        return CharTokenizer.load(path)
    tokenizer = train_chars(texts_fn())
    tokenizer.save(path)
    return CharTokenizer.load(path)
