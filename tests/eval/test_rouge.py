"""ROUGE-N / ROUGE-L / ROUGE-Lsum: hand-worked cases (the sentences of the
course slides on sequence generation, LCS, Lin 2004's
union-LCS example, eq. 15.42 pooling) and equality with rouge-score 0.1.2 on seeded random
ASCII texts (skipped when rouge-score is not installed)."""

import random
import sys

import numpy as np
import pytest

from zoo.eval import rouge


@pytest.fixture
def rouge_scorer():
    return pytest.importorskip("rouge_score.rouge_scorer")


def _f(p, r):
    return 2 * p * r / (p + r)


def _assert_score(score, precision, recall):
    np.testing.assert_allclose(score, (precision, recall, _f(precision, recall)), rtol=1e-12)


# --------------------------------------------------------------------------------------------
# hand-worked cases
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, tokens", [
    ("The Cat's hat, 2nd-best!", ["the", "cat", "s", "hat", "2nd", "best"]),
    ("  MIXED\tcase\nlines ", ["mixed", "case", "lines"]),
    ("café über", ["caf", "ber"]),  # non-ASCII letters separate, as in rouge-score
    ("...", []),
])
def test_tokenize(text, tokens):
    assert rouge.tokenize(text) == tokens


@pytest.mark.parametrize("a, b, length", [
    ("ABCBDAB", "BDCABA", 4),  # CLRS's example (BCBA)
    ("abc", "abc", 3),
    ("abc", "cba", 1),
    ("abc", "xyz", 0),
    ("", "abc", 0),
    ("ABCDEF", "ABBCD", 4),  # the course slides' BLEU example sentences: A B C D
])
def test_lcs_length_hand_cases(a, b, length):
    assert rouge.lcs_length(list(a), list(b)) == length
    assert rouge.lcs_length(list(b), list(a)) == length  # symmetric


def test_slides_sentences():
    # Reference A B C D E F, prediction A B B C D (the BLEU worked example of the
    # course slides on sequence generation, read as ROUGE).
    hyp, ref = "A B B C D", "A B C D E F"
    # Unigrams: A, B (clipped to 1), C, D match -> 4 of 6 reference, 4 of 5 hypothesis.
    _assert_score(rouge.rouge_n(hyp, [ref], 1), 4 / 5, 4 / 6)
    # Bigrams: AB, BC, CD of the reference's AB BC CD DE EF; hypothesis has AB BB BC CD.
    _assert_score(rouge.rouge_n(hyp, [ref], 2), 3 / 4, 3 / 5)
    # LCS A B C D.
    _assert_score(rouge.rouge_l(hyp, [ref]), 4 / 5, 4 / 6)
    # A single string is one reference.
    assert rouge.rouge_n(hyp, ref, 2) == rouge.rouge_n(hyp, [ref], 2)


def test_several_references_best_f_versus_pooled_eq_15_42():
    hyp, refs = "a b c", ["c d e f", "a b"]
    # Alone: "c d e f" has P 1/3, R 1/4; "a b" has P 2/3, R 1 -> best F is the second.
    _assert_score(rouge.rouge_n(hyp, refs, 1), 2 / 3, 1.0)
    # Eq. 15.42 pools: hits 1 + 2 over reference unigrams 4 + 2; the hypothesis' 3 unigrams
    # are counted once per reference for precision.
    _assert_score(rouge.rouge_n(hyp, refs, 1, multi_ref="pooled"), 3 / 6, 3 / 6)


def test_best_f_keeps_the_first_reference_on_a_tie():
    # "a b" vs "a b c d": P 1, R 1/2; vs "a": P 1/2, R 1. Same F, different P and R.
    score = rouge.rouge_n("a b", ["a b c d", "a"], 1)
    _assert_score(score, 1.0, 0.5)
    score = rouge.rouge_n("a b", ["a", "a b c d"], 1)
    _assert_score(score, 0.5, 1.0)


def test_rouge_lsum_union_lcs_example_from_lin_2004():
    # Lin 2004 sec. 3.2: r = w1..w5, c1 = w1 w2 w6 w7 w8, c2 = w1 w3 w8 w9 w5. LCS(r, c1) =
    # w1 w2, LCS(r, c2) = w1 w3 w5, union w1 w2 w3 w5 -> 4 hits; |r| = 5, |c1| + |c2| = 10.
    ref = "w1 w2 w3 w4 w5"
    hyp = "w1 w2 w6 w7 w8\nw1 w3 w8 w9 w5"
    _assert_score(rouge.rouge_lsum(hyp, [ref]), 4 / 10, 4 / 5)
    # On one line the same texts are plain ROUGE-L: LCS w1 w2 w3 w5 as well, here.
    _assert_score(rouge.rouge_l(hyp.replace("\n", " "), [ref]), 4 / 10, 4 / 5)


def test_rouge_lsum_never_counts_a_token_more_often_than_it_occurs():
    # Both hypothesis sentences share "a" with the single reference "a": one hit, not two.
    _assert_score(rouge.rouge_lsum("a\na", ["a"]), 1 / 2, 1.0)


