"""BERT's sentence pairs for next-sentence prediction, a pass over a piece's documents at a time.

Follows google-research/bert's create_instances_from_document (as the BERT sections of the
Wenzhou University Transformer lecture and of the lecture notes from NNLM to BERT give it:
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
  * a random B never comes from A's own document (the reference gives up after 10 tries).

How a pass runs, fast: the corpus is one flat token array (FlatDocuments) and every random
number is drawn in bulk. Where one chunk ends decides where the next begins, but documents are
independent: each round of make_pairs finds every document's next chunk at once (a chunk's end
is a search of the cumulative sentence lengths), and the few long documents left at the end
finish in a Python loop over integers. What does not steer the chain is numpy over the whole
pass: a random B's document and sentences, the truncation (its final lengths have a closed
form; only which end each token leaves from is random, a binomial count per side), and the
[CLS] A [SEP] B [SEP] layout (`layout`).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
from collections.abc import Sequence

import numpy as np

from zoo.errors import ConfigError, DataError


def check_max_seq_length(max_seq_length) -> None:
    if not isinstance(max_seq_length, (int, np.integer)) or max_seq_length < 8:
        raise ConfigError(
            f"max_seq_length={max_seq_length!r} must be an int >= 8: [CLS] A [SEP] B [SEP] "
            "needs room for two non-trivial segments"
        )


@dataclasses.dataclass(frozen=True)
class FlatDocuments:
    """A piece's documents as one token array.

    Attributes:
      tokens: int32 [T], every non-empty sentence's ids one after another.
      bounds: int64 [S + 1]; sentence k is tokens[bounds[k]:bounds[k + 1]].
      first_sentence: int64 [D + 1]; document d is sentences [first_sentence[d],
        first_sentence[d + 1]) (an empty document has none).
      nonempty: int64, the sorted indices of the documents with a sentence.
    """

    tokens: np.ndarray
    bounds: np.ndarray
    first_sentence: np.ndarray
    nonempty: np.ndarray

    @functools.cached_property
    def bounds_list(self) -> list[int]:
        """`bounds` as Python ints, which make_pairs's loop bisects (once for every pass)."""
        return self.bounds.tolist()


def flatten(documents: Sequence[Sequence[Sequence[int]]], source: str = "documents"
            ) -> FlatDocuments:
    """Documents of tokenized sentences as FlatDocuments (from_lengths)."""
    sentences = [s for doc in documents for s in doc]
    lengths = np.fromiter(map(len, sentences), np.int64, count=len(sentences))
    # One conversion for the whole piece, not one array per sentence.
    tokens = np.fromiter(itertools.chain.from_iterable(sentences), np.int32,
                         count=int(lengths.sum()))
    return from_lengths(tokens, lengths, [len(doc) for doc in documents], source)


def from_lengths(tokens: np.ndarray, lengths: np.ndarray, sentence_counts: Sequence[int],
                 source: str = "documents") -> FlatDocuments:
    """FlatDocuments of every sentence's ids one after another (`tokens`), each sentence's
    length and each document's number of sentences; empty sentences are skipped. Checked to
    make NSP pairs.

    Raises:
      DataError: if no document has two sentences or there are fewer than two documents, which
        leaves next-sentence prediction without positive or negative pairs.
    """
    lengths = np.asarray(lengths, np.int64)
    kept = np.concatenate([[0], np.cumsum(lengths > 0)])
    per_document = np.asarray(sentence_counts, np.int64)
    last = np.cumsum(per_document)
    counts = kept[last] - kept[last - per_document]
    nonempty = np.flatnonzero(counts).astype(np.int64)
    if len(nonempty) < 2 or counts.max(initial=0) < 2:
        raise DataError(
            f"{source}: {len(nonempty)} non-empty documents, none with 2 or more sentences; "
            "next-sentence prediction needs at least 2 documents and some of several sentences "
            "(text format: one sentence per line, a blank line between documents)"
        )
    return FlatDocuments(
        tokens=np.asarray(tokens, np.int32),
        bounds=np.concatenate([[0], np.cumsum(lengths[lengths > 0])]),
        first_sentence=np.concatenate([[0], np.cumsum(counts)]),
        nonempty=nonempty,
    )


