"""BERT's masked-LM corruption: 15% of the maskable tokens are predicted, of those 80% -> [MASK],
10% -> a random non-special token, 10% unchanged (google-research/bert's create_pretraining_data.py;
zoo.data.pipelines.pretraining.examples documents the one deliberate difference, the count).

Two drivers of the same rules:
  * `mask_batch`: a whole batch, each row drawn from its own Philox stream keyed by the row's
    key, so a row's mask is a pure function of its key whatever batch, worker or process it
    falls in. Both kinds of masks use it: static ones when a shard is prepared (keys of seed,
    shard, pass and row), dynamic ones as batches are built (`masking_keys(seed, epoch, index)`);
  * `mask_tokens` / `mask_example`: one row from a numpy Generator, the rules written plainly,
    one row at a time: the reference the tests hold `mask_batch` to (same statistics); the
    pipeline calls only `mask_batch`.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from zoo.errors import ConfigError

# Tags the dynamic-masking keys so they never coincide with another use of the same seed.
_MASK_STREAM = 0x4D4C4D


def check_max_predictions(max_predictions_per_seq) -> None:
    if not isinstance(max_predictions_per_seq, (int, np.integer)) or max_predictions_per_seq < 1:
        raise ConfigError(
            f"max_predictions_per_seq={max_predictions_per_seq!r} must be an int >= 1"
        )


class MaskedLM(NamedTuple):
    """Masked inputs [L] and P-padded targets (positions sorted, weights 1 real / 0 padding)."""

    input_ids: np.ndarray
    masked_lm_positions: np.ndarray
    masked_lm_ids: np.ndarray
    masked_lm_weights: np.ndarray


def mask_tokens(
    ids: np.ndarray,
    rng: np.random.Generator,
    masked_lm_prob: float = 0.15,
    max_predictions_per_seq: int = 20,
    *,
    vocab_size: int,
    special_ids,
    mask_id: int,
    word_starts: np.ndarray | None = None,
    whole_word: bool = False,
) -> MaskedLM:
    """BERT's masked-LM corruption of one (possibly padded) sequence.

    min(max_predictions_per_seq, max(1, round(masked_lm_prob * n))) of the n maskable tokens
    (all but `special_ids`: [CLS], [SEP], padding, ...) are chosen for prediction; each chosen
    token becomes [MASK] with probability 0.8, a token drawn uniformly from the non-special
    vocabulary with probability 0.1, and stays unchanged otherwise.

    Args:
      ids: int token ids [L].
      rng: numpy Generator.
      masked_lm_prob: fraction of maskable tokens to predict.
      max_predictions_per_seq: P, the length the targets are padded to.
      vocab_size: ids are < vocab_size; random replacements are drawn below it.
      special_ids: ids never chosen and never drawn as replacements.
      mask_id: the [MASK] id.
      word_starts: bool [L], True where a token begins a word (needed for whole_word).
      whole_word: choose whole words: a word start and the continuation pieces after it are
        predicted together or not at all. A word that would overshoot the count is skipped,
        unless nothing else fits: then one word of at most P pieces is taken whole.

    Returns:
      MaskedLM with int32 input_ids [L], masked_lm_positions [P], masked_lm_ids [P] (the
      original ids) and float32 masked_lm_weights [P].
    """
    check_max_predictions(max_predictions_per_seq)
    ids = np.asarray(ids, np.int32)
    specials = sorted({int(s) for s in special_ids})
    maskable = np.ones(ids.shape, bool)
    for s in specials:  # a handful of compares beats np.isin's sort on short rows
        maskable &= ids != s
    candidates = np.flatnonzero(maskable)
    n = len(candidates)
    num_to_predict = min(max_predictions_per_seq, max(1, round(n * masked_lm_prob)))
    if n == 0:
        chosen = candidates
    elif whole_word:
        if word_starts is None:
            raise ValueError("mask_tokens(whole_word=True) needs word_starts (bool [L])")
        bounds = _word_groups(candidates, np.asarray(word_starts, bool))
        chosen = _take_words(candidates, bounds, rng.permutation(len(bounds) - 1),
                             num_to_predict, max_predictions_per_seq)
    else:
        chosen = np.sort(rng.permutation(candidates)[:num_to_predict])
    k = len(chosen)
    u = rng.random(k)
    replaced = ids.copy()
    masked = u < 0.8
    random = u >= 0.9  # [0.8, 0.9) keeps the original token
    replaced[chosen[masked]] = mask_id
    replaced[chosen[random]] = _random_non_special(rng, int(random.sum()), vocab_size, specials)

    positions = np.zeros(max_predictions_per_seq, np.int32)
    labels = np.zeros(max_predictions_per_seq, np.int32)
    weights = np.zeros(max_predictions_per_seq, np.float32)
    positions[:k], labels[:k], weights[:k] = chosen, ids[chosen], 1.0
    return MaskedLM(replaced, positions, labels, weights)


def _word_groups(candidates: np.ndarray, word_starts: np.ndarray) -> np.ndarray:
    """Bounds [G + 1] of the whole-word groups of `candidates` (group g is candidates[b[g]:b[g+1]]).

    A group starts at a word start or wherever the maskable run breaks (after [SEP] etc.), so a
    continuation piece is never glued to a word across a special token.
    """
    starts = word_starts[candidates] | (np.diff(candidates, prepend=-2) != 1)
    return np.append(np.flatnonzero(starts), len(candidates))


def _take_words(candidates, bounds, order, num_to_predict, max_predictions) -> np.ndarray:
    """Sorted positions of the groups taken in `order` (a permutation of the groups) until the
    count is reached."""
    chosen, count, fallback = [], 0, None
    for g in order:
        if count >= num_to_predict:
            break
        group = candidates[bounds[g]:bounds[g + 1]]
        if count + len(group) > num_to_predict:
            # As the reference, skip a word that would overshoot; remember the first one that
            # fits in P, so a row of long words still gets a target instead of none.
            if fallback is None and len(group) <= max_predictions:
                fallback = group
            continue
        chosen.append(group)
        count += len(group)
    if not chosen:
        chosen = [] if fallback is None else [fallback]
    return np.sort(np.concatenate(chosen)) if chosen else candidates[:0]


def _random_non_special(rng, k, vocab_size, specials) -> np.ndarray:
    """k ids uniform over [0, vocab_size) minus the specials, without a vocabulary-size table."""
    specials = _drawable_check(vocab_size, specials)
    return _nth_non_special(rng.integers(vocab_size - len(specials), size=k), specials)


def _drawable_check(vocab_size, specials) -> list[int]:
    specials = [s for s in specials if s < vocab_size]
    if vocab_size - len(specials) < 1:
        raise ConfigError(f"vocab_size={vocab_size} leaves no non-special token to sample")
    return specials


def _nth_non_special(x: np.ndarray, specials: list[int]) -> np.ndarray:
    # The x-th non-special id is x + #{specials at or below it}; with the ascending specials s_j
    # that count is #{j : s_j - j <= x}.
    return (x + np.searchsorted(np.subtract(specials, np.arange(len(specials))), x,
                                side="right")).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class MaskingSpec:
    """What masking needs besides an rng, as stored in a cache manifest."""

    masked_lm_prob: float
    max_predictions_per_seq: int
    vocab_size: int
    mask_id: int
    special_ids: tuple[int, ...]
    whole_word: bool


def mask_example(row: dict[str, np.ndarray], spec: MaskingSpec, word_start_table: np.ndarray,
                 rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Adds masked-LM features to an unmasked pair row (input_ids replaced by masked ones)."""
    ids = row["input_ids"]
    out = mask_tokens(
        ids, rng, spec.masked_lm_prob, spec.max_predictions_per_seq,
        vocab_size=spec.vocab_size, special_ids=spec.special_ids, mask_id=spec.mask_id,
        word_starts=word_start_table[ids] if spec.whole_word else None,
        whole_word=spec.whole_word,
    )
    return {**row, **out._asdict()}


