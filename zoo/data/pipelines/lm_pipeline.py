"""Language-model input pipeline: documents -> SentencePiece ids -> packed rows (batched by
zoo.data.pipelines.batching).

config.data.char_split = f (0 < f < 1) splits instead as nanoGPT's shakespeare_char does: the
files of config.data.train_files read as one text, verbatim (line breaks kept), its first f of
the characters for training and the rest for validation (each split one document).
"""

import collections

import ml_collections
import numpy as np

from zoo.data.pipelines.packing import pack_lm_rows
from zoo.data.readers import data_source, sources, text_files
from zoo.data.tokenizers.base import BOS_ID, EOS_ID
from zoo.errors import ConfigError

Documents = list[list[str]]


def tokenize_documents(tokenizer, documents: Documents) -> list[list[int]]:
    """[bos] + sentence ids ... + [eos] per document, with the tokenizer's own bos and eos ids
    (GPT-2's byte-level BPE has one, <|endoftext|> = 50256, where zoo's own vocabularies have
    2 and 3: as ids of GPT-2's, those are the characters '#' and '$')."""
    bos, eos = document_ids(tokenizer)
    out = []
    for doc in documents:
        ids = [bos]
        for piece in tokenizer.encode_batch(doc):
            ids.extend(piece)
        ids.append(eos)
        out.append(ids)
    return out


def document_ids(tokenizer) -> tuple[int, int]:
    """(bos, eos) a document starts and ends with: the tokenizer's own, or zoo's fixed 2 and 3
    for one without them (BERT's WordPiece, whose vocabularies carry no such tokens)."""
    bos, eos = getattr(tokenizer, "bos_id", None), getattr(tokenizer, "eos_id", None)
    return (BOS_ID if bos is None else bos), (EOS_ID if eos is None else eos)


def packed_rows(tokenizer, documents: Documents, seq_len: int) -> dict[str, np.ndarray]:
    return pack_lm_rows(tokenize_documents(tokenizer, documents), seq_len)


def unigram_nll_per_token(train_rows: dict, eval_rows: dict, vocab_size: int) -> float:
    """Mean NLL of an add-one unigram model fit on the train targets: the baseline an LM must
    beat to show it learned more than word frequencies."""
    w = train_rows["weights"] > 0
    counts = np.bincount(train_rows["targets"][w], minlength=vocab_size).astype(np.float64) + 1.0
    log_p = np.log(counts / counts.sum())
    ev = eval_rows["weights"] > 0
    return float(-log_p[eval_rows["targets"][ev]].mean())


def load_splits(cfg: ml_collections.ConfigDict) -> tuple[Documents, Documents]:
    """(train, validation) documents: config.data's source, or its char_split when set."""
    fraction = cfg.get("char_split", 0.0)
    if fraction:
        return split_by_characters(cfg, fraction)
    return sources.load_documents(cfg, "train"), sources.load_documents(cfg, "validation")


def split_by_characters(cfg: ml_collections.ConfigDict, fraction: float
                        ) -> tuple[Documents, Documents]:
    """The text of config.data.train_files (its files joined in sorted order, verbatim) cut at
    character int(len * fraction): ([[first part]], [[rest]])."""
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"config.data.char_split={fraction} must lie strictly between 0 and 1 "
                          "(the fraction of the text's characters that trains; 0 = off)")
    if data_source.source_of(cfg) != data_source.FILES:
        raise ConfigError("config.data.char_split cuts text files: set config.data.source="
                          f"'files' and config.data.train_files (source is {cfg.source!r})")
    if cfg.eval_files:
        raise ConfigError(
            f"config.data.char_split={fraction} takes both splits from config.data.train_files; "
            f"leave config.data.eval_files empty (it is {cfg.eval_files!r})")
    if not cfg.get("tokenizer") and cfg.get("tokenizer_type") != "chars":
        # SentencePiece's trainer skips sentences over ~4 KB: one verbatim text leaves it none.
        raise ConfigError(
            "config.data.char_split keeps each split as one verbatim text, which a SentencePiece "
            f"model (tokenizer_type={cfg.get('tokenizer_type')!r}) cannot be trained on: set "
            "config.data.tokenizer_type='chars', or give a trained tokenizer in "
            "config.data.tokenizer")
    files = sources.expand_files(cfg.train_files, "config.data.train_files")
    text = "".join(text_files.read_utf8(f, "text file") for f in files)
    cut = int(len(text) * fraction)
    if cut == 0 or cut == len(text):
        raise ConfigError(f"config.data.char_split={fraction} of {len(text)} characters "
                          f"({', '.join(files)}) leaves a split empty")
    return [[text[:cut]]], [[text[cut:]]]


def unknown_characters(tokenizer, documents: Documents) -> collections.Counter:
    """Characters of `documents` a character tokenizer never saw (each encodes to its unknown
    id); empty for other tokenizers."""
    count = getattr(tokenizer, "unknown_characters", None)
    found = collections.Counter()
    if count is not None:
        for doc in documents:
            for sentence in doc:
                found.update(count(sentence))
    return found
