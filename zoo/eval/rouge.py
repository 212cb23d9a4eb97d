"""ROUGE-N, ROUGE-L and ROUGE-Lsum (Lin, 2004) as the evaluation section of the course slides on
sequence generation defines them, equal to rouge-score.

The slides (eq. 15.42) define ROUGE-N as n-gram recall against references s^(1..K):

    ROUGE-N = sum_k sum_w min(c_w(x), c_w(s^(k))) / sum_k sum_w c_w(s^(k))

and the usual precision and F complete it: with hits = the clipped overlap,

    recall = hits / #reference n-grams,  precision = hits / #hypothesis n-grams,
    F = 2 P R / (P + R)  (0 when P + R = 0).

ROUGE-L replaces the clipped overlap by the length of the longest common subsequence of the
two token sequences (recall = LCS / |reference|, precision = LCS / |hypothesis|); ROUGE-Lsum is
its summary-level form over newline-separated sentences (union LCS, Lin 2004 sec. 3.2).

The numbers equal Google's rouge-score 0.1.2 (`rouge_scorer.RougeScorer`, default tokenizer):

  * tokens: lowercase, every run of characters outside [a-z0-9] becomes a separator (so
    non-ASCII letters separate words too); with `use_stemmer=True`, tokens longer than three
    characters go through NLTK's Porter stemmer, the one rouge-score uses;
  * several references: by default each reference is scored alone and the one with the best F
    is returned (rouge-score's `score_multi`; the first on a tie). `rouge_n(...,
    multi_ref='pooled')` instead sums hits and counts over the references as eq. 15.42 does;
  * ROUGE-Lsum splits sentences on newlines only (rouge-score's default, no nltk sentence
    splitter).

Note the argument order: (hypothesis, references), as `zoo.eval.bleu`; rouge-score's
`score(target, prediction)` takes the reference first.
"""

from __future__ import annotations

import collections
import functools
import re
from collections.abc import Sequence
from typing import NamedTuple

_NON_ALPHANUMERIC = re.compile(r"[^a-z0-9]+")
_MULTI_REF = ("best", "pooled")


class Score(NamedTuple):
    """Precision, recall and F-measure, each in [0, 1]."""

    precision: float
    recall: float
    fmeasure: float


def tokenize(text: str, use_stemmer: bool = False) -> list[str]:
    """rouge-score's default tokens: lowercase [a-z0-9]+ runs, optionally Porter-stemmed."""
    tokens = _NON_ALPHANUMERIC.sub(" ", text.lower()).split()
    if use_stemmer:
        stem = _porter_stemmer().stem
        # Like rouge-score: words of three characters or fewer stay as they are.
        tokens = [stem(t) if len(t) > 3 else t for t in tokens]
        # A stem is re-checked against [a-z0-9]+ (rouge-score drops anything else).
        tokens = [t for t in tokens if t and not _NON_ALPHANUMERIC.search(t)]
    return tokens


