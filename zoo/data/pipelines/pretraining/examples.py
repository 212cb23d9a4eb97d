"""BERT pretraining examples: sentence pairs for next-sentence prediction and masked-LM targets.

Follows google-research/bert's create_pretraining_data.py (as the BERT sections of the Wenzhou
University Transformer lecture and of the lecture notes from NNLM to BERT give it: 15% of the
tokens are predicted, of those 80% -> [MASK], 10% -> a random token, 10% unchanged;
[CLS] A [SEP] B [SEP] with B the real continuation half of the time):

  * documents are lists of tokenized sentences; sentences accumulate into a chunk up to a target
    length (max_seq_length - 3, or with probability short_seq_prob a random shorter one), the
    chunk splits at a random sentence boundary into A and B, and half the time B is replaced by
    text from another document (the chunk's unused sentences are "put back" for the next chunk);
  * the longer side loses a token at a random end until the pair fits.

Deliberate differences from the reference:
  * a one-sentence chunk that draws IsNext is paired with its neighbouring sentence (the next
    one, else the previous one) instead of always getting a random B; the reference's rule makes
    ~60% of the synthetic corpus's pairs NotNext, this keeps the labels at ~50%;
  * a random B never comes from A's own document (the reference gives up after 10 tries);
  * the masked count is round(masked_lm_prob * the number of maskable tokens) (the reference
    also counts [CLS] and [SEP], which are never masked).

Masking is either static (`dupe_factor` passes over the corpus, each with fresh pairs and masks,
stored on disk as in the reference; drawn by the batch masker from keys of (seed, shard, pass,
row)) or dynamic (pairs stored unmasked, masks drawn when a batch is
built from keys of (seed, epoch, example index), so a restored iterator redraws the same masks
and every epoch sees new ones); zoo.data.pipelines.masking holds the rules and both drivers.

Everything here makes examples and nothing stores them: `shard_examples` is a pure function of
one piece's encoded documents, the Settings and the shard index, so shards can be made in any order or in
parallel. zoo.data.pipelines.pretraining caches them on disk and reads them back as batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from zoo.data.pipelines.masking import MaskingSpec, mask_batch, masking_keys
from zoo.data.pipelines.masking import check_max_predictions as _check_max_predictions
from zoo.errors import ConfigError, DataError

# Tags the rng that shuffles a shard's rows (pass rngs are keyed by dupe < 2**16).
_SHUFFLE_STREAM = 1 << 16

# Feature name -> (dtype, per-example shape in terms of L = max_seq_length, P = predictions).
PAIR_FEATURES = {
    "input_ids": (np.int32, "L"),
    "token_type_ids": (np.int32, "L"),
    "attention_mask": (np.int32, "L"),
    "next_sentence_labels": (np.int32, ""),
}
MLM_FEATURES = {
    "masked_lm_positions": (np.int32, "P"),
    "masked_lm_ids": (np.int32, "P"),
    "masked_lm_weights": (np.float32, "P"),
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything that shapes the prepared examples (all of it goes into the cache key).

    Attributes:
      max_seq_length: L, the padded length of [CLS] A [SEP] B [SEP].
      max_predictions_per_seq: P, the most masked-LM targets per example.
      masked_lm_prob: fraction of the maskable tokens to predict.
      short_seq_prob: chance a document's target length is a random one in [2, L - 3].
      dupe_factor: passes over the corpus, each with new pairs (and, static, new masks); 10 as
        in the reference.
      whole_word: mask every piece of a word together (the tokenizer's `is_word_start`).
      dynamic_masking: store pairs unmasked and mask them per (seed, epoch, index) when batching.
      seed: drives pair creation and static masks.
    """

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    whole_word: bool = False
    dynamic_masking: bool = False
    seed: int = 12345

    def __post_init__(self):
        _check_max_seq_length(self.max_seq_length)
        _check_max_predictions(self.max_predictions_per_seq)
        if not 0.0 < self.masked_lm_prob <= 1.0:
            raise ConfigError(f"masked_lm_prob={self.masked_lm_prob!r} must be in (0, 1]")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ConfigError(f"short_seq_prob={self.short_seq_prob!r} must be in [0, 1]")
        if not isinstance(self.dupe_factor, int) or not 1 <= self.dupe_factor < 2**16:
            raise ConfigError(f"dupe_factor={self.dupe_factor!r} must be an int in [1, 65535]")


