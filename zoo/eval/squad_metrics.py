"""SQuAD v1.1 / v2.0: the official EM and F1 and the no-answer threshold search.

Metric: `evaluate` reproduces the official evaluate-v1.1.py and evaluate-v2.0.py scripts number
for number (normalisation, token-overlap F1, max over gold answers, percentages). The semantics
follow the dataset: v2.0 as soon as one question is `is_impossible`, v1.1 otherwise (or force one
with `version=`). The two scripts part ways in two places, and so do the two modes here:

  * a missing prediction: v1.1 counts the question with score 0 (and warns, as the script
    prints); v2.0's script prints "Missing prediction for <id>" and then dies with a KeyError in
    its HasAns/NoAns breakdown, so here it is a ValueError naming the missing ids;
  * an answer that normalises to nothing ("", "the", "!"): v1.1's F1 is 0 even against an empty
    gold (its overlap count is 0), v2.0's F1 is 1 when both sides are empty; v2.0 also drops
    gold answers that normalise to nothing and treats a question left without gold as
    unanswerable (only "" is right).

Post-processing of a model's logits into these answers, and the output files, are in
zoo.eval.squad_postprocess.
"""

from __future__ import annotations

import collections
import json
import os
import re
import string
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from absl import logging

from zoo import paths
from zoo.errors import DataError, MissingFileError

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_VERSIONS = ("1.1", "2.0")


# --------------------------------------------------------------------------------------------
# Metric (official evaluate-v1.1.py / evaluate-v2.0.py semantics)
# --------------------------------------------------------------------------------------------


