"""BERT pretraining examples: sentence pairs for next-sentence prediction and masked-LM targets.

Follows google-research/bert's create_pretraining_data.py (as the BERT sections of the Wenzhou
University Transformer lecture and of the lecture notes from NNLM to BERT give it: 15% of the
tokens are predicted, of those 80% -> [MASK], 10% -> a random token, 10% unchanged;
[CLS] A [SEP] B [SEP] with B the real continuation half of the time). The pairs are
zoo.data.pipelines.pretraining.pairs (the reference's rules, where zoo departs from them, and
how a pass is made); the masked count is round(masked_lm_prob * the number of maskable tokens)
(the reference also counts [CLS] and [SEP], which are never masked).

Masking is either static (`dupe_factor` passes over the corpus, each with fresh pairs and masks,
stored on disk as in the reference; a pass's masks drawn at once from an rng of (seed, shard,
pass)) or dynamic (pairs stored unmasked, masks drawn when a batch is built from keys of (seed,
epoch, example index), so a restored iterator redraws the same masks and every epoch sees new
ones); zoo.data.pipelines.masking holds the rules and both drivers.

Everything here makes examples and nothing stores them: `shard_examples` is a pure function of
one piece's encoded documents, the Settings and the shard index, so shards can be made in any
order or in parallel. zoo.data.pipelines.pretraining caches them on disk and reads them back as
batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from zoo.data.pipelines.masking import MaskingSpec, mask_pass, pass_draws
from zoo.data.pipelines.masking import check_max_predictions as _check_max_predictions
from zoo.data.pipelines.pretraining import pairs
from zoo.data.pipelines.pretraining.pairs import check_max_seq_length
from zoo.errors import ConfigError

# Tag the rngs that shuffle a shard's rows and draw a pass's static masks (pass rngs are keyed
# by dupe < 2**16).
_SHUFFLE_STREAM = 1 << 16
_MASK_STREAM = (1 << 16) + 1

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
        check_max_seq_length(self.max_seq_length)
        _check_max_predictions(self.max_predictions_per_seq)
        if not 0.0 < self.masked_lm_prob <= 1.0:
            raise ConfigError(f"masked_lm_prob={self.masked_lm_prob!r} must be in (0, 1]")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ConfigError(f"short_seq_prob={self.short_seq_prob!r} must be in [0, 1]")
        if not isinstance(self.dupe_factor, int) or not 1 <= self.dupe_factor < 2**16:
            raise ConfigError(f"dupe_factor={self.dupe_factor!r} must be an int in [1, 65535]")


def feature_shapes(settings: Settings) -> dict[str, tuple[int, ...]]:
    """Per-example shape of each dims code of PAIR_FEATURES / MLM_FEATURES ('L', 'P', '')."""
    return {"L": (settings.max_seq_length,), "P": (settings.max_predictions_per_seq,), "": ()}


# ---------------------------------------------------------------------------------------------
# Sentence pairs one at a time (the pass-at-once forms are in zoo.data.pipelines.pretraining.pairs).


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
    """Sentence pairs from each document, as BERT's create_instances_from_document (one pass of
    pairs.make_pairs, as Instances).

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
      DataError: if no document has two sentences or there are fewer than two documents,
        which leaves next-sentence prediction without positive or negative pairs.
    """
    check_max_seq_length(max_seq_length)
    flat = pairs.flatten(documents, source)
    made = pairs.make_pairs(flat, rng, max_seq_length, short_seq_prob, document_indices)
    firsts = flat.first_sentence
    return [
        Instance(
            flat.tokens[made.a_start[i]:made.a_stop[i]],
            flat.tokens[made.b_start[i]:made.b_stop[i]],
            bool(made.is_random_next[i]),
            int(made.a_document[i]),
            tuple(int(k - firsts[made.a_document[i]]) for k in made.a_sentences[i]),
            int(made.b_document[i]),
            tuple(int(k - firsts[made.b_document[i]]) for k in made.b_sentences[i]),
        )
        for i in range(len(made))
    ]


def truncate_seq_pair(tokens_a: np.ndarray, tokens_b: np.ndarray, max_num_tokens: int,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Drops a token from the front or back (at random) of the longer side until both fit.

    Removing from either end avoids biasing pairs towards their beginnings; taking from the
    longer side keeps both sides non-empty whenever max_num_tokens >= 2.
    """
    la, lb = pairs.truncated_lengths(len(tokens_a), len(tokens_b), max_num_tokens)
    a0 = int(rng.binomial(len(tokens_a) - la, 0.5))
    b0 = int(rng.binomial(len(tokens_b) - lb, 0.5))
    return tokens_a[a0:a0 + la], tokens_b[b0:b0 + lb]


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


