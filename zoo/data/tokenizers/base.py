"""Tokenizers behind one interface: SentencePiece models trained on the corpus, or BERT WordPiece.

`Tokenizer` is what tasks use: ids, character offsets into the original text (SQuAD answer
spans), special ids and word starts (whole-word masking). `load_tokenizer(path)` picks the
implementation from the file: a SentencePiece `.model`, a BERT `vocab.txt`
(zoo.data.tokenizers.wordpiece), a GPT-2 directory's vocab.json + merges.txt
(zoo.data.tokenizers.gpt2_bpe) or a character vocabulary `*.chars.json`
(zoo.data.tokenizers.chars).

SentencePiece models trained here fix their special ids so GPT and BERT share one model:
pad = 0 (never a real token; loss weight 0), unk = 1, bos = 2, eos = 3, [CLS] = 4, [SEP] = 5,
[MASK] = 6. All but unk are control symbols: text never produces them (a literal "[MASK]" in the
text is just characters) and `decode` drops them.

Normalisation: models are trained with sentencepiece's `identity` rule instead of the default
`nmt_nfkc`, so every piece is a verbatim substring of the text and offsets are exact (NFKC turns
'ﬁ' into 'fi' and '①' into '1', after which no character span equals a piece). The one
normalisation kept is whitespace: every Unicode whitespace character is mapped to ' ' before
sentencepiece sees the text (one character for one, so offsets are unchanged), and
sentencepiece collapses runs of spaces as usual.
"""

import io
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

import sentencepiece as spm

from zoo import paths
from zoo.data.tokenizers import chars, sample
from zoo.data.tokenizers.gpt2_bpe import MERGES_FILE, VOCAB_FILE, GPT2Tokenizer
from zoo.data.tokenizers.wordpiece import WordPieceTokenizer
from zoo.errors import ConfigError, DataError, MissingFileError

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
CLS_ID, SEP_ID, MASK_ID = 4, 5, 6
BERT_SPECIAL_PIECES = ("[CLS]", "[SEP]", "[MASK]")  # at CLS_ID, SEP_ID, MASK_ID
WORD_START = "\u2581"  # '▁': sentencepiece's marker for a piece that begins a word

# Every character str.isspace() accepts (Unicode White_Space plus the Cc separators
# \x1c-\x1f), except ' ' itself.
_WHITESPACE = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f\x85\xa0\u1680" + "".join(
    chr(c) for c in range(0x2000, 0x200B)
) + "\u2028\u2029\u202f\u205f\u3000"
_WHITESPACE_TO_SPACE = str.maketrans(_WHITESPACE, " " * len(_WHITESPACE))