@dataclasses.dataclass(frozen=True)
class Pairs:
    """A pass's pairs, one row each, in document order.

    A is flat.tokens[a_start:a_stop] and B flat.tokens[b_start:b_stop] (truncated). The pairing
    is checkable: A was cut from the sentences a_sentences[:, 0] <= k < a_sentences[:, 1] of
    a_document, B from b_sentences of b_document (global sentence indices of `flat`).
    """

    a_start: np.ndarray
    a_stop: np.ndarray
    b_start: np.ndarray
    b_stop: np.ndarray
    is_random_next: np.ndarray
    a_document: np.ndarray
    a_sentences: np.ndarray
    b_document: np.ndarray
    b_sentences: np.ndarray

    def __len__(self) -> int:
        return len(self.is_random_next)

    @classmethod
    def concatenate(cls, parts: Sequence[Pairs]) -> Pairs:
        return cls(**{f.name: np.concatenate([getattr(p, f.name) for p in parts])
                      for f in dataclasses.fields(cls)})

    def take(self, rows: np.ndarray) -> Pairs:
        """The pairs in the order of `rows`."""
        return Pairs(**{f.name: getattr(self, f.name)[rows] for f in dataclasses.fields(self)})


# Below this many documents still making chunks, a pass finishes them one at a time: a numpy
# round per chunk costs ~30 array calls, more than Python's loop over a few documents.
LOCKSTEP_MIN_DOCUMENTS = 64


def make_pairs(flat: FlatDocuments, rng: np.random.Generator, max_seq_length: int,
               short_seq_prob: float, documents: Sequence[int] | None = None) -> Pairs:
    """One pass of sentence pairs from `documents` (default all); a random B may come from any
    non-empty document but A's own. Every pair fits in max_seq_length - 3 tokens.

    Where a chunk ends decides where the next begins, so each document's chunks come one after
    another; but the documents' chains are independent: every document makes its next chunk
    in the same numpy round while many are left (long documents finish in a Python loop). A
    chunk's coin and split point are the draws of the sentence it starts at (no two chunks
    start at the same one), so both ways give the same pairs.
    """
    check_max_seq_length(max_seq_length)
    max_num_tokens = max_seq_length - 3  # room for [CLS], [SEP], [SEP]
    firsts = flat.first_sentence
    docs = np.arange(len(firsts) - 1) if documents is None else np.asarray(documents, np.int64)
    docs = docs[firsts[docs + 1] > firsts[docs]]
    # Usually fill the whole sequence (padding is wasted compute); sometimes go shorter so
    # pretraining also sees the short inputs of fine-tuning. A rough target, not a limit.
    short = rng.random(len(docs)) < short_seq_prob
    targets = np.where(short, 2 + (rng.random(len(docs)) * (max_num_tokens - 1)).astype(np.int64),
                       max_num_tokens)
    coins, splits = rng.random(len(flat.bounds) - 1) < 0.5, rng.random(len(flat.bounds) - 1)
    chains = _Chains(flat, docs, targets, coins, splits)
    while len(chains.active) and len(chains.active) >= LOCKSTEP_MIN_DOCUMENTS:
        chains.round()
    chains.finish_one_at_a_time()
    rows = np.concatenate(chains.rows, axis=0) if chains.rows else np.zeros((0, 7), np.int64)
    # Document order (as given), then chunk order: by the sentence each chunk started at.
    rows = rows[np.lexsort((rows[:, 6], rows[:, 0]))]
    rows[:, 0] = docs[rows[:, 0]]
    return _finish(flat, rng, max_num_tokens, rows[:, :6])


