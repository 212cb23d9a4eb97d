"""Corpus BLEU (Papineni et al., 2002) as the evaluation section of the course slides on sequence
generation defines it, with sacrebleu's defaults.

The slides (eqs. 15.39 and 15.41), for a hypothesis x and references s^(1..K):

    p_n  = sum_w min(c_w(x), max_k c_w(s^(k))) / sum_w c_w(x)      (clipped n-gram precision)
    BP   = 1 if c > r else exp(1 - r / c)                          (brevity penalty)
    BLEU = BP * exp(sum_n w_n log p_n),  w_n = 1 / N, N = 4

At corpus level (as every BLEU tool reports it) the clipped matches, the n-gram totals, c (the
hypothesis lengths) and r (the reference lengths) are each summed over segments before the
formulas are applied. The numbers equal sacrebleu 2.6.0's `corpus_bleu` with the same options:

  * tokenisation: mteval-v13a (`tokenize_13a`, sacrebleu's tokenizer_13a), after an optional
    lowercasing and stripping trailing whitespace; `tokenize='none'` splits on whitespace only;
  * r for one segment is the reference length closest to the hypothesis length, ties going to
    the shorter one. The slides say "the shortest reference length"; with one reference the two
    agree, with several sacrebleu's (and mteval's) closest length is what every paper reports;
  * smoothing of zero-match orders: 'exp' (default, mteval's: the k-th order with no match
    gets precision 1 / (2^k * total)), 'floor' (smooth_value / total, default 0.1), 'add-k'
    (k added to the matches and totals of orders n > 1, default 1), 'none';
  * scores and precisions are percentages; an empty corpus-level precision makes BLEU 0.

Reference streams are sacrebleu's layout: `references[k][i]` is the k-th reference of segment i.
A stream may hold None for segments that have fewer references (the signature then says
"nrefs:var").

`signature` follows sacrebleu's ("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:zoo-1"),
except that the version field names this implementation: "zoo-1" computes sacrebleu 2.6.0's
numbers, and the tag is bumped whenever a change here could move a score.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from collections.abc import Sequence

SIGNATURE_VERSION = "zoo-1"
# Default smooth_value per method; None: the method takes no value (sacrebleu's defaults,
# from Chen & Cherry 2014, "A Systematic Comparison of Smoothing Techniques for Sentence BLEU").
SMOOTH_DEFAULTS = {"none": None, "floor": 0.1, "add-k": 1, "exp": None}
TOKENIZERS = ("13a", "none")

# mteval-v13a.pl's language-dependent rules, as sacrebleu's tokenizer_re writes them.
_13A_RULES = (
    # Split off every ASCII symbol except ' - . , (those need context, below). The ranges are
    # { | } ~, [ \ ] ^ _ `, space ! " # $ % &, ( ) * +, : ; < = > ? @, and /.
    (re.compile(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])"), r" \1 "),
    # Period and comma split off unless between digits: "3.14" and "1,000" stay whole.
    (re.compile(r"([^0-9])([\.,])"), r"\1 \2 "),
    (re.compile(r"([\.,])([^0-9])"), r" \1 \2"),
    # A dash after a digit splits ("5-7" -> "5 - 7"); hyphenated words stay whole.
    (re.compile(r"([0-9])(-)"), r"\1 \2 "),
)


def tokenize_13a(line: str) -> list[str]:
    """Tokens of `line` under mteval-v13a's tokenisation (sacrebleu's default '13a')."""
    # Language-independent part: mteval's markup and line-continuation clean-up.
    line = line.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
    if "&" in line:
        line = line.replace("&quot;", '"').replace("&amp;", "&")
        line = line.replace("&lt;", "<").replace("&gt;", ">")
    line = f" {line} "
    for pattern, replacement in _13A_RULES:
        line = pattern.sub(replacement, line)
    return line.split()


@dataclasses.dataclass(frozen=True)
class BLEUScore:
    """A corpus BLEU score and its sufficient statistics (sacrebleu's BLEUScore fields).

    Attributes:
      score: BLEU in percent.
      counts: clipped n-gram matches summed over the corpus, n = 1..N (raw counts: under
        'add-k' sacrebleu reports them with k added, here the k only enters `precisions`).
      totals: hypothesis n-gram counts summed over the corpus, n = 1..N (raw, as `counts`).
      precisions: p_n in percent after smoothing, n = 1..N.
      bp: the brevity penalty.
      sys_len: c, the summed hypothesis length in tokens.
      ref_len: r, the summed closest-reference length in tokens.
      signature: the options that produced the score, in sacrebleu's signature format.
    """

    score: float
    counts: tuple[int, ...]
    totals: tuple[int, ...]
    precisions: tuple[float, ...]
    bp: float
    sys_len: int
    ref_len: int
    signature: str

    @property
    def ratio(self) -> float:
        """c / r, the hypothesis-to-reference length ratio (0 when r is 0)."""
        return self.sys_len / self.ref_len if self.ref_len else 0.0

    def __str__(self) -> str:
        # sacrebleu's format, e.g. "BLEU = 38.72 80.0/75.0/33.3/25.0 (BP = 0.819 ...)".
        precisions = "/".join(f"{p:.1f}" for p in self.precisions)
        return (f"BLEU = {self.score:.2f} {precisions} (BP = {self.bp:.3f} "
                f"ratio = {self.ratio:.3f} hyp_len = {self.sys_len:d} "
                f"ref_len = {self.ref_len:d})")


def corpus_bleu(
    hypotheses: Sequence[str],
    references: Sequence[Sequence[str | None]],
    *,
    smooth_method: str = "exp",
    smooth_value: float | None = None,
    lowercase: bool = False,
    tokenize: str = "13a",
    max_ngram_order: int = 4,
    effective_order: bool = False,
) -> BLEUScore:
    """Corpus BLEU of `hypotheses` against reference streams, equal to sacrebleu's.

    Args:
      hypotheses: one detokenised system output per segment.
      references: reference streams, each with one line per hypothesis (sacrebleu's layout:
        `[refs]` for a single reference, `[refs_a, refs_b]` for two); None marks a segment
        that has no reference in that stream.
      smooth_method: 'exp' (default), 'floor', 'add-k' or 'none'.
      smooth_value: the value for 'floor' (default 0.1) and 'add-k' (default 1).
      lowercase: lowercase hypotheses and references before tokenising.
      tokenize: '13a' (mteval-v13a, default) or 'none' (whitespace split, for text that is
        already tokenised).
      max_ngram_order: N, the largest n-gram order.
      effective_order: average only over the orders n for which the corpus has any
        hypothesis n-gram (sacrebleu's option, meant for single sentences).

    Returns:
      A BLEUScore with `.score`, `.precisions`, `.bp`, the counts and the signature.

    Raises:
      ValueError: on an empty corpus, a reference stream whose length differs from the
        hypotheses', a segment with no reference, or an unknown option.
    """
    hypotheses, references = _check_corpus(hypotheses, references)
    if smooth_method not in SMOOTH_DEFAULTS:
        raise ValueError(f"smooth_method must be one of {sorted(SMOOTH_DEFAULTS)}, got "
                         f"{smooth_method!r}")
    if tokenize not in TOKENIZERS:
        raise ValueError(f"tokenize must be one of {TOKENIZERS}, got {tokenize!r}")
    if not isinstance(max_ngram_order, int) or max_ngram_order < 1:
        raise ValueError(f"max_ngram_order must be a positive integer, got {max_ngram_order!r}")
    if smooth_value is None:
        smooth_value = SMOOTH_DEFAULTS[smooth_method]

    def preprocess(line: str) -> list[str]:
        if lowercase:
            line = line.lower()
        line = line.rstrip()
        return tokenize_13a(line) if tokenize == "13a" else line.split()

    counts = [0] * max_ngram_order
    totals = [0] * max_ngram_order
    sys_len = ref_len = 0
    nrefs = set()
    for i, hypothesis in enumerate(hypotheses):
        segment_refs = [stream[i] for stream in references if stream[i] is not None]
        if not segment_refs:
            raise ValueError(f"segment {i} has no reference: every reference stream holds None "
                             "there; give each segment at least one reference")
        nrefs.add(len(segment_refs))
        ref_tokens = [preprocess(ref) for ref in segment_refs]
        hyp_tokens = preprocess(hypothesis)

        # max_k c_w(s^(k)): the clip for each n-gram is its largest count in any one reference.
        max_ref_counts = collections.Counter()
        for tokens in ref_tokens:
            max_ref_counts |= _ngram_counts(tokens, max_ngram_order)
        for ngram, count in _ngram_counts(hyp_tokens, max_ngram_order).items():
            totals[len(ngram) - 1] += count
            counts[len(ngram) - 1] += min(count, max_ref_counts[ngram])

        sys_len += len(hyp_tokens)
        ref_len += _closest_ref_len(len(hyp_tokens), [len(t) for t in ref_tokens])

    precisions, order = _smoothed_precisions(counts, totals, smooth_method, smooth_value,
                                             effective_order)
    bp = _brevity_penalty(sys_len, ref_len)
    if any(p == 0.0 for p in precisions[:order]):
        score = 0.0  # log 0 = -inf: one empty order zeroes the geometric mean
    else:
        score = bp * math.exp(sum(math.log(p) for p in precisions[:order]) / order)

    smooth = smooth_method
    if SMOOTH_DEFAULTS[smooth_method] is not None:
        smooth += f"[{smooth_value:.2f}]"
    signature = "|".join([
        f"nrefs:{nrefs.pop() if len(nrefs) == 1 else 'var'}",
        f"case:{'lc' if lowercase else 'mixed'}",
        f"eff:{'yes' if effective_order else 'no'}",
        f"tok:{tokenize}",
        f"smooth:{smooth}",
        f"version:{SIGNATURE_VERSION}",
    ])
    return BLEUScore(score=score, counts=tuple(counts), totals=tuple(totals),
                     precisions=tuple(precisions), bp=bp, sys_len=sys_len, ref_len=ref_len,
                     signature=signature)


def sentence_bleu(
    hypothesis: str,
    references: Sequence[str],
    *,
    smooth_method: str = "exp",
    smooth_value: float | None = None,
    lowercase: bool = False,
    tokenize: str = "13a",
    max_ngram_order: int = 4,
    effective_order: bool = True,
) -> BLEUScore:
    """BLEU of one hypothesis against its references (sacrebleu's `sentence_bleu`).

    A corpus of one segment, with `effective_order` on by default as sacrebleu does. BLEU is
    a corpus metric: averaging sentence scores is not corpus BLEU.

    Args:
      hypothesis: the system output.
      references: this segment's references (plain strings, not streams).
      smooth_method, smooth_value, lowercase, tokenize, max_ngram_order, effective_order: as
        in `corpus_bleu`.
    """
    if not isinstance(hypothesis, str):
        raise ValueError(f"hypothesis must be a string, got {type(hypothesis).__name__}")
    if isinstance(references, str):
        raise ValueError("references must be a list of reference strings, got one string; "
                         "wrap it: sentence_bleu(hypothesis, [reference])")
    return corpus_bleu([hypothesis], [[ref] for ref in references],
                       smooth_method=smooth_method, smooth_value=smooth_value,
                       lowercase=lowercase, tokenize=tokenize, max_ngram_order=max_ngram_order,
                       effective_order=effective_order)


def _check_corpus(hypotheses, references) -> tuple[list[str], list[list[str | None]]]:
    if isinstance(hypotheses, str):
        raise ValueError("hypotheses must be a list of strings (one per segment), got one "
                         "string; wrap it: corpus_bleu([hypothesis], [[reference]])")
    hypotheses = list(hypotheses)
    if not hypotheses:
        raise ValueError("hypotheses is empty: BLEU needs at least one segment")
    for i, line in enumerate(hypotheses):
        if not isinstance(line, str):
            raise ValueError(f"hypotheses[{i}] must be a string, got {type(line).__name__}")

    if isinstance(references, str) or not references:
        raise ValueError("references must be a non-empty list of reference streams, each a "
                         "list with one reference string per hypothesis (e.g. [refs])")
    references = list(references)
    if isinstance(references[0], str):
        raise ValueError("references must be a list of reference streams, got a list of "
                         "strings; for one reference per segment pass [refs], not refs")
    streams = []
    for k, stream in enumerate(references):
        if isinstance(stream, str):
            raise ValueError(f"references[{k}] must be a list of strings (a reference stream), "
                             "got one string")
        stream = list(stream)
        if len(stream) != len(hypotheses):
            raise ValueError(f"references[{k}] has {len(stream)} lines but hypotheses has "
                             f"{len(hypotheses)}; every reference stream needs exactly one "
                             "line (or None) per hypothesis")
        for i, line in enumerate(stream):
            if line is not None and not isinstance(line, str):
                raise ValueError(f"references[{k}][{i}] must be a string or None, got "
                                 f"{type(line).__name__}")
        streams.append(stream)
    return hypotheses, streams


def _ngram_counts(tokens: list[str], max_order: int) -> collections.Counter:
    """c_w(.) for every n-gram w of order 1..max_order, keyed by token tuples."""
    return collections.Counter(
        tuple(tokens[i:i + n]) for n in range(1, max_order + 1)
        for i in range(len(tokens) - n + 1))


def _closest_ref_len(hyp_len: int, ref_lens: list[int]) -> int:
    # Closest to the hypothesis; on a tie (one shorter, one longer) the shorter one.
    return min(ref_lens, key=lambda ref: (abs(ref - hyp_len), ref))


def _brevity_penalty(sys_len: int, ref_len: int) -> float:
    """The slides' b(x): 1 if c > r else exp(1 - r / c); 0 for an empty output (its limit)."""
    if sys_len >= ref_len:  # at c == r, exp(1 - r / c) is exactly 1 as well
        return 1.0
    if sys_len == 0:
        return 0.0
    return math.exp(1 - ref_len / sys_len)


def _smoothed_precisions(counts, totals, smooth_method, smooth_value, effective_order):
    """Percent precisions p_1..p_N after smoothing, and how many orders the mean takes.

    Follows sacrebleu's compute_bleu step for step, so corner cases agree: no match at any
    order gives all zeros; an order with no hypothesis n-grams (total 0) ends the loop and
    leaves it and the higher orders at 0 (BLEU 0 unless `effective_order` drops them).
    """
    max_order = len(counts)
    precisions = [0.0] * max_order
    if not any(counts):
        return precisions, max_order
    order = max_order
    halvings = 1.0  # 'exp': the k-th order with no match gets 1 / (2^k * total)
    for n in range(1, max_order + 1):
        correct, total = counts[n - 1], totals[n - 1]
        if smooth_method == "add-k" and n > 1:
            correct, total = correct + smooth_value, total + smooth_value
        if total == 0:
            break
        if effective_order:
            order = n
        if correct > 0:
            precisions[n - 1] = 100.0 * correct / total
        elif smooth_method == "exp":
            halvings *= 2
            precisions[n - 1] = 100.0 / (halvings * total)
        elif smooth_method == "floor":
            precisions[n - 1] = 100.0 * smooth_value / total
    return precisions, order
