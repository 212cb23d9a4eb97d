"""GPT-2's byte-level BPE tokenizer (Radford et al. 2019), read from a checkpoint directory's
`vocab.json` + `merges.txt`, so an imported GPT-2 is fed the ids it was trained on.

How it works, as OpenAI's encoder.py does it:

1. Pre-tokenise with GPT-2's regex: contractions ('s 't 're 've 'm 'll 'd), then runs of
   letters, of digits, or of other symbols, each with at most one leading space, then
   whitespace. Merges never cross these pieces.
2. Write each piece's UTF-8 bytes as printable characters (`bytes_to_unicode`: the 188 printable
   Latin-1 bytes stand for themselves, the other 68 for chr(256 + n)), so a space is 'Ġ' and every
   string has a spelling: there is no unknown token.
3. Merge the adjacent pair with the lowest rank in merges.txt until no pair has one; the
   resulting symbols are looked up in vocab.json.

GPT-2 has one special token, <|endoftext|>, used as BOS, EOS and (here) padding: padded
positions carry weight 0, so what id they hold does not matter. It has no [CLS], [SEP], [MASK]
or unknown token; those ids are None. A literal "<|endoftext|>" inside text is encoded as the
characters it is made of (OpenAI's encoder.py does the same), never as the special id.
"""

import functools
import json
from collections.abc import Iterable, Sequence

import regex

from zoo import paths
from zoo.errors import DataError, MissingFileError

ENDOFTEXT = "<|endoftext|>"
VOCAB_FILE, MERGES_FILE = "vocab.json", "merges.txt"
# GPT-2's pre-tokenisation pattern (openai/gpt-2 src/encoder.py), verbatim.
_PIECES = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