@runtime_checkable
class Tokenizer(Protocol):
    """The interface every task uses; SentencePieceTokenizer and WordPieceTokenizer have it.

    `encode_with_offsets(text)` returns (ids, offsets) where `text[start:end]` is the span of the
    ORIGINAL text each id came from (end exclusive; an empty span for a piece with no characters
    of its own, such as a lone SentencePiece '▁'). `special_ids` are the ids masking must never
    pick or produce (pad, cls, sep, mask, plus bos/eos for SentencePiece); [UNK] is not among
    them, it stands for real text. `is_word_start(id)` is False exactly for pieces that continue
    a word (WordPiece '##x', SentencePiece pieces without a leading '▁'); specials are starts.
    """

    @property
    def vocab_size(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def unk_id(self) -> int: ...

    @property
    def cls_id(self) -> int: ...

    @property
    def sep_id(self) -> int: ...

    @property
    def mask_id(self) -> int: ...

    @property
    def special_ids(self) -> tuple[int, ...]: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def id_to_token(self, i: int) -> str: ...

    def token_to_id(self, token: str) -> int: ...

    def is_word_start(self, i: int) -> bool: ...


class SentencePieceTokenizer:
    """A SentencePiece model (BPE or unigram) with the project's fixed special ids."""

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID
    cls_id, sep_id, mask_id = CLS_ID, SEP_ID, MASK_ID
    special_ids = (PAD_ID, BOS_ID, EOS_ID, CLS_ID, SEP_ID, MASK_ID)

    def __init__(self, model_proto: bytes, source: str = "<memory>"):
        self.source = source
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self._proto = model_proto
        specials = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
        if specials != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise DataError(
                f"tokenizer {source}: special ids (pad, unk, bos, eos) are {specials}, zoo needs "
                f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}; retrain it with train_sentencepiece()"
            )
        size = self._sp.get_piece_size()
        found = tuple(self._sp.id_to_piece(i) if i < size else None for i in (4, 5, 6))
        if found != BERT_SPECIAL_PIECES or not all(self._sp.is_control(i) for i in (4, 5, 6)):
            raise DataError(
                f"tokenizer {source}: ids 4, 5, 6 must be the control symbols "
                f"{', '.join(BERT_SPECIAL_PIECES)}, found {found} (a model from before they were "
                "added?); delete it to retrain from the corpus, or retrain it with "
                "train_sentencepiece()"
            )
        pieces = [self._sp.id_to_piece(i) for i in range(size)]
        self._word_start = [
            i in self.special_ids or p.startswith(WORD_START) for i, p in enumerate(pieces)
        ]

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text.translate(_WHITESPACE_TO_SPACE))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode([t.translate(_WHITESPACE_TO_SPACE) for t in texts])

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and, per id, the (start, end) character span of `text` it came from.

        A piece's span excludes the space(s) its '▁' stands for, so for every known piece
        `text[start:end] == piece.lstrip('▁')`; a lone '▁' gets an empty span.
        """
        spaced = text.translate(_WHITESPACE_TO_SPACE)
        # sentencepiece reports UTF-8 byte offsets into its input; map them to characters.
        if spaced.isascii():
            char_at = None
        else:
            char_at, byte = {}, 0
            for i, c in enumerate(spaced):
                char_at[byte] = i
                byte += len(c.encode("utf-8"))
            char_at[byte] = len(spaced)
        ids, offsets = [], []
        for piece in self._sp.encode(spaced, out_type="proto").pieces:
            start, end = piece.begin, piece.end
            if char_at is not None:
                start, end = char_at[start], char_at[end]
            while start < end and spaced[start] == " ":
                start += 1
            ids.append(piece.id)
            offsets.append((start, end))
        return ids, offsets

    def decode(self, ids: Iterable[int]) -> str:
        # The special ids are control symbols: sentencepiece drops them when decoding.
        return self._sp.decode([int(i) for i in ids])

    def id_to_token(self, i: int) -> str:
        if not 0 <= int(i) < self.vocab_size:
            raise IndexError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
        return self._sp.id_to_piece(int(i))

    id_to_piece = id_to_token

    def token_to_id(self, token: str) -> int:
        i = self._sp.piece_to_id(token)
        if i == UNK_ID and token != self._sp.id_to_piece(UNK_ID):
            raise KeyError(f"piece {token!r} is not in the vocabulary of {self.source}")
        return i

    def is_word_start(self, i: int) -> bool:
        """True for pieces starting with '▁' and for special ids.

        [UNK] is not a start: sentencepiece emits a lone '▁' before an unknown word-initial
        character, and that '▁' is the word's start.
        """
        if not 0 <= int(i) < self.vocab_size:
            raise IndexError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
        return self._word_start[int(i)]

    def save(self, path: str) -> None:
        # atomic: a crash never leaves a half-written model behind (locally or in a bucket)
        paths.write_atomic(path, self._proto)

    @classmethod
    def load(cls, path: str) -> "SentencePieceTokenizer":
        try:
            # sentencepiece parses the bytes: no local file is needed for a gs:// model
            proto = paths.as_path(path).read_bytes()
        except FileNotFoundError:
            raise MissingFileError(f"tokenizer model {path} does not exist") from None
        try:
            return cls(proto, source=path)
        except RuntimeError as e:  # sentencepiece's parse error says nothing about the file
            raise DataError(
                f"tokenizer model {path} is not a SentencePiece model ({e}); delete it to "
                "retrain from the corpus, or point the config at a valid .model file"
            ) from None


def train_sentencepiece(
    texts: Iterable[str], vocab_size: int, model_type: str = "bpe"
) -> SentencePieceTokenizer:
    """Trains a SentencePiece model in memory on `texts` (one sentence each)."""
    if model_type not in ("bpe", "unigram", "char", "word"):
        raise ConfigError(f"model_type must be bpe, unigram, char or word, got {model_type!r}")
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=(t.translate(_WHITESPACE_TO_SPACE) for t in texts),
        model_writer=buffer,
        vocab_size=vocab_size,
        model_type=model_type,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        # Control, not user-defined, symbols: reserved ids that plain text can never produce.
        control_symbols=list(BERT_SPECIAL_PIECES),
        normalization_rule_name="identity",  # exact offsets; see the module docstring
        # A small corpus may not support the requested size; take what it supports instead of
        # failing, the model config reads the real size from the tokenizer.
        hard_vocab_limit=False,
        character_coverage=1.0,
        num_threads=1,  # deterministic: the same corpus always gives the same model
        minloglevel=2,
    )
    return SentencePieceTokenizer(buffer.getvalue())


def load_or_train(
    path: str, texts_fn, vocab_size: int, model_type: str = "bpe"
) -> SentencePieceTokenizer:
    """Loads the model cached at `path`, or trains one on `texts_fn()` and caches it there."""
    if paths.as_path(path).exists():
        return SentencePieceTokenizer.load(path)
    tokenizer = train_sentencepiece(texts_fn(), vocab_size, model_type)
    tokenizer.save(path)  # makes the directory
    return SentencePieceTokenizer.load(path)


def load_tokenizer(path: str, lowercase: bool = True) -> Tokenizer:
    """Loads a SentencePiece `.model`, a BERT WordPiece `vocab.txt` or a GPT-2 byte-level BPE.

    Args:
      path: a `.model` file, a `.txt` vocabulary, or a directory holding GPT-2's vocab.json +
        merges.txt (zoo.data.tokenizers.gpt2_bpe), `vocab.txt` or a single `.model` file (e.g. a
        converted checkpoint).
      lowercase: WordPiece only: True for uncased vocabularies (also strips accents, as BERT
        does). SentencePiece models are always cased.
    """
    directory = paths.as_path(path)
    if directory.is_dir():
        models = sorted(p.name for p in directory.iterdir() if p.name.endswith(".model"))
        if all((directory / f).is_file() for f in (VOCAB_FILE, MERGES_FILE)):
            return GPT2Tokenizer.from_directory(path)
        if (directory / "vocab.txt").is_file():
            path = paths.join(path, "vocab.txt")
        elif len(models) == 1:
            path = paths.join(path, models[0])
        else:
            raise ConfigError(
                f"tokenizer directory {path} holds no vocab.txt and {len(models)} .model files "
                f"{models}; pass the tokenizer file itself"
            )
    elif not directory.exists():
        raise MissingFileError(f"tokenizer {path} does not exist")
    if path.endswith(".model"):
        return SentencePieceTokenizer.load(path)
    if path.endswith(chars.SUFFIX):
        return chars.CharTokenizer.load(path)
    if path.endswith(".txt"):
        return WordPieceTokenizer.from_vocab_file(path, lowercase=lowercase)
    raise ConfigError(
        f"tokenizer {path}: cannot tell its kind from the name; give a SentencePiece .model "
        f"file, a WordPiece vocab.txt or a character vocabulary *{chars.SUFFIX}"
    )


def from_config(data, directory: str, train_documents) -> "Tokenizer":
    """The tokenizer a job's config.data names: `tokenizer` (a .model or vocab.txt; `lowercase`
    for WordPiece), else a SentencePiece model trained on the train documents and cached in
    `directory`, named by its settings so a resumed run (or another phase sharing the
    directory) reuses it and never retrains. tokenizer_type 'chars' builds zoo's character
    vocabulary instead (zoo.data.tokenizers.chars; vocab_size is then unused)."""
    if data.tokenizer:
        return load_tokenizer(data.tokenizer, lowercase=data.get("lowercase", True))
    if data.tokenizer_type == "chars":
        return chars.load_or_train(
            paths.join(directory, f"vocab{chars.SUFFIX}"),
            lambda: (sentence for doc in train_documents for sentence in doc))
    name = f"spm-{data.tokenizer_type}-{data.vocab_size}.model"
    size = data.get("tokenizer_sample_sentences")  # None (jobs without the key): every one

    def texts():
        sentences = (sentence for doc in train_documents for sentence in doc)
        if size is None:
            return sentences
        size_ = sample.check_size(size, "config.data.tokenizer_sample_sentences")
        return sample.sample_sentences(sentences, size_, data.get("seed", 0)).sentences

    return load_or_train(paths.join(directory, name), texts, vocab_size=data.vocab_size,
                         model_type=data.tokenizer_type)
