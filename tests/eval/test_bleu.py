"""Corpus BLEU: the BLEU worked example of the course slides on sequence generation by hand, the 13a
tokeniser, the reference-length and clipping rules, and equality with sacrebleu 2.6.0 on seeded
random corpora (skipped when sacrebleu is not installed)."""

import math
import random

import numpy as np
import pytest

from zoo.eval import bleu


@pytest.fixture
def sacrebleu():
    return pytest.importorskip("sacrebleu")


# --------------------------------------------------------------------------------------------
# The BLEU worked example of the course slides on sequence generation: reference A B C D E F,
# prediction A B B C D
# --------------------------------------------------------------------------------------------

SEED_HYP, SEED_REF = "A B B C D", "A B C D E F"
SEED_BP = math.exp(1 - 6 / 5)  # l_x = 5 <= l_s = 6


def test_slides_precisions_without_smoothing():
    # The seed: p1 = 4/5, p2 = 3/4, p3 = 1/3, p4 = 0; BLEU-4 is then 0.
    result = bleu.corpus_bleu([SEED_HYP], [[SEED_REF]], smooth_method="none")
    assert result.counts == (4, 3, 1, 0)
    assert result.totals == (5, 4, 3, 2)
    np.testing.assert_allclose(result.precisions, [80.0, 75.0, 100 / 3, 0.0], rtol=1e-12)
    np.testing.assert_allclose(result.bp, SEED_BP, rtol=1e-12)
    assert (result.sys_len, result.ref_len) == (5, 6)
    assert result.score == 0.0


def test_slides_bleu_3_is_the_geometric_mean_times_bp():
    # Eq. 15.41 with N' = 3 and uniform weights: nothing to smooth, so the seed's formula.
    result = bleu.corpus_bleu([SEED_HYP], [[SEED_REF]], max_ngram_order=3, smooth_method="none")
    expected = 100 * SEED_BP * (4 / 5 * 3 / 4 * 1 / 3) ** (1 / 3)
    np.testing.assert_allclose(result.score, expected, rtol=1e-12)


def test_slides_default_exp_smoothing():
    # sacrebleu's default: the first order without matches gets 1 / (2 * total) = 1/4.
    result = bleu.corpus_bleu([SEED_HYP], [[SEED_REF]])
    np.testing.assert_allclose(result.precisions, [80.0, 75.0, 100 / 3, 25.0], rtol=1e-12)
    expected = 100 * SEED_BP * (0.8 * 0.75 * (1 / 3) * 0.25) ** 0.25
    np.testing.assert_allclose(result.score, expected, rtol=1e-12)
    assert str(result) == ("BLEU = 38.72 80.0/75.0/33.3/25.0 (BP = 0.819 ratio = 0.833 "
                           "hyp_len = 5 ref_len = 6)")
    assert result.signature == "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:zoo-1"


def test_exp_smoothing_halves_again_for_each_further_empty_order():
    # "a b x y" vs "a b c d": p2 = 1/3 matched, p3 and p4 have no match: 1/(2*2), 1/(4*1).
    result = bleu.corpus_bleu(["a b x y"], [["a b c d"]])
    assert result.counts == (2, 1, 0, 0)
    np.testing.assert_allclose(result.precisions, [50.0, 100 / 3, 100 / 4, 100 / 4],
                               rtol=1e-12)


# --------------------------------------------------------------------------------------------
# tokenisation, clipping and reference lengths
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("line, tokens", [
    ("Hello, world!", ["Hello", ",", "world", "!"]),
    ("Pi is 3.14 and 1,000 is big.", ["Pi", "is", "3.14", "and", "1,000", "is", "big", "."]),
    ("pages 5-7 of a well-known book", ["pages", "5", "-", "7", "of", "a", "well-known", "book"]),
    ("it's (a) test/case", ["it's", "(", "a", ")", "test", "/", "case"]),
    ("&quot;x&quot; &amp; y&lt;z", ['"', "x", '"', "&", "y", "<", "z"]),
    ("skip <skipped> this", ["skip", "this"]),
    ("line-\nbreak\nnext", ["linebreak", "next"]),
    ("end.", ["end", "."]),
    ("", []),
])
def test_tokenize_13a_hand_cases(line, tokens):
    assert bleu.tokenize_13a(line) == tokens