@pytest.mark.parametrize("fn", [
    lambda h, r: rouge.rouge_n(h, r, 1), lambda h, r: rouge.rouge_n(h, r, 2),
    rouge.rouge_l, rouge.rouge_lsum,
], ids=["rouge1", "rouge2", "rougeL", "rougeLsum"])
@pytest.mark.parametrize("hyp, ref", [("", "a b"), ("a b", ""), ("!!", "a b"), ("a b", "...")])
def test_a_side_without_tokens_scores_zero_not_nan(fn, hyp, ref):
    assert fn(hyp, [ref]) == (0.0, 0.0, 0.0)


def test_stemming_merges_inflections():
    pytest.importorskip("nltk")
    hyp, ref = "The dogs were running", "the dog was runs"
    assert rouge.rouge_n(hyp, ref, 1).fmeasure == pytest.approx(1 / 4)  # only "the"
    stemmed = rouge.rouge_n(hyp, ref, 1, use_stemmer=True)
    # dogs/dog -> dog, running/runs -> run; "were" and "was" stay different words.
    _assert_score(stemmed, 3 / 4, 3 / 4)


def test_stemming_without_nltk_says_what_to_install(monkeypatch):
    rouge._porter_stemmer.cache_clear()
    monkeypatch.setitem(sys.modules, "nltk.stem", None)  # import of nltk.stem now fails
    try:
        with pytest.raises(ImportError, match="pip install nltk"):
            rouge.rouge_l("running", ["runs"], use_stemmer=True)
        assert rouge.rouge_l("running", ["runs"]).fmeasure == 0.0  # no stemmer, no problem
    finally:
        rouge._porter_stemmer.cache_clear()


@pytest.mark.parametrize("call, match", [
    (lambda: rouge.rouge_n("a", ["a"], 0), "n must be a positive integer"),
    (lambda: rouge.rouge_n("a", [], 1), "references is empty"),
    (lambda: rouge.rouge_n("a", ["a"], 1, multi_ref="mean"), "multi_ref"),
    (lambda: rouge.rouge_l(["a"], ["a"]), "hypothesis must be a string"),
    (lambda: rouge.rouge_l("a", ["a", None]), r"references\[1\] must be a string"),
])
def test_bad_arguments_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --------------------------------------------------------------------------------------------
# equality with rouge-score
# --------------------------------------------------------------------------------------------

_WORDS = ("the", "The", "cat", "cats", "sat", "sitting", "on", "a", "mat", "dog", "dogs",
          "running", "runs", "ran", "played", "playing", "quickly", "2024", "3rd", "it's",
          "well-known", "end.", "Yes!", "(maybe)", "U.S.A.", "e-mail", "and,", "generously")


def _text(rng, lo=0, hi=25, lines=1):
    return "\n".join(" ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi)))
                     for _ in range(lines))


def _noisy(rng, text):
    words = text.split(" ")
    return " ".join(rng.choice(_WORDS) if rng.random() < 0.3 else w for w in words
                    if rng.random() > 0.1)


def _cases(seed, n=25, lines=1):
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        ref = _text(rng, lo=0 if i % 9 == 0 else 1, lines=lines)
        n_refs = 1 + i % 3
        refs = [ref] + [_noisy(rng, ref) for _ in range(n_refs - 1)]
        hyp = "" if i % 11 == 5 else _noisy(rng, _text(rng, lines=lines) if i % 4 == 0 else ref)
        cases.append((hyp, refs))
    return cases


@pytest.mark.parametrize("use_stemmer", [False, True])
def test_rouge_n_and_l_equal_rouge_score(rouge_scorer, use_stemmer):
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rouge3", "rougeL"],
                                      use_stemmer=use_stemmer)
    fmeasures = []
    for hyp, refs in _cases(0 if use_stemmer else 1):
        theirs = scorer.score_multi(refs, hyp)  # rouge-score: (targets, prediction)
        ours = {f"rouge{n}": rouge.rouge_n(hyp, refs, n, use_stemmer=use_stemmer)
                for n in (1, 2, 3)}
        ours["rougeL"] = rouge.rouge_l(hyp, refs, use_stemmer=use_stemmer)
        for key, score in ours.items():
            np.testing.assert_allclose(score, tuple(theirs[key]), rtol=1e-12, err_msg=key)
        fmeasures.append(ours["rouge2"].fmeasure)
    assert 0 < np.mean(fmeasures) < 0.9  # mid-range: the comparison is not all zeros or ones


@pytest.mark.parametrize("use_stemmer", [False, True])
def test_rouge_lsum_equals_rouge_score(rouge_scorer, use_stemmer):
    scorer = rouge_scorer.RougeScorer(["rougeLsum"], use_stemmer=use_stemmer)
    for hyp, refs in _cases(2 if use_stemmer else 3, n=15, lines=3):
        np.testing.assert_allclose(rouge.rouge_lsum(hyp, refs, use_stemmer=use_stemmer),
                                   tuple(scorer.score_multi(refs, hyp)["rougeLsum"]),
                                   rtol=1e-12)


def test_tokenize_equals_rouge_score(rouge_scorer):
    from rouge_score import tokenizers
    rng = random.Random(4)
    alphabet = "aZq09 .,-'\"!?()\t\nÀé_"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(200)]
    texts += list(_WORDS)
    for use_stemmer in (False, True):
        theirs = tokenizers.DefaultTokenizer(use_stemmer=use_stemmer)
        for text in texts:
            assert rouge.tokenize(text, use_stemmer) == theirs.tokenize(text), repr(text)
