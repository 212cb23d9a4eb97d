"""The data benchmarks' corpus, shared by every stage (benchmarks.data, data_prepare,
data_bucket): the synthetic world's train documents and a WordPiece vocabulary of BERT's size
over them, so random replacements are drawn from as many ids as BERT-base's."""

import re

VOCAB_SIZE = 30522  # BERT's uncased WordPiece vocabulary


def documents(entities: int) -> list[list[str]]:
    """The synthetic world's train documents (as sentence lists) for `entities` entities."""
    from zoo.data.synthetic.documents import corpus_splits

    return [list(d.texts) for d in corpus_splits(num_entities=entities)["train"]]


def bert_sized_vocab(texts) -> list[str]:
    """A WordPiece vocabulary of VOCAB_SIZE: specials, the texts' characters (and ## forms) and
    words, then [unusedN] entries (as BERT's own vocab.txt has) to BERT's size."""
    words = sorted({w for t in texts for w in re.findall(r"\w+|[^\w\s]", t.lower())})
    chars = sorted({c for w in words for c in w})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars),
             *(w for w in words if len(w) > 1)]
    if len(vocab) > VOCAB_SIZE:
        raise SystemExit(f"the corpus has {len(vocab)} tokens, more than {VOCAB_SIZE}")
    return vocab + [f"[unused{i}]" for i in range(VOCAB_SIZE - len(vocab))]