def normalize_answer(s: str) -> str:
    """Lowercase, drop string.punctuation, drop the words a/an/the, collapse whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    # Articles go after punctuation, so "the-end" -> "theend" keeps its "the".
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_score(gold: str, prediction: str) -> int:
    """1 when both answers normalise to the same string, else 0 (same in v1.1 and v2.0)."""
    return int(normalize_answer(gold) == normalize_answer(prediction))


def f1_score(gold: str, prediction: str, version: str = "2.0") -> float:
    """Token-overlap F1 of the normalised answers (multiset overlap, as collections.Counter &).

    The versions differ only when a side normalises to nothing: v1.1 returns 0 (no overlap),
    v2.0 returns 1 if both sides are empty and 0 otherwise.
    """
    _check_version(version)
    gold_tokens = normalize_answer(gold).split()
    pred_tokens = normalize_answer(prediction).split()
    if version == "2.0" and (not gold_tokens or not pred_tokens):
        return float(gold_tokens == pred_tokens)
    same = sum((collections.Counter(gold_tokens) & collections.Counter(pred_tokens)).values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def evaluate(
    dataset: str | os.PathLike | Mapping | Sequence[Mapping],
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
    *,
    version: str | None = None,
) -> dict[str, float]:
    """EM and F1 in percent, as the official SQuAD script of the dataset's version reports them.

    Args:
      dataset: the official JSON's "data" list, the whole JSON object, or a path to the file.
      predictions: question id -> answer text ("" = no answer).
      na_probs: v2.0 only: question id -> no-answer score (a probability, or BERT's null odds);
        adds best_exact/best_exact_thresh/best_f1/best_f1_thresh (the script's --na-prob-file).
      na_prob_thresh: v2.0 only: questions with na_prob > this count as answered "".
      version: "1.1" or "2.0"; default: "2.0" when any question is_impossible, else "1.1".

    Returns:
      v1.1: {exact_match, f1, exact (= exact_match), total}. v2.0: {exact, f1, total,
      HasAns_exact, HasAns_f1, HasAns_total, NoAns_exact, NoAns_f1, NoAns_total} (a group only
      when it has questions) plus the best_* keys when na_probs is given.
    """
    data = load_dataset(dataset)
    if version is None:
        version = "2.0" if any(qa.get("is_impossible", False) for qa in _questions(data)) else "1.1"
    _check_version(version)
    if version == "1.1":
        if na_probs is not None:
            raise ValueError(
                "na_probs: SQuAD v1.1 has no unanswerable questions (none is_impossible in this "
                "dataset); pass version='2.0' to score no-answer probabilities")
        return _evaluate_v1(data, predictions)
    return _evaluate_v2(data, predictions, na_probs, na_prob_thresh)


def best_threshold(
    dataset: str | os.PathLike | Mapping | Sequence[Mapping],
    predictions: Mapping[str, str | Sequence[Mapping[str, Any]]],
    null_odds: Mapping[str, float],
) -> dict[str, float]:
    """The no-answer threshold that maximises F1 (official v2.0 find_all_best_thresh), and the
    v2.0 metrics of answering "" exactly when null_odds > that threshold.

    Args:
      dataset: as for `evaluate` (scored with v2.0 semantics).
      predictions: question id -> the best non-null answer text, or the n-best list
        (`postprocess`'s nbest; its first non-empty text is used). Thresholded predictions work
        too, but then the search cannot answer the questions that were already set to "".
      null_odds: question id -> null score - best non-null score (`postprocess`'s null_odds).

    Returns:
      `evaluate(..., na_probs=null_odds, na_prob_thresh=best_f1_thresh, version="2.0")`:
      exact/f1/HasAns_*/NoAns_* at that threshold and best_exact, best_exact_thresh, best_f1,
      best_f1_thresh. Use best_f1_thresh as postprocess's null_score_diff_threshold.

    As in the official script, a search in which answering nothing scores best returns the
    threshold 0.0 (right for probabilities, not for null odds, which can be negative); the
    exact/f1 returned are those that threshold really gives, so they are then below best_f1.
    """
    data = load_dataset(dataset)
    answers = {qid: p if isinstance(p, str) else _best_non_null_text(p)
               for qid, p in predictions.items()}
    search = _evaluate_v2(data, answers, null_odds, 1.0)
    return _evaluate_v2(data, answers, null_odds, search["best_f1_thresh"])


def load_dataset(dataset: str | os.PathLike | Mapping | Sequence[Mapping]) -> list[dict]:
    """The "data" list (articles with paragraphs and qas) from a path, a JSON object or itself."""
    if isinstance(dataset, (str, os.PathLike)):
        try:
            with paths.as_path(dataset).open(encoding="utf-8") as f:
                dataset = json.load(f)
        except FileNotFoundError:
            raise MissingFileError(f"dataset: SQuAD file {dataset} does not exist") from None
    if isinstance(dataset, Mapping):
        if "data" not in dataset:
            raise DataError("dataset: a SQuAD JSON object needs a 'data' list of articles "
                            f"(got keys {sorted(dataset)})")
        dataset = dataset["data"]
    if not isinstance(dataset, Sequence) or isinstance(dataset, str):
        raise TypeError(f"dataset: expected a path, a SQuAD JSON object or its 'data' list of "
                         f"articles, got {type(dataset).__name__}")
    return list(dataset)


def _questions(data: Sequence[Mapping]) -> Iterator[Mapping]:
    for article in data:
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]


def _check_version(version: str) -> None:
    if version not in _VERSIONS:
        raise ValueError(f"version: expected one of {_VERSIONS}, got {version!r}")


def _evaluate_v1(data: Sequence[Mapping], predictions: Mapping[str, str]) -> dict[str, float]:
    exact = f1 = 0.0
    total = 0
    missing = []
    for qa in _questions(data):
        total += 1
        if qa["id"] not in predictions:
            missing.append(qa["id"])  # the script prints and scores 0, still counting the total
            continue
        golds = [a["text"] for a in qa["answers"]]
        if not golds:
            raise DataError(
                f"dataset: question {qa['id']} has no gold answers, which SQuAD v1.1 cannot "
                "score; pass version='2.0' (or mark it is_impossible) for unanswerable questions")
        prediction = predictions[qa["id"]]
        exact += max(exact_score(g, prediction) for g in golds)
        f1 += max(f1_score(g, prediction, "1.1") for g in golds)
    if total == 0:
        raise DataError("dataset: no questions to score")
    if missing:
        logging.warning("%d unanswered question(s) will receive score 0, e.g. %s",
                        len(missing), missing[:5])
    return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1 / total,
            "exact": 100.0 * exact / total, "total": total}


def _evaluate_v2(data: Sequence[Mapping], predictions: Mapping[str, str],
                 na_probs: Mapping[str, float] | None, na_prob_thresh: float) -> dict[str, float]:
    has_ans = {qa["id"]: bool(qa["answers"]) for qa in _questions(data)}
    if not has_ans:
        raise DataError("dataset: no questions to score")
    missing = [qid for qid in has_ans if qid not in predictions]
    if missing:
        raise ValueError(
            f"predictions: {len(missing)} of {len(has_ans)} questions have no prediction, e.g. "
            f"{missing[:5]}; the official v2.0 script cannot score them either (it prints "
            "'Missing prediction' and fails); predict '' for questions the model leaves unanswered")
    exact_raw, f1_raw = {}, {}
    for qa in _questions(data):
        # Gold answers that normalise to nothing do not count; none left means unanswerable.
        golds = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])] or [""]
        prediction = predictions[qa["id"]]
        exact_raw[qa["id"]] = max(exact_score(g, prediction) for g in golds)
        f1_raw[qa["id"]] = max(f1_score(g, prediction, "2.0") for g in golds)

    with_na_probs = na_probs is not None
    if na_probs is None:
        na_probs = {qid: 0.0 for qid in predictions}
    else:
        missing = [qid for qid in has_ans if qid not in na_probs]
        if missing:
            raise ValueError(f"na_probs: no value for {len(missing)} question(s), e.g. "
                             f"{missing[:5]}; give every question a no-answer score")

    def thresholded(scores):
        # Questions predicted unanswerable score 1 exactly when they are unanswerable.
        return {qid: float(not has_ans[qid]) if na_probs[qid] > na_prob_thresh else s
                for qid, s in scores.items()}

    exact, f1 = thresholded(exact_raw), thresholded(f1_raw)
    out = _summary(exact, f1, list(exact))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid, v in has_ans.items() if v == wanted]
        if qids:
            out.update({f"{prefix}_{k}": v for k, v in _summary(exact, f1, qids).items()})
    if with_na_probs:
        out["best_exact"], out["best_exact_thresh"] = _find_best_thresh(
            predictions, exact_raw, na_probs, has_ans)
        out["best_f1"], out["best_f1_thresh"] = _find_best_thresh(
            predictions, f1_raw, na_probs, has_ans)
    return out


def _summary(exact: Mapping[str, float], f1: Mapping[str, float], qids: list[str]) -> dict:
    return {"exact": 100.0 * sum(exact[q] for q in qids) / len(qids),
            "f1": 100.0 * sum(f1[q] for q in qids) / len(qids), "total": len(qids)}


def _find_best_thresh(predictions: Mapping[str, str], scores: Mapping[str, float],
                      na_probs: Mapping[str, float], has_ans: Mapping[str, bool]
                      ) -> tuple[float, float]:
    """The official find_best_thresh: sweep questions by rising na_prob, answering each in turn.

    Answering nothing scores every unanswerable question right; answering a question then adds
    its score if answerable, or -1 if unanswerable with a non-empty prediction. The threshold is
    the na_prob of the last question answered at the best total (0.0 if answering none is best).
    """
    score = best_score = sum(1 for v in has_ans.values() if not v)
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):  # stable: ties keep na_probs order
        if qid not in scores:
            continue
        if has_ans[qid]:
            score += scores[qid]
        elif predictions[qid]:
            score -= 1
        if score > best_score:
            best_score, best_thresh = score, na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh


def _best_non_null_text(nbest: Sequence[Mapping[str, Any]]) -> str:
    return next((entry["text"] for entry in nbest if entry["text"]), "")