def _check_max_seq_length(max_seq_length) -> None:
    if not isinstance(max_seq_length, (int, np.integer)) or max_seq_length < 8:
        raise ConfigError(
            f"max_seq_length={max_seq_length!r} must be an int >= 8: [CLS] A [SEP] B [SEP] "
            "needs room for two non-trivial segments"
        )


def feature_shapes(settings: Settings) -> dict[str, tuple[int, ...]]:
    """Per-example shape of each dims code of PAIR_FEATURES / MLM_FEATURES ('L', 'P', '')."""
    return {"L": (settings.max_seq_length,), "P": (settings.max_predictions_per_seq,), "": ()}


# ---------------------------------------------------------------------------------------------
# Sentence pairs.


@dataclasses.dataclass(frozen=True)
class Instance:
    """One sentence pair before layout and masking.

    `a_sentences` / `b_sentences` are [start, end) ranges over the non-empty sentences of
    `a_document` / `b_document` that the (possibly truncated) segments were cut from; they make
    the pairing checkable.
    """

    tokens_a: np.ndarray
    tokens_b: np.ndarray
    is_random_next: bool
    a_document: int
    a_sentences: tuple[int, int]
    b_document: int
    b_sentences: tuple[int, int]


def create_instances(
    documents: Sequence[Sequence[Sequence[int]]],
    rng: np.random.Generator,
    max_seq_length: int,
    short_seq_prob: float = 0.1,
    *,
    document_indices: Sequence[int] | None = None,
    source: str = "documents",
) -> list[Instance]:
    """Sentence pairs from each document, as BERT's create_instances_from_document.

    Args:
      documents: documents as lists of tokenized sentences (empty sentences are skipped).
      rng: numpy Generator driving target lengths, split points, random B and truncation.
      max_seq_length: L; every pair fits in L - 3 tokens.
      short_seq_prob: chance a document uses a random target length in [2, L - 3].
      document_indices: the documents to make pairs from (default: all); a random B may come
        from any document.
      source: names the corpus in error messages.

    Returns:
      Instances in document order; about half have `is_random_next` (label 1, NotNext).

    Raises:
      ValueError: if no document has two sentences or there are fewer than two documents,
        which leaves next-sentence prediction without positive or negative pairs.
    """
    _check_max_seq_length(max_seq_length)
    docs = _as_arrays(documents)
    nonempty = _check_pairable(docs, source)
    return _create(docs, nonempty, rng, max_seq_length, short_seq_prob,
                   range(len(docs)) if document_indices is None else document_indices)


def _as_arrays(documents) -> list[list[np.ndarray]]:
    return [[np.asarray(s, np.int32) for s in doc if len(s)] for doc in documents]


def _check_pairable(docs: list[list[np.ndarray]], source: str) -> np.ndarray:
    """Sorted indices of the non-empty documents, after checking NSP can make pairs."""
    nonempty = np.array([d for d, doc in enumerate(docs) if doc], np.int64)
    if len(nonempty) < 2 or max(len(docs[d]) for d in nonempty) < 2:
        raise DataError(
            f"{source}: {len(nonempty)} non-empty documents, none with 2 or more sentences; "
            "next-sentence prediction needs at least 2 documents and some of several sentences "
            "(text format: one sentence per line, a blank line between documents)"
        )
    return nonempty


def _create(docs, nonempty, rng, max_seq_length, short_seq_prob, indices) -> list[Instance]:
    max_num_tokens = max_seq_length - 3  # room for [CLS], [SEP], [SEP]
    instances = []
    for d in indices:
        if docs[d]:
            instances.extend(_document_instances(docs, nonempty, d, rng, max_num_tokens,
                                                 short_seq_prob))
    return instances