class _Chains:
    """Every document's chain of chunks, advanced a chunk per document per round. A row is
    (position in docs, target, A's first sentence, A's end, the chunk's end, random B?, the
    sentence the chunk started at)."""

    def __init__(self, flat, docs, targets, coins, splits):
        self.flat, self.targets, self.coins, self.splits = flat, targets, coins, splits
        self.start = flat.first_sentence[docs]
        self.end = flat.first_sentence[docs + 1]
        self.first = self.start.copy()  # each chain's next chunk starts here
        self.active = np.arange(len(docs))
        self.rows = []

    def round(self) -> None:
        at = self.active
        first, end, target = self.first[at], self.end[at], self.targets[at]
        bounds = self.flat.bounds
        # The chunk is sentences [first, i]: up to the first that brings it to the target.
        i = np.clip(np.searchsorted(bounds, bounds[first] + target, side="left"),
                    first + 1, end) - 1
        random_next = self.coins[first]
        # A one-sentence chunk cannot be split; the reference then always takes a random B,
        # which on short documents skews the labels (~60% NotNext on the synthetic corpus).
        # Pair it with a neighbour instead (the next sentence, else the previous one), so the
        # coin flip stays fair; a one-sentence document has no continuation.
        single = (i == first) & ~random_next
        take_next = single & (i + 1 < end)
        take_previous = single & ~take_next & (first > self.start[at])
        random_next = random_next | (single & ~take_next & ~take_previous)
        i = i + take_next
        a_first = first - take_previous
        chunk = i + 1 - a_first
        a_end = a_first + np.where(chunk < 2, 1, 1 + (self.splits[first] * (chunk - 1)).astype(
            np.int64))
        self.rows.append(np.stack([at, target, a_first, a_end, i + 1, random_next, first], 1))
        # Splitting at sentence boundaries (not at an arbitrary token) keeps NSP from being
        # trivial. A random B leaves the chunk's sentences after A unused: put them back.
        self.first[at] = np.where(random_next, a_end, i + 1)
        self.active = at[self.first[at] < end]

    def finish_one_at_a_time(self) -> None:
        """round()'s rule for the documents still active, as a Python loop per document."""
        if not len(self.active):
            return
        bounds, coins, splits = self.flat.bounds_list, self.coins.tolist(), self.splits.tolist()
        rows = []
        for a in self.active.tolist():
            s0, s1, target = int(self.start[a]), int(self.end[a]), int(self.targets[a])
            first = int(self.first[a])
            while first < s1:
                i = bisect.bisect_left(bounds, bounds[first] + target, first + 1, s1) - 1
                random_next, a_first = coins[first], first
                if i == first and not random_next:
                    if i + 1 < s1:
                        i += 1
                    elif first > s0:
                        a_first -= 1
                    else:
                        random_next = True
                chunk = i + 1 - a_first
                a_end = a_first + (1 if chunk < 2 else 1 + int(splits[first] * (chunk - 1)))
                rows.append((a, target, a_first, a_end, i + 1, random_next, first))
                first = a_end if random_next else i + 1
        self.rows.append(np.array(rows, np.int64).reshape(-1, 7))
        self.active = self.active[:0]


def _finish(flat: FlatDocuments, rng: np.random.Generator, max_num_tokens: int,
            rows: np.ndarray) -> Pairs:
    """B's sentences for the random rows, then the truncated token ranges."""
    d, target, a_first, a_end, chunk_end, random_next = rows.T
    random_next = random_next.astype(bool)
    bounds, firsts = flat.bounds, flat.first_sentence
    b_doc, b_first, b_end = d.copy(), a_end.copy(), chunk_end.copy()
    r = np.flatnonzero(random_next)
    if len(r):
        # A uniformly drawn non-empty document other than A's: skip A's own place in the list.
        nonempty = flat.nonempty
        j = (rng.random(len(r)) * (len(nonempty) - 1)).astype(np.int64)
        other = nonempty[j + (j >= np.searchsorted(nonempty, d[r]))]
        count = firsts[other + 1] - firsts[other]
        start = firsts[other] + (rng.random(len(r)) * count).astype(np.int64)
        # From a random sentence, as many as reach the room A leaves (at least one).
        need = target[r] - (bounds[a_end[r]] - bounds[a_first[r]])
        end = np.searchsorted(bounds, bounds[start] + need, side="left")
        b_doc[r], b_first[r] = other, start
        b_end[r] = np.clip(end, start + 1, firsts[other + 1])
    a_lo, a_hi = bounds[a_first], bounds[a_end]
    b_lo, b_hi = bounds[b_first], bounds[b_end]
    a_cut, b_cut = truncated_lengths(a_hi - a_lo, b_hi - b_lo, max_num_tokens)
    # Each removed token leaves from the front or the back with even odds (no bias towards the
    # pairs' beginnings): how many left from the front is a binomial count.
    a_lo = a_lo + rng.binomial(a_hi - a_lo - a_cut, 0.5)
    b_lo = b_lo + rng.binomial(b_hi - b_lo - b_cut, 0.5)
    return Pairs(
        a_start=a_lo, a_stop=a_lo + a_cut, b_start=b_lo, b_stop=b_lo + b_cut,
        is_random_next=random_next, a_document=d,
        a_sentences=np.stack([a_first, a_end], 1), b_document=b_doc,
        b_sentences=np.stack([b_first, b_end], 1),
    )