def encode_documents(tokenizer, documents: Sequence[Sequence[str]],
                     source: str = "documents", chunk: int = 4096) -> pairs.FlatDocuments:
    """Token ids of every non-empty sentence, flat (pairs.flatten), checked to make NSP pairs.

    Args:
      tokenizer: the common tokenizer interface (encode, optional encode_batch or
        encode_flat).
      documents: lists of sentences (zoo.data.readers.sources.load_documents).
      source: names the corpus in error messages.
      chunk: sentences per encode_batch call.

    Raises:
      DataError: if no document has two sentences or there are fewer than two documents.
    """
    sentences = [s for doc in documents for s in doc]
    counts = [len(doc) for doc in documents]
    encode_flat = getattr(tokenizer, "encode_flat", None)
    if encode_flat is not None:
        return pairs.from_lengths(*encode_flat(sentences), counts, source)
    encode_batch = getattr(tokenizer, "encode_batch", None)
    ids = []
    for i in range(0, len(sentences), chunk):
        texts = sentences[i:i + chunk]
        ids.extend(encode_batch(texts) if encode_batch else [tokenizer.encode(t) for t in texts])
    docs, k = [], 0
    for n in counts:
        docs.append(ids[k:k + n])
        k += n
    return pairs.flatten(docs, source)


def word_start_table(tokenizer) -> np.ndarray:
    """bool [vocab_size]: tokenizer.is_word_start(id) for every id (special ids included), from
    the tokenizer's `word_starts()` when it has one."""
    whole = getattr(tokenizer, "word_starts", None)
    if whole is not None:
        return np.array(whole(), dtype=bool)
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


def shard_examples(docs: pairs.FlatDocuments, settings: Settings, shard: int, tokenizer,
                   word_starts: np.ndarray) -> dict[str, np.ndarray]:
    """The examples of one shard: pairs (and, static, masks) from one piece of the corpus.

    Makes `settings.dupe_factor` passes of pairs over `docs` (the piece's documents; a random B
    comes from another document of the same piece, as the reference does within one input
    file), each pass's pairs and (static) masks from rngs seeded by (settings.seed, shard, pass):
    the result depends on nothing but the arguments, so shards can be made in any order, by any
    process.

    Args:
      docs: from `encode_documents`.
      settings: see Settings.
      shard: the shard's index (seeds its rngs).
      tokenizer: gives cls_id, sep_id, pad_id, vocab_size, mask_id and special_ids.
      word_starts: `word_start_table(tokenizer)`.

    Returns:
      feature name -> array [num_examples, *shape] for every `stored_features(settings)`,
      rows shuffled by an rng seeded by (settings.seed, shard).
    """
    spec, length = masking_spec(settings, tokenizer), settings.max_seq_length
    passes = [pairs.make_pairs(docs, np.random.default_rng([settings.seed, shard, dupe]),
                               length, settings.short_seq_prob)
              for dupe in range(settings.dupe_factor)]
    made = pairs.Pairs.concatenate(passes)
    # Rows in a seeded random order, as the reference shuffles its instances: a run of
    # consecutive rows (what training reads from a bucket in one request) is then a random
    # sample of the shard, not consecutive pieces of one document. Pairs and mask draws are
    # shuffled before the rows are laid out and masked: a few numbers a row, not its features.
    order = np.random.default_rng([settings.seed, shard, _SHUFFLE_STREAM]).permutation(
        len(made))
    arrays = pairs.layout(docs.tokens, made.take(order), length, tokenizer.cls_id,
                          tokenizer.sep_id, tokenizer.pad_id)
    if not settings.dynamic_masking:
        # Static masks: the batch masker's rules, each pass's draws at once from an rng of
        # (seed, shard, pass), so another dupe_factor leaves the earlier passes' rows as they are.
        draws = [pass_draws(np.random.default_rng([settings.seed, shard, dupe, _MASK_STREAM]),
                            len(p), length, spec) for dupe, p in enumerate(passes)]
        draws = {k: np.concatenate([d[k] for d in draws])[order] for k in draws[0]}
        arrays.update(mask_pass(arrays["input_ids"], draws, spec, word_starts))
    return {k: arrays[k].astype(dtype, copy=False)
            for k, (dtype, _) in stored_features(settings).items()}
