"""SQuAD v1.1 / v2.0 post-processing: a model's per-window start/end logits -> answers, n-best
lists and no-answer odds, and the output files (run_squad.py's formats) that the official
metrics (zoo.eval.squad_metrics) read.

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
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from zoo import paths
from zoo.errors import ConfigError

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
    written = {}
    for kind, (name, text) in prediction_files(predictions, nbest, null_odds).items():
        written[kind] = paths.join(output_dir, name)
        # readers see the old file or the whole new one, never a part (local or gs://)
        paths.write_atomic(written[kind], text)
    return written


def prediction_files(
    predictions: Mapping[str, str],
    nbest: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    null_odds: Mapping[str, float] | None = None,
) -> dict[str, tuple[str, str]]:
    """What write_predictions writes, without writing: file kind ("predictions", "nbest",
    "null_odds") -> (file name, text), each kind present when given (null_odds: non-empty)."""
    contents = {"predictions": ("predictions.json", predictions),
                "nbest": ("nbest_predictions.json", nbest),
                "null_odds": ("null_odds.json", null_odds)}
    return {kind: (name, json.dumps(obj, indent=4) + "\n")
            for kind, (name, obj) in contents.items()
            if obj is not None and not (kind == "null_odds" and not obj)}