def _document_instances(docs, nonempty, d, rng, max_num_tokens, short_seq_prob):
    document = docs[d]
    # Usually fill the whole sequence (padding is wasted compute); sometimes go shorter so
    # pretraining also sees the short inputs of fine-tuning. A rough target, not a limit.
    target = max_num_tokens
    if rng.random() < short_seq_prob:
        target = int(rng.integers(2, max_num_tokens + 1))
    # Splitting at sentence boundaries (not at an arbitrary token) keeps NSP from being trivial.
    instances = []
    start, length, i = 0, 0, 0
    while i < len(document):
        length += len(document[i])
        if i == len(document) - 1 or length >= target:
            first = start  # the chunk is sentences [first, i]
            random_next = rng.random() < 0.5
            if i == first and not random_next:
                # A one-sentence chunk cannot be split; the reference then always takes a random
                # B, which on short documents skews the labels (~60% NotNext on the synthetic
                # corpus). Pair it with a neighbour instead, so the coin flip stays fair.
                if i + 1 < len(document):
                    i += 1
                elif first > 0:
                    first -= 1
                else:
                    random_next = True  # a one-sentence document has no continuation
            chunk = i + 1 - first
            a_end = first + (1 if chunk < 2 else int(rng.integers(1, chunk)))
            tokens_a = np.concatenate(document[first:a_end])
            if random_next:
                r = _other_document(nonempty, d, rng)
                other = docs[r]
                b_start = int(rng.integers(len(other)))
                b_end, b_len = b_start, 0
                while b_end < len(other) and (b_end == b_start or b_len < target - len(tokens_a)):
                    b_len += len(other[b_end])
                    b_end += 1
                tokens_b = np.concatenate(other[b_start:b_end])
                b = (r, (b_start, b_end))
                # The chunk's sentences after A were not used: put them back for the next chunk.
                i = a_end - 1
            else:
                tokens_b = np.concatenate(document[a_end:i + 1])
                b = (d, (a_end, i + 1))
            tokens_a, tokens_b = truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            instances.append(Instance(tokens_a, tokens_b, random_next, d, (first, a_end), *b))
            start, length = i + 1, 0
        i += 1
    return instances


def _other_document(nonempty: np.ndarray, d: int, rng: np.random.Generator) -> int:
    """A uniformly drawn non-empty document other than d (never d itself)."""
    j = int(rng.integers(len(nonempty) - 1))
    own = int(np.searchsorted(nonempty, d))  # d's place among the non-empty documents
    return int(nonempty[j + (j >= own)])


