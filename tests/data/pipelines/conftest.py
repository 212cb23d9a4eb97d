"""Shared by the BERT pretraining data tests: the synthetic corpus and a real SentencePiece
tokenizer (vocab 300, so most names split into several pieces, which whole-word masking needs)."""

import pytest

from zoo.data.synthetic.documents import corpus_splits
from zoo.data.tokenizers import base as tokenizers


@pytest.fixture(scope="module")
def corpus():
    splits = corpus_splits()
    return {name: [list(d.texts) for d in docs] for name, docs in splits.items()}


@pytest.fixture(scope="module")
def tok(corpus):
    return tokenizers.train_sentencepiece(
        [s for doc in corpus["train"] for s in doc], vocab_size=300)