def rouge_n(
    hypothesis: str,
    references: str | Sequence[str],
    n: int,
    *,
    use_stemmer: bool = False,
    multi_ref: str = "best",
) -> Score:
    """ROUGE-N: clipped n-gram overlap of `hypothesis` with its references.

    Args:
      hypothesis: the generated text.
      references: one reference string, or a list of them.
      n: the n-gram order (1 for ROUGE-1, 2 for ROUGE-2, ...).
      use_stemmer: Porter-stem tokens longer than three characters (needs nltk).
      multi_ref: 'best' (default): the reference with the highest F, as rouge-score's
        score_multi; 'pooled': eq. 15.42 of the course slides on sequence generation, hits and
        reference n-grams summed over
        all references (and the hypothesis n-grams counted once per reference).

    Returns:
      Score(precision, recall, fmeasure).
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer (1 for ROUGE-1), got {n!r}")
    if multi_ref not in _MULTI_REF:
        raise ValueError(f"multi_ref must be one of {_MULTI_REF}, got {multi_ref!r}")
    hypothesis, references = _check_texts(hypothesis, references)
    hyp_ngrams = _ngram_counts(tokenize(hypothesis, use_stemmer), n)

    per_reference = []  # (hits, #reference n-grams) for each reference
    for reference in references:
        ref_ngrams = _ngram_counts(tokenize(reference, use_stemmer), n)
        # sum_w min(c_w(x), c_w(s)): a hypothesis n-gram counts at most as often as in s.
        hits = sum(min(count, hyp_ngrams[w]) for w, count in ref_ngrams.items())
        per_reference.append((hits, sum(ref_ngrams.values())))

    hyp_total = sum(hyp_ngrams.values())
    if multi_ref == "pooled":
        hits = sum(h for h, _ in per_reference)
        ref_total = sum(t for _, t in per_reference)
        return _score(hits, hyp_total * len(references), ref_total)
    return _best([_score(hits, hyp_total, ref_total) for hits, ref_total in per_reference])


def rouge_l(
    hypothesis: str,
    references: str | Sequence[str],
    *,
    use_stemmer: bool = False,
) -> Score:
    """ROUGE-L: longest-common-subsequence overlap, the best F over the references.

    Args:
      hypothesis: the generated text.
      references: one reference string, or a list of them.
      use_stemmer: Porter-stem tokens longer than three characters (needs nltk).

    Returns:
      Score(precision, recall, fmeasure); all 0 when either side has no tokens.
    """
    hypothesis, references = _check_texts(hypothesis, references)
    hyp_tokens = tokenize(hypothesis, use_stemmer)
    scores = []
    for reference in references:
        ref_tokens = tokenize(reference, use_stemmer)
        lcs = lcs_length(ref_tokens, hyp_tokens)
        scores.append(_score(lcs, len(hyp_tokens), len(ref_tokens)))
    return _best(scores)


def rouge_lsum(
    hypothesis: str,
    references: str | Sequence[str],
    *,
    use_stemmer: bool = False,
) -> Score:
    """ROUGE-Lsum: summary-level LCS over newline-separated sentences (rouge-score's rougeLsum).

    For each reference sentence r, the hits are the tokens of r in the union of its LCS with
    every hypothesis sentence; a token is counted at most as often as it occurs in the whole
    reference and in the whole hypothesis (ROUGE-1.5.5's guard against double counting).
    Recall divides by the reference's token count, precision by the hypothesis'.

    Args:
      hypothesis: the generated summary, one sentence per line.
      references: one reference summary, or a list of them, one sentence per line.
      use_stemmer: Porter-stem tokens longer than three characters (needs nltk).

    Returns:
      Score(precision, recall, fmeasure): the best F over the references.
    """
    hypothesis, references = _check_texts(hypothesis, references)
    hyp_sents = _sentences(hypothesis, use_stemmer)
    return _best([_summary_lcs_score(_sentences(reference, use_stemmer), hyp_sents)
                  for reference in references])


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence of two token sequences."""
    return _lcs_table(a, b)[-1][-1]


def _check_texts(hypothesis, references) -> tuple[str, list[str]]:
    if not isinstance(hypothesis, str):
        raise ValueError(f"hypothesis must be a string, got {type(hypothesis).__name__}")
    if isinstance(references, str):
        references = [references]
    references = list(references)
    if not references:
        raise ValueError("references is empty: give at least one reference string")
    for k, reference in enumerate(references):
        if not isinstance(reference, str):
            raise ValueError(f"references[{k}] must be a string, got {type(reference).__name__}")
    return hypothesis, references


@functools.cache
def _porter_stemmer():
    try:
        from nltk.stem import porter
    except ImportError as e:
        raise ImportError("use_stemmer=True needs NLTK's Porter stemmer (the one rouge-score "
                          "uses): pip install nltk, or call with use_stemmer=False") from e
    return porter.PorterStemmer()


def _ngram_counts(tokens: list[str], n: int) -> collections.Counter:
    return collections.Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def _score(hits: int, hyp_total: int, ref_total: int) -> Score:
    # An empty side gives 0, not a division by zero (rouge-score divides by max(total, 1)).
    precision = hits / max(hyp_total, 1)
    recall = hits / max(ref_total, 1)
    if precision + recall == 0:
        return Score(precision, recall, 0.0)
    return Score(precision, recall, 2 * precision * recall / (precision + recall))


def _best(scores: list[Score]) -> Score:
    # max() keeps the first of equal F values, as rouge-score's np.argmax does.
    return max(scores, key=lambda s: s.fmeasure)


def _lcs_table(a: Sequence[str], b: Sequence[str]) -> list[list[int]]:
    """table[i][j] = LCS length of a[:i] and b[:j], shape (len(a) + 1, len(b) + 1)."""
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            if a[i - 1] == b[j - 1]:
                table[i][j] = table[i - 1][j - 1] + 1
            else:
                table[i][j] = max(table[i - 1][j], table[i][j - 1])
    return table


def _lcs_positions(ref: list[str], hyp: list[str]) -> set[int]:
    """Positions in `ref` of one LCS with `hyp`, read back from the DP table.

    Which LCS (when several exist) decides ROUGE-Lsum's union, so the walk takes rouge-score's
    path: diagonal on a match, else left when that keeps a strictly longer LCS, else up.
    """
    table = _lcs_table(ref, hyp)
    i, j = len(ref), len(hyp)
    positions = set()
    while i > 0 and j > 0:
        if ref[i - 1] == hyp[j - 1]:
            positions.add(i - 1)
            i, j = i - 1, j - 1
        elif table[i][j - 1] > table[i - 1][j]:
            j -= 1
        else:
            i -= 1
    return positions


def _sentences(text: str, use_stemmer: bool) -> list[list[str]]:
    # Lines that are empty strings are dropped before tokenising; lines that tokenise to
    # nothing (punctuation only) stay as empty sentences, as in rouge-score.
    return [tokenize(line, use_stemmer) for line in text.split("\n") if line]


def _summary_lcs_score(ref_sents: list[list[str]], hyp_sents: list[list[str]]) -> Score:
    ref_total = sum(len(s) for s in ref_sents)
    hyp_total = sum(len(s) for s in hyp_sents)
    if not ref_total or not hyp_total:
        return Score(0.0, 0.0, 0.0)
    # Budgets: a token can be a hit only as often as it occurs on both sides overall.
    ref_left = collections.Counter(t for s in ref_sents for t in s)
    hyp_left = collections.Counter(t for s in hyp_sents for t in s)
    hits = 0
    for ref in ref_sents:
        union = set().union(*(_lcs_positions(ref, hyp) for hyp in hyp_sents))
        for token in (ref[i] for i in sorted(union)):
            if ref_left[token] > 0 and hyp_left[token] > 0:
                hits += 1
                ref_left[token] -= 1
                hyp_left[token] -= 1
    return _score(hits, hyp_total, ref_total)