def truncate_seq_pair(tokens_a: np.ndarray, tokens_b: np.ndarray, max_num_tokens: int,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Drops a token from the front or back (at random) of the longer side until both fit.

    Removing from either end avoids biasing pairs towards their beginnings; taking from the
    longer side keeps both sides non-empty whenever max_num_tokens >= 2.
    """
    a0, a1, b0, b1 = 0, len(tokens_a), 0, len(tokens_b)
    excess = a1 + b1 - max_num_tokens
    if excess > 0:
        front = rng.random(excess) < 0.5
        for f in front:
            if a1 - a0 >= b1 - b0:
                a0, a1 = (a0 + 1, a1) if f else (a0, a1 - 1)
            else:
                b0, b1 = (b0 + 1, b1) if f else (b0, b1 - 1)
    return tokens_a[a0:a1], tokens_b[b0:b1]


def pair_features(instance: Instance, max_seq_length: int, cls_id: int, sep_id: int,
                  pad_id: int = 0) -> dict[str, np.ndarray]:
    """[CLS] A [SEP] B [SEP] padded to L: input_ids, token_type_ids (0 for [CLS] A [SEP], 1 for
    B [SEP]), attention_mask (1 real) and next_sentence_labels (0 IsNext, 1 NotNext)."""
    la, lb = len(instance.tokens_a), len(instance.tokens_b)
    n = la + lb + 3
    if n > max_seq_length:
        raise ValueError(f"instance of {n} tokens exceeds max_seq_length={max_seq_length}")
    input_ids = np.full(max_seq_length, pad_id, np.int32)
    input_ids[:n] = np.concatenate(
        [[cls_id], instance.tokens_a, [sep_id], instance.tokens_b, [sep_id]])
    token_type_ids = np.zeros(max_seq_length, np.int32)
    token_type_ids[la + 2:n] = 1
    attention_mask = np.zeros(max_seq_length, np.int32)
    attention_mask[:n] = 1
    return {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": attention_mask,
        "next_sentence_labels": np.int32(instance.is_random_next),
    }


# ---------------------------------------------------------------------------------------------
# A corpus's examples, shard by shard.


def _encode_all(tokenizer, documents: Sequence[Sequence[str]], chunk: int = 4096):
    """Token-id arrays per sentence per document, through encode_batch where it exists."""
    flat = [s for doc in documents for s in doc]
    encode_batch = getattr(tokenizer, "encode_batch", None)
    ids = []
    for i in range(0, len(flat), chunk):
        texts = flat[i:i + chunk]
        ids.extend(encode_batch(texts) if encode_batch else [tokenizer.encode(t) for t in texts])
    out, k = [], 0
    for doc in documents:
        out.append([np.asarray(x, np.int32) for x in ids[k:k + len(doc)]])
        k += len(doc)
    return out


def encode_documents(tokenizer, documents: Sequence[Sequence[str]],
                     source: str = "documents") -> list[list[np.ndarray]]:
    """Token ids per non-empty sentence per document, checked to make NSP pairs.

    Args:
      tokenizer: the common tokenizer interface (encode, optional encode_batch).
      documents: lists of sentences (zoo.data.readers.sources.load_documents).
      source: names the corpus in error messages.

    Raises:
      DataError: if no document has two sentences or there are fewer than two documents.
    """
    docs = _as_arrays(_encode_all(tokenizer, documents))
    _check_pairable(docs, source)
    return docs


def word_start_table(tokenizer) -> np.ndarray:
    """bool [vocab_size]: tokenizer.is_word_start(id) for every id (special ids included)."""
    return np.array([bool(tokenizer.is_word_start(i)) for i in range(tokenizer.vocab_size)],
                    dtype=bool)


def masking_spec(settings: Settings, tokenizer) -> MaskingSpec:
    """What masking needs from the settings and the tokenizer (stored in a cache manifest)."""
    return MaskingSpec(
        settings.masked_lm_prob, settings.max_predictions_per_seq, int(tokenizer.vocab_size),
        int(tokenizer.mask_id), tuple(sorted(int(i) for i in tokenizer.special_ids)),
        settings.whole_word,
    )


def stored_features(settings: Settings) -> dict[str, tuple[type, str]]:
    """The features an example holds before batching: the pair's, plus the masked-LM targets
    unless masking is dynamic (then they are drawn per batch)."""
    return {**PAIR_FEATURES, **({} if settings.dynamic_masking else MLM_FEATURES)}


def shard_examples(docs: list[list[np.ndarray]], settings: Settings, shard: int, tokenizer,
                   word_starts: np.ndarray, source: str = "documents") -> dict[str, np.ndarray]:
    """The examples of one shard: pairs (and, static, masks) from one piece of the corpus.

    Makes `settings.dupe_factor` passes over `docs` (the piece's documents; a random B comes
    from another document of the same piece, as the reference does within one input file), each
    from its own rng seeded by (settings.seed, shard, pass): the result depends on nothing but
    the arguments, so shards can be made in any order, by any process.

    Args:
      docs: from `encode_documents`.
      settings: see Settings.
      shard: the shard's index (seeds its rngs).
      tokenizer: gives cls_id, sep_id, pad_id, vocab_size, mask_id and special_ids.
      word_starts: `word_start_table(tokenizer)`.
      source: names the piece in error messages.

    Returns:
      feature name -> array [num_examples, *shape] for every `stored_features(settings)`,
      rows shuffled by an rng seeded by (settings.seed, shard).
    """
    nonempty = _check_pairable(docs, source)
    spec = masking_spec(settings, tokenizer)
    names = stored_features(settings)
    shape = feature_shapes(settings)
    passes = []
    for dupe in range(settings.dupe_factor):
        rng = np.random.default_rng([settings.seed, shard, dupe])
        instances = _create(docs, nonempty, rng, settings.max_seq_length,
                            settings.short_seq_prob, range(len(docs)))
        # Rows go straight into arrays: a list of per-row dicts costs ~10x the memory.
        arrays = {k: np.zeros((len(instances), *shape[dims]), dtype)
                  for k, (dtype, dims) in PAIR_FEATURES.items()}
        for i, inst in enumerate(instances):
            row = pair_features(inst, settings.max_seq_length, tokenizer.cls_id,
                                tokenizer.sep_id, tokenizer.pad_id)
            for k in PAIR_FEATURES:
                arrays[k][i] = row[k]
        if not settings.dynamic_masking:
            # Static masks the way dynamic ones are drawn (a batch at a time, row r from a key
            # of its own), keyed by (seed, shard, pass, r) instead of (seed, epoch, index).
            keys = masking_keys(settings.seed, (shard << 16) | dupe, np.arange(len(instances)))
            arrays.update(mask_batch(arrays["input_ids"], keys, spec, word_starts))
        passes.append({k: arrays[k].astype(names[k][0], copy=False) for k in names})
    # Rows in a seeded random order, as the reference shuffles its instances: a run of
    # consecutive rows (what training reads from a bucket in one request) is then a random
    # sample of the shard, not consecutive pieces of one document.
    order = np.random.default_rng([settings.seed, shard, _SHUFFLE_STREAM]).permutation(
        sum(len(p["next_sentence_labels"]) for p in passes))
    # Feature by feature, each pass's array dropped once copied: the peak is the shard plus one
    # feature, not two shards (preparation memory is per worker, on hosts of hundreds of cores).
    return {k: np.concatenate([p.pop(k) for p in passes])[order] for k in names}