@functools.cache
def bytes_to_unicode() -> dict[int, str]:
    """Byte -> printable character: printable Latin-1 bytes map to themselves, the rest
    (control characters, space, 0x7f-0xa0, 0xad) to chr(256), chr(257), ... in byte order."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class GPT2Tokenizer:
    """Byte-level BPE over a GPT-2 vocabulary (the zoo.data.tokenizers.base.Tokenizer interface)."""

    cls_id = sep_id = mask_id = unk_id = None  # GPT-2 has none of them

    def __init__(self, vocab: dict[str, int], merges: Sequence[tuple[str, str]],
                 source: str = "<memory>"):
        self.source = source
        self._encoder = dict(vocab)
        self._decoder = {i: token for token, i in self._encoder.items()}
        if len(self._decoder) != len(self._encoder):
            raise DataError(f"{source}: vocab.json maps two tokens to one id")
        self._ranks = {pair: rank for rank, pair in enumerate(merges)}
        if ENDOFTEXT not in self._encoder:
            raise DataError(f"{source}: vocab.json has no {ENDOFTEXT} token; this is not a "
                            "GPT-2 vocabulary")
        self.bos_id = self.eos_id = self.pad_id = self._encoder[ENDOFTEXT]
        self.special_ids = (self.eos_id,)
        self._byte_to_char = bytes_to_unicode()
        self._char_to_byte = {c: b for b, c in self._byte_to_char.items()}
        missing = [c for c in self._byte_to_char.values() if c not in self._encoder]
        if missing:
            raise DataError(f"{source}: vocab.json lacks {len(missing)} of the 256 byte "
                            f"symbols (e.g. {missing[0]!r}); a byte-level vocabulary needs all")
        self._make_caches()

    def _make_caches(self) -> None:
        # Pre-tokenised pieces (mostly words with their leading space) repeat throughout a
        # corpus: encode looks each one up once per instance.
        self._piece_ids = functools.lru_cache(maxsize=1 << 17)(self._piece_ids_uncached)

    def __getstate__(self) -> dict:
        # Pickled for preparation worker processes: the cache (bound to this instance) stays.
        return {k: v for k, v in self.__dict__.items() if k != "_piece_ids"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._make_caches()

    @classmethod
    def from_directory(cls, directory: str) -> "GPT2Tokenizer":
        """Reads `directory`/vocab.json and `directory`/merges.txt (Hugging Face's layout)."""
        vocab_path = paths.join(directory, VOCAB_FILE)
        merges_path = paths.join(directory, MERGES_FILE)
        for path in (vocab_path, merges_path):
            if not paths.as_path(path).is_file():
                raise MissingFileError(f"GPT-2 tokenizer: {path} does not exist; a GPT-2 "
                                       f"directory holds {VOCAB_FILE} and {MERGES_FILE}")
        with paths.as_path(vocab_path).open(encoding="utf-8") as f:
            try:
                vocab = json.load(f)
            except json.JSONDecodeError as e:
                raise DataError(f"{vocab_path}: not valid JSON ({e})") from e
        merges = []
        with paths.as_path(merges_path).open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                line = line.rstrip("\n")
                if not line or (number == 1 and line.startswith("#version")):
                    continue
                pair = line.split(" ")
                if len(pair) != 2:
                    raise DataError(f"{merges_path}:{number}: a merge is two symbols separated "
                                    f"by one space, got {line!r}")
                merges.append((pair[0], pair[1]))
        return cls(vocab, merges, source=directory)

    @property
    def vocab_size(self) -> int:
        return max(self._decoder) + 1

    # ---- encoding ----------------------------------------------------------------------------

    @functools.lru_cache(maxsize=65536)
    def _bpe(self, word: str) -> tuple[str, ...]:
        """The BPE symbols of one pre-tokenised piece (already written as byte characters)."""
        symbols = list(word)
        while len(symbols) > 1:
            never = len(self._ranks)
            rank, (first, second) = min((self._ranks.get(pair, never), pair)
                                        for pair in zip(symbols, symbols[1:]))
            if rank == never:
                break
            # Merge every non-overlapping occurrence of the pair, left to right.
            merged, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and symbols[i] == first and symbols[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        return tuple(symbols)

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and, for each, the span text[start:end] of characters its bytes came from (a
        token holding part of a multi-byte character spans that whole character)."""
        ids, offsets = [], []
        for match in _PIECES.finditer(text):
            piece, start = match.group(), match.start()
            # The character each byte of the piece belongs to.
            byte_char = [start + k for k, ch in enumerate(piece) for _ in ch.encode("utf-8")]
            chars = self._byte_chars(piece)
            position = 0
            for symbol in self._bpe(chars):
                ids.append(self._encoder[symbol])
                first, last = byte_char[position], byte_char[position + len(symbol) - 1]
                offsets.append((first, last + 1))
                position += len(symbol)
        return ids, offsets

    def encode(self, text: str) -> list[int]:
        """encode_with_offsets' ids, piece by cached piece (merges never cross pieces)."""
        ids = []
        for piece in _PIECES.findall(text):
            ids.extend(self._piece_ids(piece))
        return ids

    def _piece_ids_uncached(self, piece: str) -> tuple[int, ...]:
        return tuple(self._encoder[symbol] for symbol in self._bpe(self._byte_chars(piece)))

    def _byte_chars(self, piece: str) -> str:
        """The piece's UTF-8 bytes written as bytes_to_unicode's printable characters."""
        return "".join(self._byte_to_char[b] for b in piece.encode("utf-8"))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    # ---- decoding and lookups ----------------------------------------------------------------

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`, <|endoftext|> dropped; invalid UTF-8 (a cut multi-byte character)
        becomes U+FFFD, as GPT-2's decoder does with errors='replace'."""
        data = bytearray()
        for i in ids:
            i = int(i)
            if i in self.special_ids:
                continue
            data.extend(self._char_to_byte[c] for c in self.id_to_token(i))
        return data.decode("utf-8", errors="replace")

    def id_to_token(self, i: int) -> str:
        if i not in self._decoder:
            raise ValueError(f"{self.source}: id {i} is not in the vocabulary of "
                             f"{self.vocab_size}")
        return self._decoder[i]

    def token_to_id(self, token: str) -> int:
        if token not in self._encoder:
            raise ValueError(f"{self.source}: token {token!r} is not in the vocabulary")
        return self._encoder[token]

    def is_word_start(self, i: int) -> bool:
        """True for tokens that begin with a space ('Ġ') or are special; a word at the very
        start of a text (no space before it) is the one start this cannot see."""
        return i in self.special_ids or self.id_to_token(i).startswith(self._byte_to_char[32])