def test_lines_lose_trailing_whitespace_before_tokenising():
    # As sacrebleu: "d-\n" is stripped to "d-" first, so 13a's "-\n" joining never fires.
    assert bleu.corpus_bleu(["a b c d-\n"], [["a b c d-"]]).score == pytest.approx(100.0)
    assert bleu.tokenize_13a("a b c d-\n") == ["a", "b", "c", "d"]


def test_clipping_takes_the_max_count_over_references_and_lowercase_merges_case():
    # Papineni et al.'s example: "the" x7 against "The cat is on the mat" and "There is a cat
    # on the mat". Mixed case: "the" occurs at most once in one reference -> p1 = 1/7;
    # lowercased, the first reference has it twice -> p1 = 2/7.
    hyp = "the the the the the the the"
    refs = [["The cat is on the mat"], ["There is a cat on the mat"]]
    mixed = bleu.corpus_bleu([hyp], refs, smooth_method="none")
    lower = bleu.corpus_bleu([hyp], refs, smooth_method="none", lowercase=True)
    assert (mixed.counts[0], mixed.totals[0]) == (1, 7)
    assert (lower.counts[0], lower.totals[0]) == (2, 7)
    assert lower.signature.split("|")[:2] == ["nrefs:2", "case:lc"]


def test_reference_length_is_the_closest_and_ties_go_to_the_shorter():
    hyp = "a b c d e"  # 5 tokens
    # References of 3 and 6 tokens: the closest is 6 (the course slides' "shortest" would be 3).
    result = bleu.corpus_bleu([hyp], [["a b c"], ["a b c d e f"]])
    assert result.ref_len == 6
    np.testing.assert_allclose(result.bp, math.exp(1 - 6 / 5), rtol=1e-12)
    # 4 and 6 tokens are equally close: the shorter wins, so c > r and BP = 1.
    result = bleu.corpus_bleu([hyp], [["a b c d"], ["a b c d e f"]])
    assert result.ref_len == 4
    assert result.bp == 1.0


def test_corpus_statistics_are_sums_over_segments():
    hyps = ["a b c d", "x y", "p q r s t"]
    refs = [["a b c d", "x z", "p q r s"]]
    corpus = bleu.corpus_bleu(hyps, refs)
    singles = [bleu.corpus_bleu([h], [[r]]) for h, r in zip(hyps, refs[0])]
    assert corpus.counts == tuple(map(sum, zip(*(s.counts for s in singles))))
    assert corpus.totals == tuple(map(sum, zip(*(s.totals for s in singles))))
    assert (corpus.sys_len, corpus.ref_len) == (11, 10)
    # Corpus BLEU is not the mean of sentence BLEUs (the second sentence alone scores 0).
    assert corpus.score > np.mean([s.score for s in singles]) + 1


def test_empty_hypothesis_line_counts_reference_length_only():
    result = bleu.corpus_bleu(["a b c d", ""], [["a b c d", "e f g"]])
    assert (result.sys_len, result.ref_len) == (4, 7)
    assert result.counts == (4, 3, 2, 1) and result.totals == (4, 3, 2, 1)
    np.testing.assert_allclose(result.score, 100 * math.exp(1 - 7 / 4), rtol=1e-12)


def test_none_marks_a_missing_reference_and_gives_a_variable_nrefs():
    result = bleu.corpus_bleu(["a b c d", "e f g h"], [["a b c d", "e f g h"], ["a x", None]])
    assert result.signature.startswith("nrefs:var|")
    assert result.score == pytest.approx(100.0)


# --------------------------------------------------------------------------------------------
# argument errors
# --------------------------------------------------------------------------------------------


def test_stream_of_the_wrong_length_names_the_stream_and_both_lengths():
    with pytest.raises(ValueError, match=r"references\[1\] has 3 lines but hypotheses has 4"):
        bleu.corpus_bleu(["a"] * 4, [["a"] * 4, ["a"] * 3])


