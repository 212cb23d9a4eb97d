"""Language-model input pipeline: documents -> SentencePiece ids -> packed rows (batched by
zoo.data.pipelines.batching)."""

import ml_collections
import numpy as np

from zoo.data.pipelines.packing import pack_lm_rows
from zoo.data.readers import sources
from zoo.data.tokenizers.base import BOS_ID, EOS_ID

Documents = list[list[str]]


def tokenize_documents(tokenizer, documents: Documents) -> list[list[int]]:
    """[bos] + sentence ids ... + [eos] per document."""
    out = []
    for doc in documents:
        ids = [BOS_ID]
        for piece in tokenizer.encode_batch(doc):
            ids.extend(piece)
        ids.append(EOS_ID)
        out.append(ids)
    return out


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
    return sources.load_documents(cfg, "train"), sources.load_documents(cfg, "validation")