def truncated_lengths(len_a, len_b, max_num_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """The lengths BERT's truncation leaves: while the pair is too long, the longer side (A on a
    tie) loses a token. In closed form: the shorter side keeps its length if the other can take
    the rest (A's limit is the larger half of the room on a tie), else the room is halved, B
    keeping the odd token. Both sides keep >= 1 token whenever max_num_tokens >= 2."""
    la, lb = np.asarray(len_a, np.int64), np.asarray(len_b, np.int64)
    m = max_num_tokens
    half_a, half_b = m // 2, m - m // 2
    a = np.where(la >= lb, np.where(lb <= (m + 1) // 2, m - lb, half_a),
                 np.where(la <= m // 2, la, half_a))
    b = np.where(la >= lb, np.where(lb <= (m + 1) // 2, lb, half_b),
                 np.where(la <= m // 2, m - la, half_b))
    fits = la + lb <= m
    return np.where(fits, la, a), np.where(fits, lb, b)


def layout(tokens: np.ndarray, pairs: Pairs, max_seq_length: int, cls_id: int, sep_id: int,
           pad_id: int = 0) -> dict[str, np.ndarray]:
    """Every pair as [CLS] A [SEP] B [SEP] padded to L (pair_features, for a pass at once):
    int32 input_ids, token_type_ids (0 for [CLS] A [SEP], 1 for B [SEP]) and attention_mask
    (1 real), each [N, L], and next_sentence_labels [N] (0 IsNext, 1 NotNext)."""
    # int32 throughout: a piece holds far fewer than 2**31 tokens, and [N, L] int64
    # temporaries would double the memory traffic, which is most of the time here.
    la = (pairs.a_stop - pairs.a_start).astype(np.int32)[:, None]
    n = la + (pairs.b_stop - pairs.b_start).astype(np.int32)[:, None] + 3
    if len(pairs) and n.max() > max_seq_length:
        raise ValueError(f"a pair of {n.max()} tokens exceeds max_seq_length={max_seq_length}")
    p = np.arange(max_seq_length, dtype=np.int32)[None, :]
    # Position p holds A's token p - 1 up to la, then B's token p - la - 2; gathering with
    # clipped indices leaves junk only where [CLS], [SEP] or padding are written next.
    in_b = p > la
    shift = np.where(in_b, pairs.b_start.astype(np.int32)[:, None] - la - 2,
                     pairs.a_start.astype(np.int32)[:, None] - 1)
    shift += p
    ids = np.take(tokens, shift, mode="clip")
    real = p < n
    np.copyto(ids, np.int32(pad_id), where=~real)
    rows = np.arange(len(pairs))
    ids[:, 0] = cls_id
    ids[rows, la[:, 0] + 1] = sep_id
    ids[rows, n[:, 0] - 1] = sep_id
    types = in_b & real
    types[rows, la[:, 0] + 1] = False  # A's [SEP]
    return {
        "input_ids": ids.astype(np.int32, copy=False),
        "token_type_ids": types.view(np.uint8).astype(np.int32),  # bytes convert fastest
        "attention_mask": real.view(np.uint8).astype(np.int32),
        "next_sentence_labels": pairs.is_random_next.astype(np.int32),
    }