@pytest.mark.parametrize("hyps, refs, match", [
    (["a b"], ["a b"], "list of reference streams"),  # a stream passed unwrapped
    ("a b", [["a b"]], "hypotheses must be a list"),
    ([], [[]], "hypotheses is empty"),
    (["a b"], [], "non-empty list of reference streams"),
    (["a b", "c"], [["a", None], [None, None]], "segment 1 has no reference"),
    (["a b"], [[3]], r"references\[0\]\[0\] must be a string"),
])
def test_malformed_corpora_raise(hyps, refs, match):
    with pytest.raises(ValueError, match=match):
        bleu.corpus_bleu(hyps, refs)


@pytest.mark.parametrize("kwargs, match", [
    ({"smooth_method": "add-one"}, "smooth_method"),
    ({"tokenize": "intl"}, "tokenize"),
    ({"max_ngram_order": 0}, "max_ngram_order"),
])
def test_unknown_options_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bleu.corpus_bleu(["a"], [["a"]], **kwargs)


# --------------------------------------------------------------------------------------------
# equality with sacrebleu on seeded random corpora
# --------------------------------------------------------------------------------------------

_WORDS = ("the", "The", "cat", "CAT", "sat", "on", "mat", "dog", "ran", "far", "away", "it's",
          "well-known", "U.S.", "3.14", "1,000", "5-7", "42", "(maybe)", "yes!", "no?", "and,",
          "end.", '"quoted"', "a/b", "&amp;", "&quot;x&quot;", "x:y", "Mr.", "e-mail", "#1",
          "$5", "50%", "[note]", "{k}", "~", "@home", "naïve", "Über")


def _sentence(rng, lo=0, hi=14):
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi)))


def _perturb(rng, sentence):
    """A noisy copy (drops, substitutions, swaps, repeats) so precisions land mid-range."""
    tokens = sentence.split()
    out = []
    for token in tokens:
        r = rng.random()
        if r < 0.1:
            continue
        if r < 0.25:
            out.append(rng.choice(_WORDS))
        elif r < 0.3:
            out += [token, token]
        else:
            out.append(token)
    if len(out) > 2 and rng.random() < 0.3:
        i = rng.randrange(len(out) - 1)
        out[i], out[i + 1] = out[i + 1], out[i]
    return " ".join(out) + (" " if rng.random() < 0.2 else "")  # some trailing whitespace


def _corpus(seed, n_segments=30, n_streams=1, empty_every=7, none_in_second_stream=False):
    rng = random.Random(seed)
    sources = [_sentence(rng, lo=1) for _ in range(n_segments)]
    hyps = ["" if i % empty_every == 3 else _perturb(rng, s) for i, s in enumerate(sources)]
    streams = [[_perturb(rng, s) if k else s for s in sources] for k in range(n_streams)]
    if none_in_second_stream:
        streams[1] = [None if i % 4 == 0 else line for i, line in enumerate(streams[1])]
    return hyps, streams


def _no_4gram_match_corpus(seed, n_segments=12):
    """Hypotheses are 3-token chunks of the reference joined by unseen words: 1- to 3-grams
    match, 4-grams never do (every hypothesis 4-gram holds a ZZZ word), so the fourth precision
    is all smoothing. Plain words only, so one word is one 13a token."""
    rng = random.Random(seed)
    hyps, refs = [], []
    plain = [w for w in _WORDS if w.isalpha()]
    for i in range(n_segments):
        ref = [rng.choice(plain) for _ in range(rng.randint(8, 15))]
        chunks = [" ".join(ref[j:j + 3]) for j in range(0, len(ref) - 2, 4)]
        hyps.append(f" ZZZ{i} ".join(chunks))
        refs.append(" ".join(ref))
    return hyps, [refs]


def _assert_same(ours, theirs, *, raw_counts=True):
    np.testing.assert_allclose(ours.score, theirs.score, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ours.precisions, theirs.precisions, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ours.bp, theirs.bp, rtol=1e-12)
    assert (ours.sys_len, ours.ref_len) == (theirs.sys_len, theirs.ref_len)
    if raw_counts:
        assert list(ours.counts) == list(theirs.counts)
        assert list(ours.totals) == list(theirs.totals)
    assert str(ours) == str(theirs)


