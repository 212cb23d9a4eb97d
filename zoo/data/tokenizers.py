"""Tokenizers behind one small interface: SentencePiece models trained on the corpus or loaded.

Special ids are fixed across the project so models, packing and decoding agree on them:
pad = 0 (never a real token; loss weight 0), unk = 1, bos = 2, eos = 3.
"""

import io
import os
from collections.abc import Iterable, Sequence

import sentencepiece as spm

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


class SentencePieceTokenizer:
    """A SentencePiece model (BPE or unigram) with the project's fixed special ids."""

    def __init__(self, model_proto: bytes, source: str = "<memory>"):
        self.source = source
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self._proto = model_proto
        specials = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
        if specials != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise ValueError(
                f"tokenizer {source}: special ids (pad, unk, bos, eos) are {specials}, zoo needs "
                f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}; retrain it with train_sentencepiece()"
            )

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode(list(texts))

    def decode(self, ids: Iterable[int]) -> str:
        # Stop ids (pad/bos/eos) are control symbols: sentencepiece drops them when decoding.
        return self._sp.decode([int(i) for i in ids])

    def id_to_piece(self, i: int) -> str:
        return self._sp.id_to_piece(int(i))

    def save(self, path: str) -> None:
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(self._proto)
        os.replace(tmp, path)  # atomic: a crash never leaves a half-written model behind

    @classmethod
    def load(cls, path: str) -> "SentencePieceTokenizer":
        try:
            with open(path, "rb") as f:
                proto = f.read()
        except FileNotFoundError:
            raise FileNotFoundError(f"tokenizer model {path} does not exist") from None
        try:
            return cls(proto, source=path)
        except RuntimeError as e:  # sentencepiece's parse error says nothing about the file
            raise ValueError(
                f"tokenizer model {path} is not a SentencePiece model ({e}); delete it to "
                "retrain from the corpus, or point the config at a valid .model file"
            ) from None


def train_sentencepiece(
    texts: Iterable[str], vocab_size: int, model_type: str = "bpe"
) -> SentencePieceTokenizer:
    """Trains a SentencePiece model in memory on `texts` (one sentence each)."""
    if model_type not in ("bpe", "unigram", "char", "word"):
        raise ValueError(f"model_type must be bpe, unigram, char or word, got {model_type!r}")
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=buffer,
        vocab_size=vocab_size,
        model_type=model_type,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
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
    if os.path.exists(path):
        return SentencePieceTokenizer.load(path)
    tokenizer = train_sentencepiece(texts_fn(), vocab_size, model_type)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tokenizer.save(path)
    return SentencePieceTokenizer.load(path)
