"""A pass of sentence pairs at once (zoo.data.pipelines.pretraining.pairs) against the plain
statements of the same rules: the one-token-at-a-time truncation, one pair's layout
(examples.pair_features), and static masks' Floyd sampling against exact subset counts."""

import dataclasses
import itertools

import numpy as np
import pytest

from zoo.data.pipelines import masking
from zoo.data.pipelines.pretraining import examples, pairs

L = 64


def _truncate_one_at_a_time(la: int, lb: int, m: int) -> tuple[int, int]:
    while la + lb > m:
        if la >= lb:
            la -= 1
        else:
            lb -= 1
    return la, lb


def test_truncated_lengths_equal_the_one_token_at_a_time_rule():
    grid = [(la, lb, m) for m in range(2, 14) for la in range(0, 20) for lb in range(0, 20)]
    la, lb, m = (np.array(x) for x in zip(*grid))
    for room in range(2, 14):
        at = m == room
        got_a, got_b = pairs.truncated_lengths(la[at], lb[at], room)
        want = [_truncate_one_at_a_time(a, b, room) for a, b in zip(la[at], lb[at])]
        assert list(zip(got_a.tolist(), got_b.tolist())) == want, room


def test_flatten_skips_empty_sentences_and_documents():
    flat = pairs.flatten([[[1, 2], [], [3]], [[], [4]], [], [[5, 6, 7], [8]]])
    np.testing.assert_array_equal(flat.tokens, [1, 2, 3, 4, 5, 6, 7, 8])
    np.testing.assert_array_equal(flat.bounds, [0, 2, 3, 4, 7, 8])
    np.testing.assert_array_equal(flat.first_sentence, [0, 2, 3, 3, 5])
    np.testing.assert_array_equal(flat.nonempty, [0, 1, 3])


def test_layout_of_a_pass_equals_each_pairs_own(corpus, tok):
    flat = examples.encode_documents(tok, corpus["train"])
    made = pairs.make_pairs(flat, np.random.default_rng(3), L, short_seq_prob=0.3)
    got = pairs.layout(flat.tokens, made, L, tok.cls_id, tok.sep_id, tok.pad_id)
    assert len(made) > 500
    for i in range(len(made)):
        inst = examples.Instance(flat.tokens[made.a_start[i]:made.a_stop[i]],
                                 flat.tokens[made.b_start[i]:made.b_stop[i]],
                                 bool(made.is_random_next[i]), 0, (0, 0), 0, (0, 0))
        want = examples.pair_features(inst, L, tok.cls_id, tok.sep_id, tok.pad_id)
        for k, v in want.items():
            np.testing.assert_array_equal(got[k][i], v, err_msg=f"{k} of pair {i}")
            assert got[k].dtype == v.dtype


@pytest.mark.parametrize("documents", [None, [7, 2, 30, 5, 0, 31]])
def test_documents_in_numpy_rounds_equal_documents_one_at_a_time(documents, monkeypatch):
    # Documents of 1 to 60 sentences (one-sentence ones and long ones), short targets too.
    rng = np.random.default_rng(1)
    docs = [[list(range(rng.integers(1, 30))) for _ in range(rng.integers(1, 60))]
            for _ in range(32)]
    flat = pairs.flatten(docs)
    made = {}
    for mode, least in (("rounds", 0), ("loop", 10**9)):
        monkeypatch.setattr(pairs, "LOCKSTEP_MIN_DOCUMENTS", least)
        made[mode] = pairs.make_pairs(flat, np.random.default_rng(2), 32, 0.5, documents)
    for field in dataclasses.fields(pairs.Pairs):
        np.testing.assert_array_equal(getattr(made["rounds"], field.name),
                                      getattr(made["loop"], field.name), err_msg=field.name)
    order = made["loop"].a_document
    want = documents or list(range(32))
    assert [d for d, _ in itertools.groupby(order.tolist())] == want  # in the documents' order


def test_a_pass_truncates_to_fit_and_removes_from_both_ends():
    # Sentences of 20-40 tokens against 16-token rows: almost every pair loses tokens.
    rng = np.random.default_rng(4)
    docs = [[list(range(1000 * d + 100 * s, 1000 * d + 100 * s + rng.integers(20, 40)))
             for s in range(4)] for d in range(30)]
    flat = pairs.flatten(docs)
    made = pairs.make_pairs(flat, rng, 16, short_seq_prob=0.0)
    la, lb = made.a_stop - made.a_start, made.b_stop - made.b_start
    assert (la >= 1).all() and (lb >= 1).all() and (la + lb <= 13).all()
    a_lo = flat.bounds[made.a_sentences[:, 0]]
    a_hi = flat.bounds[made.a_sentences[:, 1]]
    cut_front, cut_back = made.a_start > a_lo, made.a_stop < a_hi
    assert cut_front.mean() > 0.3 and cut_back.mean() > 0.3
    assert ((made.a_start >= a_lo) & (made.a_stop <= a_hi)).all()


@pytest.mark.parametrize("maskable_row", [
    [True] * 6,
    [False, True, True, False, True, True, False, True, True, True, False],  # [CLS] a a [SEP] ...
])
def test_floyd_sampling_draws_every_subset_equally_often(maskable_row):
    maskable = np.array([maskable_row] * 60_000)
    n, k = int(maskable[0].sum()), 3
    chosen = masking._choose_uniform(maskable, maskable.sum(axis=1), np.full(len(maskable), k),
                                     np.random.default_rng(0).random((len(maskable), 4)))
    assert (chosen[:, k:] == maskable.shape[1]).all()  # one unused slot, padded with L
    positions = np.flatnonzero(maskable[0])
    counts = {}
    for row in map(tuple, chosen[:, :k]):
        counts[row] = counts.get(row, 0) + 1
    subsets = list(itertools.combinations(positions.tolist(), k))
    assert set(counts) == set(subsets)  # only maskable positions, sorted, every subset seen
    expected = len(maskable) / len(subsets)
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    # Degrees of freedom len(subsets) - 1 (19 or 34); 0.1% critical values 43.8 and 65.2.
    assert chi2 < {20: 43.8, 35: 65.2}[len(subsets)], (n, chi2)