@pytest.mark.parametrize("seed, n_streams, lowercase, none_in_second_stream", [
    (0, 1, False, False),
    (1, 1, True, False),
    (2, 2, False, False),
    (3, 3, True, False),
    (4, 2, False, True),
])
def test_corpus_bleu_equals_sacrebleu(sacrebleu, seed, n_streams, lowercase,
                                      none_in_second_stream):
    hyps, refs = _corpus(seed, n_streams=n_streams, none_in_second_stream=none_in_second_stream)
    ours = bleu.corpus_bleu(hyps, refs, lowercase=lowercase)
    theirs = sacrebleu.corpus_bleu(hyps, refs, lowercase=lowercase)
    assert 5 < ours.score < 95  # a mid-range score, so the comparison has something to compare
    _assert_same(ours, theirs)


def test_tokenize_13a_equals_sacrebleu(sacrebleu):
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
    theirs = Tokenizer13a()
    rng = random.Random(5)
    alphabet = "aZ09 .,-'\"&;()/:@<>[]{}~`!?$%#*+=^_|\\\nü"
    lines = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
             for _ in range(300)] + [w + " " + v for w in _WORDS for v in _WORDS[:5]]
    for line in lines:
        assert bleu.tokenize_13a(line) == theirs(line).split(), repr(line)


@pytest.mark.parametrize("corpus", ["random", "no_4gram_match"])
@pytest.mark.parametrize("smooth_method, smooth_value", [
    ("exp", None), ("floor", None), ("floor", 0.5), ("add-k", None), ("add-k", 2), ("none", None),
])
def test_each_smoothing_method_equals_sacrebleu(sacrebleu, corpus, smooth_method, smooth_value):
    hyps, refs = _corpus(6) if corpus == "random" else _no_4gram_match_corpus(7)
    ours = bleu.corpus_bleu(hyps, refs, smooth_method=smooth_method, smooth_value=smooth_value)
    theirs = sacrebleu.corpus_bleu(hyps, refs, smooth_method=smooth_method,
                                   smooth_value=smooth_value)
    if corpus == "no_4gram_match":
        assert ours.counts[3] == 0 < ours.totals[3]  # the case smoothing exists for
        assert (ours.score > 0) == (smooth_method != "none")
    # sacrebleu adds add-k's k to its reported counts and totals; ours stay raw.
    _assert_same(ours, theirs, raw_counts=smooth_method != "add-k")
    metric = sacrebleu.BLEU(smooth_method=smooth_method, smooth_value=smooth_value)
    metric.corpus_score(hyps, refs)
    assert ours.signature == str(metric.get_signature()).replace("version:2.6.0",
                                                                  "version:zoo-1")


@pytest.mark.parametrize("max_ngram_order, effective_order", [(2, False), (6, False), (6, True)])
def test_order_options_equal_sacrebleu(sacrebleu, max_ngram_order, effective_order):
    hyps, refs = _corpus(8, n_streams=2)
    hyps = hyps + ["a b c", "ok"]  # short lines: fewer n-grams of high order
    refs = [stream + ["a b c", "ok fine"] for stream in refs]
    ours = bleu.corpus_bleu(hyps, refs, max_ngram_order=max_ngram_order,
                            effective_order=effective_order)
    metric = sacrebleu.BLEU(max_ngram_order=max_ngram_order, effective_order=effective_order)
    _assert_same(ours, metric.corpus_score(hyps, refs))


def test_sentence_bleu_equals_sacrebleu(sacrebleu):
    rng = random.Random(9)
    cases = [("a b", ["a b c"]), ("x", ["y"]), ("", ["a"]), (SEED_HYP, [SEED_REF])]
    for _ in range(20):
        source = _sentence(rng, lo=1)
        cases.append((_perturb(rng, source), [source, _perturb(rng, source)]))
    for hyp, refs in cases:
        _assert_same(bleu.sentence_bleu(hyp, refs), sacrebleu.sentence_bleu(hyp, refs))


def test_tokenize_none_splits_on_whitespace_only(sacrebleu):
    hyps, refs = _corpus(10)
    ours = bleu.corpus_bleu(hyps, refs, tokenize="none")
    _assert_same(ours, sacrebleu.corpus_bleu(hyps, refs, tokenize="none"))
    assert ours.totals[0] == sum(len(h.split()) for h in hyps)