# Row keys: splitmix64's mixer over (seed, epoch, index) (or (seed, shard, pass, row)), cheap
# and vectorised. The draws themselves come from numpy's Philox keyed by each row's key, not
# from the same mixer over (key, position): masks drawn that way (3 us/row) matched the
# Generator's on every count we measured (masks per row, 80/10/10 shares, positions, overlap
# between epochs and between rows), yet tiny BERT pretrained on them three times gave pooled
# features 56-64% on the relation probe of tests/end_to_end/test_main_job.py, against 71-80% over
# five runs with Generator or Philox draws (same data, order and init). Philox costs ~20 us/row.
_U64 = np.uint64
_GOLDEN = _U64(0x9E3779B97F4A7C15)  # splitmix64's counter increment (2^64 / golden ratio)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection of uint64 whose every output bit depends on every
    input bit (elementwise; multiplications wrap mod 2^64 as intended)."""
    x = x ^ (x >> _U64(30))
    x = x * _U64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> _U64(27))
    x = x * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


def masking_keys(seed: int, epoch, indices) -> np.ndarray:
    """uint64 [B]: the dynamic-masking key of each example index in its epoch (`epoch` an int or
    [B], as a batch may straddle two epochs), a pure function of (seed, epoch, index)."""
    with np.errstate(over="ignore"):
        root = _mix(np.array([(int(seed) ^ _MASK_STREAM) % 2**64], _U64))
        root = _mix(root + np.asarray(epoch, np.int64).astype(_U64) * _GOLDEN)
        return _mix(root + np.asarray(indices, np.int64).astype(_U64) * _GOLDEN)


def _row_generator(key) -> np.random.Generator:
    """Row key -> its own Philox stream (a counter-based generator keyed directly, without
    SeedSequence's hashing: ~20 us per row against ~45 us for default_rng of a seed list)."""
    return np.random.Generator(np.random.Philox(key=int(key)))


def mask_batch(input_ids: np.ndarray, keys: np.ndarray, spec: MaskingSpec,
               word_start_table: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """BERT's masked-LM corruption (as mask_tokens) of every row of a batch, row b drawn from
    keys[b] alone (masking_keys), so a row's mask does not depend on the batch it is in.

    The count per row is mask_tokens' (min(P, max(1, round(prob * maskable)))); the chosen
    tokens are those with the smallest selection draws (a uniform subset, as a permutation
    prefix), or with whole_word the word groups in the order of their first piece's draw; each
    chosen token becomes [MASK] / a random non-special id / itself with probability .8/.1/.1.

    Args:
      input_ids: int [B, L] unmasked rows.
      keys: uint64 [B].
      spec: the cache's MaskingSpec.
      word_start_table: bool [vocab_size] (needed for spec.whole_word).

    Returns:
      int32 input_ids [B, L] (masked), masked_lm_positions [B, P] (sorted, 0-padded),
      masked_lm_ids [B, P] and float32 masked_lm_weights [B, P].
    """
    ids = np.asarray(input_ids, np.int32)
    keys = np.asarray(keys, _U64)
    batch, length = ids.shape
    p, m = _draw_sizes(spec)
    # Per row, from its own stream: a selection draw per position, then per target slot a kind
    # draw (mask / keep / random) and a replacement id.
    order, u = np.empty(ids.shape), np.empty((batch, p))
    draws = np.empty((batch, p), np.int64)
    for b, key in enumerate(keys):
        g = _row_generator(key)
        order[b], u[b], draws[b] = g.random(length), g.random(p), g.integers(m, size=p)
    maskable, n, num = _maskable(ids, spec)
    chosen = _choose_by_order(ids, maskable, num, order, spec, word_start_table)
    return _corrupt(ids, chosen, u, draws, spec)


def pass_draws(rng: np.random.Generator, rows: int, length: int,
               spec: MaskingSpec) -> dict[str, np.ndarray]:
    """mask_pass's draws for `rows` rows of `length`, all from `rng` at once: "select" (one per
    step of Floyd's sampling, [rows, P]; with whole_word a selection draw per position,
    [rows, L]), "kind" [rows, P] (mask / keep / random) and "replace" [rows, P] (the n-th
    non-special id). A row's draws travel with it when rows are reordered."""
    p, m = _draw_sizes(spec)
    return {"select": rng.random((rows, length if spec.whole_word else p)),
            "kind": rng.random((rows, p)), "replace": rng.integers(m, size=(rows, p))}


def mask_pass(input_ids: np.ndarray, draws: dict[str, np.ndarray], spec: MaskingSpec,
              word_start_table: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """mask_batch's corruption from draws taken for many rows at once (pass_draws): for static
    masks, drawn once per stored pass and never redrawn by row, so needing no key per row (a
    per-row stream costs ~20 us a row, most of a shard's masking time). Without whole-word
    masking the chosen tokens are a uniform subset drawn by Floyd's algorithm (P steps over
    every row at once) rather than by sorting a draw per position."""
    ids = np.asarray(input_ids, np.int32)
    maskable, n, num = _maskable(ids, spec)
    if spec.whole_word:
        chosen = _choose_by_order(ids, maskable, num, draws["select"], spec, word_start_table)
    else:
        chosen = _choose_uniform(maskable, n, num, draws["select"])
    return _corrupt(ids, chosen, draws["kind"], draws["replace"], spec)


def _draw_sizes(spec: MaskingSpec) -> tuple[int, int]:
    """(P, the number of non-special ids a random replacement is drawn from)."""
    check_max_predictions(spec.max_predictions_per_seq)
    specials = sorted({int(s) for s in spec.special_ids})
    return spec.max_predictions_per_seq, spec.vocab_size - len(
        _drawable_check(spec.vocab_size, specials))


def _maskable(ids: np.ndarray, spec: MaskingSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """bool [B, L] the tokens masking may pick, int [B] how many each row has and int [B] how
    many each row gets."""
    special = np.zeros(max(spec.vocab_size, int(ids.max(initial=0)) + 1), bool)
    special[[int(s) for s in spec.special_ids]] = True
    maskable = ~special[ids]
    n = maskable.sum(axis=1)
    # np.round halves to even, as Python's round in mask_tokens.
    p = spec.max_predictions_per_seq
    num = np.where(n > 0, np.minimum(p, np.maximum(1, np.round(n * spec.masked_lm_prob))), 0)
    return maskable, n, num.astype(np.int64)


def _choose_uniform(maskable: np.ndarray, n: np.ndarray, num: np.ndarray,
                    u: np.ndarray) -> np.ndarray:
    """Sorted positions [B, P] of a uniform num[b]-subset of each row's n[b] maskable
    positions, padded with L; u [B, P] uniform draws, one per step of Floyd's sampling (for
    j = n - k .. n - 1 take a rank t uniform in [0, j], or j itself if t is taken: every
    k-subset of the n ranks equally likely)."""
    batch, length = maskable.shape
    n, num = n.astype(np.int32), num.astype(np.int32)
    columns = []  # ranks drawn, a [B] column per step (-1 past a row's num)
    for step in range(u.shape[1]):
        j = n - num + step
        t = (u[:, step] * (j + 1)).astype(np.int32)
        taken = np.zeros(batch, bool)
        for earlier in columns:
            taken |= earlier == t
        columns.append(np.where(step < num, np.where(taken, j, t), -1))
    ranks = np.stack(columns, axis=1)
    valid = ranks >= 0
    # Rank r's position is r plus the non-maskable positions up to it: the least fixed point
    # of q = r + skipped[q], reached from q = r in one step per non-maskable position crossed
    # (in a BERT row only [CLS] and the first [SEP] lie inside the text).
    skipped = np.cumsum((~maskable).view(np.uint8), axis=1,  # as bytes: twice as fast
                        dtype=np.int16 if length < 2**15 else np.int32).ravel()
    row_start = (np.arange(batch, dtype=np.int64) * length)[:, None]
    rank = np.maximum(ranks, 0)
    at = rank
    while True:
        after = np.minimum(rank + skipped[row_start + at], length - 1)
        if np.array_equal(after, at):
            break
        at = after
    return np.sort(np.where(valid, at, length), axis=1)


def _choose_by_order(ids, maskable, num, order, spec, word_start_table) -> np.ndarray:
    """Sorted positions [B, P] (padded with L): those of the num[b] smallest selection draws
    `order` [B, L] among the maskable, or with whole_word the word groups in the order of their
    first piece's draw."""
    batch, length = ids.shape
    p = spec.max_predictions_per_seq
    if spec.whole_word:
        if word_start_table is None:
            raise ValueError("whole-word masking (spec.whole_word) needs word_start_table")
        chosen = np.full((batch, p), length, np.int64)  # length = no target (sorts last)
        for b in range(batch):
            candidates = np.flatnonzero(maskable[b])
            if not len(candidates):
                continue
            bounds = _word_groups(candidates, word_start_table[ids[b]])
            firsts = candidates[bounds[:-1]]
            taken = _take_words(candidates, bounds, np.argsort(order[b, firsts], kind="stable"),
                                int(num[b]), p)
            chosen[b, :len(taken)] = taken
        return chosen
    # Non-maskable tokens sort last; the first num[b] columns are the chosen ones.
    order = np.where(maskable, order, np.inf)
    first = np.argsort(order, axis=1, kind="stable")[:, :p]
    return np.sort(np.where(np.arange(p) < num[:, None], first, length), axis=1)


def _corrupt(ids: np.ndarray, chosen: np.ndarray, u: np.ndarray, draws: np.ndarray,
             spec: MaskingSpec) -> dict[str, np.ndarray]:
    """The masked rows and targets, given the chosen positions [B, P] (L = none), a kind draw
    u [B, P] (mask / keep / random) and draws [B, P] (the n-th non-special id)."""
    batch, length = ids.shape
    drawable = _drawable_check(spec.vocab_size, sorted({int(s) for s in spec.special_ids}))
    rows = np.arange(batch)[:, None]
    valid = chosen < length
    positions = np.where(valid, chosen, 0)
    labels = np.where(valid, ids[rows, positions], 0)
    random_ids = _nth_non_special(draws, drawable)
    new = np.where(u < 0.8, spec.mask_id, np.where(u < 0.9, labels, random_ids))
    masked = ids.copy()
    masked[np.broadcast_to(rows, valid.shape)[valid], positions[valid]] = new[valid]
    return {
        "input_ids": masked,
        "masked_lm_positions": positions.astype(np.int32),
        "masked_lm_ids": labels.astype(np.int32),
        "masked_lm_weights": valid.astype(np.float32),
    }
