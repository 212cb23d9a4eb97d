"""SQuAD v1.1 / v2.0: the official EM and F1, BERT's span post-processing and the no-answer
threshold search.

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

Post-processing: `postprocess` turns per-window start/end logits into answers exactly as
google-research/bert's run_squad.py write_predictions does (top n_best start and end indices per
window, spans must lie in the context, start in its max-context window, end >= start, length <=
max_answer_length; scores start+end logit; candidates from all windows merged and deduplicated by
text; n-best softmax in float64; v2 null score = minimum over windows of the [CLS] start+end
logits, "" predicted when null score - best span score > null_score_diff_threshold). Text comes
from character offsets (context[offsets[s][0]:offsets[e][1]]) instead of BERT's whitespace
re-alignment. Deliberate differences, in corner cases only:

  * no valid span at all: the prediction is "" (BERT writes the nonce text "empty" in v1 and
    fails in v2), the v1 n-best is [{"text": "", probability 1.0, logits 0.0}] and the v2 null
    odds are +inf;
  * a span whose character range is empty is invalid (never the case with real offsets).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import re
import string
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from absl import logging

from zoo import paths
from zoo.errors import ConfigError, DataError, MissingFileError

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


# --------------------------------------------------------------------------------------------
# Post-processing (google-research/bert run_squad.py write_predictions semantics)
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SquadExample:
    """One question on one context paragraph (answers: [{"text", "answer_start"}], [] if none)."""

    id: str
    context: str
    question: str
    answers: tuple[Mapping[str, Any], ...] = ()
    is_impossible: bool = False


@dataclasses.dataclass(frozen=True, eq=False)
class SquadFeature:
    """One window of an example as the model sees it (L = max_seq_length, position 0 is [CLS]).

    Attributes:
      example_index: the window's example, an index into the examples list.
      offsets: (L, 2) int: token j covers context[offsets[j, 0]:offsets[j, 1]]; (-1, -1) for
        tokens outside the context ([CLS], question, [SEP], padding).
      token_is_max_context: (L,) bool: this window gives token j its maximal context (BERT's
        _check_is_max_context); a span may only start on such a token.
    """

    example_index: int
    offsets: np.ndarray
    token_is_max_context: np.ndarray


def postprocess(
    examples: Sequence[SquadExample | Mapping[str, Any]],
    features: Sequence[SquadFeature | Mapping[str, Any]] | Mapping[str, Any],
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    *,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    version_2: bool = False,
    null_score_diff_threshold: float = 0.0,
) -> tuple[dict[str, str], dict[str, list[dict[str, Any]]], dict[str, float]]:
    """Answers, n-best lists and null odds from per-window span logits (BERT's write_predictions).

    Args:
      examples: SquadExample objects or mappings with the same keys (only id and context are read).
      features: SquadFeature objects or mappings with the same keys, one per window, or one mapping
        of stacked arrays: example_index (N,), offsets (N, L, 2), token_is_max_context (N, L).
      start_logits, end_logits: (N, L) logits of window i's token j starting / ending the answer.
      n_best_size: start and end indices kept per window, and the n-best list's length.
      max_answer_length: the longest answer, in tokens.
      version_2: SQuAD v2.0: the [CLS] position scores "no answer".
      null_score_diff_threshold: v2: predict "" when null score - best span score exceeds this.

    Returns:
      predictions: example id -> answer text ("" for no answer).
      nbest: example id -> [{"text", "probability", "start_logit", "end_logit"}], best first,
        probabilities a float64 softmax over the list's start+end scores.
      null_odds: v2: example id -> null score - best non-null score (+inf when no span is
        valid); {} for v1.
    """
    if n_best_size < 1:
        raise ConfigError(f"n_best_size: must be >= 1, got {n_best_size}")
    if max_answer_length < 1:
        raise ConfigError(f"max_answer_length: must be >= 1, got {max_answer_length}")
    example_index, offsets, max_context = _stack_features(features)
    # Python floats in the reference: scores and the softmax are float64 here too.
    start_logits = np.asarray(start_logits, np.float64)
    end_logits = np.asarray(end_logits, np.float64)
    if start_logits.shape != offsets.shape[:2] or end_logits.shape != offsets.shape[:2]:
        raise ValueError(
            f"start_logits/end_logits: expected shape {offsets.shape[:2]} (features, positions) "
            f"to match the features' offsets, got {start_logits.shape} and {end_logits.shape}")
    bad = (example_index < 0) | (example_index >= len(examples))
    if bad.any():
        raise ValueError(f"features: example_index {example_index[bad][0]} is outside the "
                         f"{len(examples)} examples given")
    windows: dict[int, list[int]] = collections.defaultdict(list)
    for f, e in enumerate(example_index.tolist()):
        windows[e].append(f)

    predictions, nbest_json, null_odds = {}, {}, {}
    for e, example in enumerate(examples):
        qid, context = _field(example, "id"), _field(example, "context")
        if not windows[e]:
            raise ValueError(f"features: example {qid!r} (index {e}) has no window; pass every "
                             "feature of the examples being post-processed")
        # Candidates in the reference's order (window, start rank, end rank) so that stable
        # sorting breaks score ties the same way.
        cand_f, cand_s, cand_e = [], [], []
        score_null, null_f = math.inf, -1
        for f in windows[e]:
            if version_2:
                feature_null = start_logits[f, 0] + end_logits[f, 0]
                if feature_null < score_null:  # strict: the first minimal window wins, as in BERT
                    score_null, null_f = feature_null, f
            starts = _top_indices(start_logits[f], n_best_size)  # (n,)
            ends = _top_indices(end_logits[f], n_best_size)  # (n,)
            in_context = offsets[f, :, 0] >= 0  # (L,)
            length = ends[None, :] - starts[:, None] + 1  # (n, n)
            valid = (in_context[starts] & max_context[f, starts])[:, None] \
                & in_context[ends][None, :] & (length >= 1) & (length <= max_answer_length)
            s_rank, e_rank = np.nonzero(valid)  # row-major: the reference's nested loop order
            cand_f.append(np.full(len(s_rank), f))
            cand_s.append(starts[s_rank])
            cand_e.append(ends[e_rank])
        cand_f, cand_s, cand_e = (np.concatenate(c) for c in (cand_f, cand_s, cand_e))
        scores = start_logits[cand_f, cand_s] + end_logits[cand_f, cand_e]
        if version_2:  # the null candidate comes last, as in the reference
            cand_f = np.append(cand_f, null_f)
            cand_s, cand_e = np.append(cand_s, 0), np.append(cand_e, 0)
            scores = np.append(scores, score_null)

        entries, seen = [], set()  # (text, start logit, end logit), best first
        for k in np.argsort(-scores, kind="stable").tolist():
            if len(entries) >= n_best_size:
                break
            f, s, t = int(cand_f[k]), int(cand_s[k]), int(cand_e[k])
            is_null = version_2 and k == len(scores) - 1
            text = "" if is_null else context[offsets[f, s, 0]:offsets[f, t, 1]]
            if (text or is_null) and text not in seen:  # windows overlap: a span can repeat
                seen.add(text)
                entries.append((text, start_logits[f, s], end_logits[f, t]))
        # The best span always makes the n-best: for n_best_size=1, the top start and end of the
        # span's window score at least that window's [CLS] pair, and ties keep the span first.
        best_span = next((entry for entry in entries if entry[0]), None)
        if version_2 and "" not in seen:
            entries.append(("", start_logits[null_f, 0], end_logits[null_f, 0]))
        if not entries:
            entries.append(("", 0.0, 0.0))

        total = np.array([a + b for _, a, b in entries], np.float64)
        probs = np.exp(total - total.max())
        probs /= probs.sum()
        nbest_json[qid] = [
            {"text": text, "probability": float(p), "start_logit": float(a), "end_logit": float(b)}
            for (text, a, b), p in zip(entries, probs)]
        if not version_2:
            predictions[qid] = best_span[0] if best_span else ""
            continue
        # Subtracted one logit at a time, as the reference does (identical rounding).
        diff = score_null - best_span[1] - best_span[2] if best_span else math.inf
        null_odds[qid] = float(diff)
        predictions[qid] = "" if diff > null_score_diff_threshold else best_span[0]
    return predictions, nbest_json, null_odds


def _field(obj: Any, name: str) -> Any:
    return obj[name] if isinstance(obj, Mapping) else getattr(obj, name)


def _stack_features(features) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(example_index (N,), offsets (N, L, 2), token_is_max_context (N, L)) from either form."""
    if isinstance(features, Mapping):
        parts = [np.asarray(features[k]) for k in
                 ("example_index", "offsets", "token_is_max_context")]
    else:
        if not len(features):
            raise ValueError("features: no windows given")
        try:
            parts = [np.stack([np.asarray(_field(x, k)) for x in features]) for k in
                     ("example_index", "offsets", "token_is_max_context")]
        except ValueError as err:
            raise ValueError(f"features: every window must have the same length L ({err})") \
                from None
    example_index, offsets, max_context = parts
    if example_index.ndim != 1 or offsets.ndim != 3 or offsets.shape[2] != 2 \
            or max_context.shape != offsets.shape[:2] or len(example_index) != len(offsets):
        raise ValueError(
            "features: expected example_index (N,), offsets (N, L, 2) and token_is_max_context "
            f"(N, L), got {example_index.shape}, {offsets.shape} and {max_context.shape}")
    return example_index.astype(np.int64), offsets.astype(np.int64), max_context.astype(bool)


def _top_indices(logits: np.ndarray, n: int) -> np.ndarray:
    # Highest first; ties keep the lower index (the reference's stable sort).
    return np.argsort(-logits, kind="stable")[:n]


# --------------------------------------------------------------------------------------------
# Writers (run_squad.py's file formats)
# --------------------------------------------------------------------------------------------


def write_predictions(
    output_dir: str | os.PathLike,
    predictions: Mapping[str, str],
    nbest: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    null_odds: Mapping[str, float] | None = None,
) -> dict[str, str]:
    """Writes predictions.json, nbest_predictions.json and null_odds.json (each when given and,
    for null_odds, non-empty) as run_squad.py does, each atomically (a temp file, then rename).

    predictions.json is what the official scripts read; null_odds.json is their --na-prob-file
    (+inf odds are written as JSON's Infinity, which Python's json reads back).

    Returns:
      file kind ("predictions", "nbest", "null_odds") -> the path written.
    """
    contents = {"predictions": ("predictions.json", predictions),
                "nbest": ("nbest_predictions.json", nbest),
                "null_odds": ("null_odds.json", null_odds)}
    written = {}
    for kind, (name, obj) in contents.items():
        if obj is None or (kind == "null_odds" and not obj):
            continue
        written[kind] = paths.join(output_dir, name)
        # readers see the old file or the whole new one, never a part (local or gs://)
        paths.write_atomic(written[kind], json.dumps(obj, indent=4) + "\n")
    return written
