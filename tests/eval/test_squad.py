"""SQuAD metric, post-processing and writers: hand-worked cases and an independent transcription
of the official evaluate-v1.1.py / evaluate-v2.0.py algorithms."""

import collections
import json
import math
import os
import random
import re
import string

import numpy as np
import pytest

from zoo.eval import squad


def _qa(qid, answers, impossible=False):
    return {"id": qid, "question": f"question {qid}?", "is_impossible": impossible,
            "answers": [{"text": a, "answer_start": 0} for a in answers]}


def _dataset(*qas):
    return [{"title": "t", "paragraphs": [{"context": "unused by the metric", "qas": list(qas)}]}]


# --------------------------------------------------------------------------------------------
# normalisation and per-answer scores
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("HeLLo WoRLD", "hello world"),  # case
    ("U.S.A.!?", "usa"),  # ASCII punctuation vanishes ...
    ("rock'n'roll, (live)", "rocknroll live"),
    ("café—bar “quoted”", "café—bar “quoted”"),  # ... non-ASCII punctuation stays
    ("a cat, an owl and the dog", "cat owl and dog"),  # the three articles, any case ...
    ("A Cat", "cat"),
    ("theatre anthem banana then", "theatre anthem banana then"),  # ... never inside words
    ("the-end", "theend"),  # punctuation first: no word "the" left
    ("A.N.", ""),  # ... but "a.n." becomes the article "an"
    ("  foo \t bar\n baz  ", "foo bar baz"),  # whitespace collapses
    ("", ""),
])
def test_normalize_answer(text, expected):
    assert squad.normalize_answer(text) == expected


def test_exact_score_after_normalisation():
    assert squad.exact_score("The Denver Broncos!", "denver  broncos") == 1
    assert squad.exact_score("Denver Broncos", "Broncos") == 0


@pytest.mark.parametrize("version", ["1.1", "2.0"])
def test_f1_partial_overlap_by_hand(version):
    # gold {cat, sat, on, mat}, pred {cat, on, mat}: P = 3/3, R = 3/4 -> F1 = 2*0.75/1.75 = 6/7.
    f1 = squad.f1_score("the cat sat on the mat", "Cat on a mat.", version)
    assert f1 == pytest.approx(6 / 7)
    # Multiset overlap: gold x y y z, pred y y y -> 2 shared y's, P = 2/3, R = 2/4 -> F1 = 4/7.
    assert squad.f1_score("x y y z", "y y y", version) == pytest.approx(4 / 7)
    assert squad.f1_score("x y", "z", version) == 0.0
    assert squad.f1_score("Broncos", "the broncos", version) == 1.0


def test_f1_empty_answers_differ_between_versions():
    # Both sides normalise to nothing: v1.1's overlap count is 0 -> F1 0; v2.0: both "no answer".
    assert squad.f1_score("The", "a", "1.1") == 0.0
    assert squad.f1_score("The", "a", "2.0") == 1.0
    assert squad.f1_score("", "", "2.0") == 1.0
    assert squad.f1_score("", "Paris", "2.0") == 0.0  # text against an unanswerable question
    assert squad.f1_score("Paris", "", "2.0") == 0.0
    assert squad.f1_score("Paris", "", "1.1") == 0.0


# --------------------------------------------------------------------------------------------
# evaluate: v1.1
# --------------------------------------------------------------------------------------------

V1 = _dataset(
    _qa("q1", ["Denver Broncos", "Broncos", "the Denver Broncos team"]),
    _qa("q2", ["the cat sat on the mat"]),
    _qa("q3", ["x y y z"]),
    _qa("q4", ["Paris"]),
)


def test_max_over_gold_answers():
    # "Denver" vs golds: 2/3 ("denver broncos": P 1, R 1/2), 0, 1/2 ("denver broncos team").
    one = _dataset(V1[0]["paragraphs"][0]["qas"][0])
    out = squad.evaluate(one, {"q1": "Denver"})
    assert out["exact_match"] == 0.0
    assert out["f1"] == pytest.approx(100 * 2 / 3)
    out = squad.evaluate(one, {"q1": "broncos"})
    assert out["exact_match"] == 100.0 and out["f1"] == 100.0


def test_v1_missing_prediction_scores_zero_and_counts(caplog):
    preds = {"q1": "broncos", "q2": "Cat on a mat.", "q3": "y y y"}  # q4 missing
    with caplog.at_level("WARNING"):
        out = squad.evaluate(V1, preds)
    # EM: q1 only -> 1/4. F1: (1 + 6/7 + 4/7 + 0) / 4 = 17/28.
    assert out == pytest.approx({"exact_match": 25.0, "f1": 100 * 17 / 28, "exact": 25.0,
                                 "total": 4})
    assert "q4" in caplog.text
    complete = squad.evaluate(V1, {**preds, "q4": "paris"})
    assert complete["exact_match"] == 50.0 and complete["f1"] == pytest.approx(100 * 24 / 28)


def test_dataset_given_as_path_object_or_list(tmp_path):
    path = tmp_path / "dev-v1.1.json"
    path.write_text(json.dumps({"version": "1.1", "data": V1}))
    preds = {"q1": "Denver", "q2": "mat", "q3": "z", "q4": "paris"}
    from_list = squad.evaluate(V1, preds)
    assert squad.evaluate(str(path), preds) == from_list
    assert squad.evaluate(path, preds) == from_list
    assert squad.evaluate({"version": "1.1", "data": V1}, preds) == from_list


def test_na_probs_rejected_for_v1():
    with pytest.raises(ValueError, match="na_probs"):
        squad.evaluate(V1, {"q1": "x"}, na_probs={"q1": 0.5})


# --------------------------------------------------------------------------------------------
# evaluate: v2.0
# --------------------------------------------------------------------------------------------

V2 = _dataset(
    _qa("q1", ["Broncos"]),
    _qa("q2", ["cat"]),
    _qa("q3", [], impossible=True),
    _qa("q4", [], impossible=True),
    _qa("q5", ["Paris"]),
)
V2_PREDS = {"q1": "Denver Broncos", "q2": "", "q3": "", "q4": "something", "q5": "paris"}
# Raw (EM, F1): q1 (0, 2/3: P 1/2, R 1), q2 (0, 0), q3 (1, 1), q4 (0, 0), q5 (1, 1).


def test_v2_breakdown_by_hand():
    out = squad.evaluate(V2, V2_PREDS)
    assert list(out) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
                         "NoAns_exact", "NoAns_f1", "NoAns_total"]
    assert out == pytest.approx({
        "exact": 100 * 2 / 5, "f1": 100 * (2 / 3 + 2) / 5, "total": 5,
        "HasAns_exact": 100 / 3, "HasAns_f1": 100 * (5 / 3) / 3, "HasAns_total": 3,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2})


def test_v2_na_prob_threshold_turns_answers_into_no_answer():
    na = {"q1": 0.9, "q2": 0.2, "q3": 0.8, "q4": 0.7, "q5": 0.4}
    out = squad.evaluate(V2, V2_PREDS, na_probs=na, na_prob_thresh=0.5)
    # Above 0.5 -> scored as "" : q1 (answerable) 0, q3 and q4 (unanswerable) 1. q2 0, q5 1 raw.
    assert out["exact"] == pytest.approx(100 * 3 / 5)
    assert out["f1"] == pytest.approx(100 * 3 / 5)
    assert out["HasAns_f1"] == pytest.approx(100 / 3)
    assert out["NoAns_exact"] == 100.0


def test_v2_best_thresholds_by_hand():
    na = {"q1": 0.55, "q2": 0.6, "q3": 0.3, "q4": 0.9, "q5": 0.5}
    out = squad.evaluate(V2, V2_PREDS, na_probs=na)
    # Start at 2 (every unanswerable right when nothing is answered); answer in rising na order:
    #   q3 (+0, "" stays right), q5 (+1 -> 3), q1 (EM +0 | F1 +2/3 -> 11/3), q2 (+0), q4 (-1).
    assert out["best_exact"] == pytest.approx(100 * 3 / 5)
    assert out["best_exact_thresh"] == 0.5
    assert out["best_f1"] == pytest.approx(100 * (11 / 3) / 5)
    assert out["best_f1_thresh"] == 0.55
    # The best F1 is what the threshold gives when applied.
    at_best = squad.evaluate(V2, V2_PREDS, na_probs=na, na_prob_thresh=0.55)
    assert at_best["f1"] == pytest.approx(out["best_f1"])


def test_v2_best_thresh_is_zero_when_answering_nothing_wins():
    data = _dataset(_qa("q1", ["a b"]), _qa("q2", [], impossible=True))
    out = squad.evaluate(data, {"q1": "wrong", "q2": "also wrong"},
                         na_probs={"q1": 0.3, "q2": 0.7})
    assert out["best_f1"] == 50.0 and out["best_f1_thresh"] == 0.0


def test_v2_gold_that_normalises_to_nothing_means_no_answer():
    data = _dataset(_qa("q1", ["The"]), _qa("q2", [], impossible=True))
    out = squad.evaluate(data, {"q1": "", "q2": ""})
    assert out["exact"] == 100.0 and out["f1"] == 100.0
    assert out["HasAns_total"] == 1  # still counted as answerable: it has an answer entry


def test_v2_missing_prediction_is_an_error():
    with pytest.raises(ValueError, match=r"predictions: 1 of 5 .*'q4'"):
        squad.evaluate(V2, {k: v for k, v in V2_PREDS.items() if k != "q4"})
    with pytest.raises(ValueError, match="na_probs"):
        squad.evaluate(V2, V2_PREDS, na_probs={"q1": 0.0})


def test_version_detection_and_override():
    answerable = _dataset(_qa("q1", ["The"]))
    # v1.1 (no is_impossible): "" vs "The" -> EM 1 (both normalise to ""), F1 0 (no overlap).
    assert squad.evaluate(answerable, {"q1": ""}) == {"exact_match": 100.0, "f1": 0.0,
                                                     "exact": 100.0, "total": 1}
    forced = squad.evaluate(answerable, {"q1": ""}, version="2.0")
    assert forced["exact"] == 100.0 and forced["f1"] == 100.0
    with pytest.raises(ValueError, match="version"):
        squad.evaluate(answerable, {"q1": ""}, version="3")


# --------------------------------------------------------------------------------------------
# evaluate against the official algorithms on random predictions
# --------------------------------------------------------------------------------------------
# An independent transcription of evaluate-v1.1.py's evaluate() and evaluate-v2.0.py's main()
# (get_raw_scores, apply_no_ans_threshold, make_eval_dict, find_all_best_thresh), kept as
# close to the scripts' control flow as possible.


def _official_normalize(s):
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def _official_f1_v1(prediction, ground_truth):
    p, g = _official_normalize(prediction).split(), _official_normalize(ground_truth).split()
    same = sum((collections.Counter(p) & collections.Counter(g)).values())
    if same == 0:
        return 0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def _official_evaluate_v1(dataset, predictions):
    f1 = exact_match = total = 0
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                total += 1
                if qa["id"] not in predictions:
                    continue
                truths = [x["text"] for x in qa["answers"]]
                pred = predictions[qa["id"]]
                exact_match += max(_official_normalize(pred) == _official_normalize(t)
                                   for t in truths)
                f1 += max(_official_f1_v1(pred, t) for t in truths)
    return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1 / total}


def _official_tokens(s):
    return [] if not s else _official_normalize(s).split()


def _official_f1_v2(gold, pred):
    g, p = _official_tokens(gold), _official_tokens(pred)
    same = sum((collections.Counter(g) & collections.Counter(p)).values())
    if len(g) == 0 or len(p) == 0:
        return int(g == p)
    if same == 0:
        return 0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def _official_evaluate_v2(dataset, preds, na_probs, na_prob_thresh):
    qas = [qa for article in dataset for p in article["paragraphs"] for qa in p["qas"]]
    has_ans = {qa["id"]: bool(qa["answers"]) for qa in qas}
    exact_raw, f1_raw = {}, {}
    for qa in qas:
        golds = [a["text"] for a in qa["answers"] if _official_normalize(a["text"])] or [""]
        pred = preds[qa["id"]]
        exact_raw[qa["id"]] = max(int(_official_normalize(a) == _official_normalize(pred))
                                  for a in golds)
        f1_raw[qa["id"]] = max(_official_f1_v2(a, preds[qa["id"]]) for a in golds)
    given = na_probs is not None
    na_probs = na_probs if given else {k: 0.0 for k in preds}

    def thresh(scores):
        return {q: float(not has_ans[q]) if na_probs[q] > na_prob_thresh else s
                for q, s in scores.items()}

    def summary(ex, f1, ids):
        return {"exact": 100.0 * sum(ex[k] for k in ids) / len(ids),
                "f1": 100.0 * sum(f1[k] for k in ids) / len(ids), "total": len(ids)}

    ex, f1 = thresh(exact_raw), thresh(f1_raw)
    out = summary(ex, f1, list(ex))
    for prefix, want in (("HasAns", True), ("NoAns", False)):
        ids = [k for k, v in has_ans.items() if v == want]
        if ids:
            out.update({f"{prefix}_{k}": v for k, v in summary(ex, f1, ids).items()})

    def best(scores):
        cur = best_score = sum(1 for k in has_ans if not has_ans[k])
        best_thresh = 0.0
        for qid in sorted(na_probs, key=lambda k: na_probs[k]):
            if qid not in scores:
                continue
            diff = scores[qid] if has_ans[qid] else (-1 if preds[qid] else 0)
            cur += diff
            if cur > best_score:
                best_score, best_thresh = cur, na_probs[qid]
        return 100.0 * best_score / len(scores), best_thresh

    if given:
        out["best_exact"], out["best_exact_thresh"] = best(exact_raw)
        out["best_f1"], out["best_f1_thresh"] = best(f1_raw)
    return out


_WORDS = ["The", "the", "a", "An", "an", "cat", "Cat.", "dog", "dog,", "theatre", "anthem",
          "!", "U.S.", "x", "y", "  ", "café", "—"]


def _phrase(rng, lo, hi):
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi)))


@pytest.mark.parametrize("seed", range(4))
def test_matches_official_v1_on_random_predictions(seed):
    rng = random.Random(seed)
    qas = [_qa(f"q{i}", [_phrase(rng, 1, 4) for _ in range(rng.randint(1, 3))])
           for i in range(40)]
    preds = {qa["id"]: _phrase(rng, 0, 4) for qa in qas if rng.random() > 0.1}
    data = _dataset(*qas)
    out = squad.evaluate(data, preds)
    ref = _official_evaluate_v1(data, preds)
    assert out["exact_match"] == pytest.approx(ref["exact_match"], abs=1e-12)
    assert out["f1"] == pytest.approx(ref["f1"], abs=1e-12)
    assert 0 < out["f1"] < 100  # the random cases are neither all right nor all wrong


@pytest.mark.parametrize("seed", range(4))
def test_matches_official_v2_on_random_predictions(seed):
    rng = random.Random(seed)
    qas = [_qa(f"q{i}", [] if i % 3 == 0 else
               [_phrase(rng, 1, 3) for _ in range(rng.randint(1, 3))], impossible=i % 3 == 0)
           for i in range(45)]
    preds = {qa["id"]: _phrase(rng, 0, 3) if rng.random() > 0.3 else "" for qa in qas}
    na_probs = {qa["id"]: rng.choice([0.1, 0.2, 0.3, 0.5, 0.8]) for qa in qas}  # with ties
    thresh = rng.choice([0.15, 0.4, 1.0])
    data = _dataset(*qas)
    for na in (None, na_probs):
        out = squad.evaluate(data, preds, na_probs=na, na_prob_thresh=thresh)
        ref = _official_evaluate_v2(data, preds, na, thresh)
        assert list(out) == list(ref)
        assert out == pytest.approx(ref, abs=1e-12)


# --------------------------------------------------------------------------------------------
# best_threshold
# --------------------------------------------------------------------------------------------


def test_best_threshold_uses_best_non_null_answer_from_nbest():
    na = {"q1": 0.55, "q2": 0.6, "q3": 0.3, "q4": 0.9, "q5": 0.5}

    def nbest(text):  # the null entry ranks first; the search must look past it
        return [{"text": "", "probability": 0.6, "start_logit": 1.0, "end_logit": 1.0},
                {"text": text, "probability": 0.4, "start_logit": 0.5, "end_logit": 0.5}]

    # q2, q3: no non-null candidate -> "" (q3's is right, q2's is not).
    lists = {k: nbest(v) if v else nbest("")[:1] for k, v in V2_PREDS.items()}
    out = squad.best_threshold(V2, lists, na)
    assert out["best_f1_thresh"] == 0.55 and out["best_exact_thresh"] == 0.5
    assert out["best_f1"] == pytest.approx(100 * (11 / 3) / 5)
    assert out["f1"] == pytest.approx(out["best_f1"])  # metrics are those at best_f1_thresh
    assert out["NoAns_total"] == 2
    assert squad.best_threshold(V2, V2_PREDS, na) == out  # plain texts work the same


# --------------------------------------------------------------------------------------------
# postprocess
# --------------------------------------------------------------------------------------------


def _word_spans(context):
    return [(m.start(), m.end()) for m in re.finditer(r"\S+", context)]


def _window(context_spans, words, length, example_index=0, max_context=None):
    """[CLS] Q [SEP] <words> [SEP] <pad>: offsets (-1, -1) outside the context."""
    offsets = np.full((length, 2), -1, np.int64)
    is_max = np.zeros(length, bool)
    for pos, w in enumerate(words, start=3):
        offsets[pos] = context_spans[w]
        is_max[pos] = True if max_context is None else max_context[w]
    return squad.SquadFeature(example_index, offsets, is_max)


def test_max_context_window_decides_where_a_span_may_start():
    context = "Zero  one, two three-four  five. six"
    spans = _word_spans(context)  # six words
    # Window A holds words 0-3, B holds words 2-5 (positions 3..6). BERT's max-context score
    # min(left, right) + 0.01 * n: word 2 -> A (1 vs 0), word 3 -> B (1 vs 0).
    a = _window(spans, [0, 1, 2, 3], 8, max_context={0: 1, 1: 1, 2: 1, 3: 0})
    b = _window(spans, [2, 3, 4, 5], 8, max_context={2: 0, 3: 1, 4: 1, 5: 1})
    start, end = np.zeros((2, 8)), np.zeros((2, 8))
    start[0, 6] = end[0, 6] = 10.0  # A: word 3 alone, 20 -- but A is not word 3's window
    start[1, 4], end[1, 5] = 5.0, 5.0  # B: words 3..4, 10
    example = squad.SquadExample("e0", context, "q?")
    preds, nbest, null_odds = squad.postprocess([example], [a, b], start, end, n_best_size=4)
    assert preds == {"e0": "three-four  five."}
    assert preds["e0"] == context[spans[3][0]:spans[4][1]]
    assert nbest["e0"][0]["start_logit"] == 5.0 and nbest["e0"][0]["end_logit"] == 5.0
    texts = [e["text"] for e in nbest["e0"]]
    assert len(texts) == len(set(texts))  # spans both windows propose appear once
    assert null_odds == {}
    # Giving A word 3's max context lets its higher-scoring span win.
    a_max = _window(spans, [0, 1, 2, 3], 8)
    preds, _, _ = squad.postprocess([example], [a_max, b], start, end, n_best_size=4)
    assert preds == {"e0": "three-four"}


def test_equal_texts_merge_into_one_nbest_entry():
    context = "Paris is in France and Paris is big"
    spans = _word_spans(context)
    feature = _window(spans, list(range(8)), 12)  # words at positions 3..10
    start, end = np.zeros((1, 12)), np.zeros((1, 12))
    start[0, [3, 8, 6]] = [2.0, 3.0, 1.0]  # "Paris" (word 0), "Paris" (word 5), "France"
    end[0, [3, 8, 6]] = [2.0, 3.0, 1.0]
    example = squad.SquadExample("e0", context, "q?")
    _, nbest, _ = squad.postprocess([example], [feature], start, end, n_best_size=3,
                                    max_answer_length=1)
    # Candidates by score: Paris@5 (6), Paris@0 (4), France (2): the second "Paris" is dropped.
    assert [(e["text"], e["start_logit"]) for e in nbest["e0"]] == [("Paris", 3.0), ("France", 1.0)]
    p = 1 / (1 + math.exp(-4.0))  # softmax([6, 2])
    np.testing.assert_allclose([e["probability"] for e in nbest["e0"]], [p, 1 - p], rtol=1e-12)


def _single_window():
    context = "alpha beta  gamma delta"
    spans = _word_spans(context)
    feature = _window(spans, [0, 1, 2, 3], 8)  # context words at positions 3..6, [SEP] at 7
    start = np.array([[0, 9, 0, 1, 2, 8, 0, 0]], np.float32)
    end = np.array([[0, 0, 0, 7, 1, 0, 3, 9]], np.float32)
    return squad.SquadExample("e0", context, "q?"), feature, start, end


def test_invalid_spans_and_max_answer_length_are_filtered():
    example, feature, start, end = _single_window()
    # Top-3 starts: 1 (question), 5, 4; top-3 ends: 7 ([SEP]), 3, 6. Every pair with start 1 or
    # end 7 leaves the context, end 3 < both starts; left: (5, 6) = 8 + 3, (4, 6) = 2 + 3 (3 long).
    preds, nbest, _ = squad.postprocess([example], [feature], start, end, n_best_size=3,
                                        max_answer_length=3)
    assert preds == {"e0": "gamma delta"}
    assert [e["text"] for e in nbest["e0"]] == ["gamma delta", "beta  gamma delta"]
    p = 1 / (1 + math.exp(-6.0))  # softmax([11, 5])
    np.testing.assert_allclose([e["probability"] for e in nbest["e0"]], [p, 1 - p], rtol=1e-12)
    _, nbest, _ = squad.postprocess([example], [feature], start, end, n_best_size=3,
                                    max_answer_length=2)
    assert nbest["e0"] == [{"text": "gamma delta", "probability": 1.0, "start_logit": 8.0,
                            "end_logit": 3.0}]


def test_features_as_stacked_arrays_match_per_window_objects():
    example, feature, start, end = _single_window()
    stacked = {"example_index": np.array([0]), "offsets": feature.offsets[None],
               "token_is_max_context": feature.token_is_max_context[None]}
    as_dicts = [{"example_index": 0, "offsets": feature.offsets,
                 "token_is_max_context": feature.token_is_max_context}]
    example_dict = {"id": "e0", "context": example.context}
    ref = squad.postprocess([example], [feature], start, end, n_best_size=3)
    assert squad.postprocess([example], stacked, start, end, n_best_size=3) == ref
    assert squad.postprocess([example_dict], as_dicts, start, end, n_best_size=3) == ref


def _two_window_v2():
    context = "one two three four"
    spans = _word_spans(context)
    a = _window(spans, [0, 1, 2], 7, max_context={0: 1, 1: 1, 2: 0})
    b = _window(spans, [1, 2, 3], 7, max_context={1: 0, 2: 1, 3: 1})
    start, end = np.zeros((2, 7)), np.zeros((2, 7))
    start[0, 0], end[0, 0] = 1.0, 1.0  # null score of A: 2
    start[1, 0], end[1, 0] = 0.5, 0.5  # null score of B: 1 <- the minimum counts
    start[0, 3], end[0, 4] = 1.0, 2.0  # "one two": 3, the best span
    return squad.SquadExample("e0", context, "q?"), [a, b], start, end


def test_v2_null_score_is_the_minimum_over_windows():
    example, features, start, end = _two_window_v2()
    preds, nbest, null_odds = squad.postprocess([example], features, start, end, n_best_size=3,
                                                version_2=True)
    assert null_odds == {"e0": 1.0 - 3.0}  # with the maximum (2) it would be -1
    assert preds == {"e0": "one two"}
    null = [e for e in nbest["e0"] if e["text"] == ""]
    assert null == [{"text": "", "probability": null[0]["probability"], "start_logit": 0.5,
                     "end_logit": 0.5}]


@pytest.mark.parametrize("threshold, expected", [(-3.0, ""), (-2.0, "one two"), (0.0, "one two")])
def test_v2_threshold_flips_the_answer(threshold, expected):
    example, features, start, end = _two_window_v2()
    preds, _, null_odds = squad.postprocess([example], features, start, end, version_2=True,
                                            null_score_diff_threshold=threshold)
    assert null_odds["e0"] == -2.0
    assert preds == {"e0": expected}  # "" only when null odds exceed the threshold


def test_no_valid_span_predicts_empty():
    example, feature, start, end = _single_window()
    context_only = squad.SquadFeature(0, feature.offsets, np.zeros(8, bool))  # no max context
    preds, nbest, _ = squad.postprocess([example], [context_only], start, end)
    assert preds == {"e0": ""}
    assert nbest["e0"] == [{"text": "", "probability": 1.0, "start_logit": 0.0, "end_logit": 0.0}]
    preds, nbest, null_odds = squad.postprocess([example], [context_only], start, end,
                                                version_2=True, null_score_diff_threshold=1e9)
    assert preds == {"e0": ""} and null_odds == {"e0": math.inf}
    assert [e["text"] for e in nbest["e0"]] == [""]


def test_nbest_probabilities_are_a_softmax_that_sums_to_one():
    rng = np.random.default_rng(0)
    context = " ".join(f"w{i}" for i in range(12))
    spans = _word_spans(context)
    features = [_window(spans, list(range(8)), 12, example_index=0),
                _window(spans, list(range(4, 12)), 12, example_index=1)]
    examples = [squad.SquadExample("e0", context, "q?"), squad.SquadExample("e1", context, "q?")]
    start, end = rng.normal(size=(2, 2, 12)) * 3
    for version_2 in (False, True):
        preds, nbest, _ = squad.postprocess(examples, features, start, end, n_best_size=5,
                                            max_answer_length=4, version_2=version_2)
        for entries in nbest.values():
            scores = np.array([e["start_logit"] + e["end_logit"] for e in entries])
            probs = np.array([e["probability"] for e in entries])
            ref = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
            np.testing.assert_allclose(probs, ref, rtol=1e-12)
            assert probs.sum() == pytest.approx(1.0, abs=1e-12)
            assert np.all(np.diff(scores[:5]) <= 0)  # best first
            assert len(entries) <= 5 + version_2
            for e in entries:
                assert e["text"] == "" or e["text"] in context
                assert len(e["text"].split()) <= 4
        assert preds["e1"] in context


def _bert_write_predictions(examples, features, start, end, n_best, max_len, v2, threshold):
    """run_squad.py's write_predictions loop, transcribed (text from offsets; no "empty" nonce)."""
    predictions, all_nbest, odds = {}, {}, {}
    for e_idx, example in enumerate(examples):
        prelim = []  # (feature, start, end, start logit, end logit)
        score_null, null = 1e6, None
        for f_idx, feat in enumerate(features):
            if feat.example_index != e_idx:
                continue
            s_logits, e_logits = [float(x) for x in start[f_idx]], [float(x) for x in end[f_idx]]
            best_s = [i for i, _ in sorted(enumerate(s_logits), key=lambda x: x[1],
                                           reverse=True)][:n_best]
            best_e = [i for i, _ in sorted(enumerate(e_logits), key=lambda x: x[1],
                                           reverse=True)][:n_best]
            if v2 and s_logits[0] + e_logits[0] < score_null:
                score_null, null = s_logits[0] + e_logits[0], (f_idx, s_logits[0], e_logits[0])
            for si in best_s:
                for ei in best_e:
                    if feat.offsets[si][0] < 0 or feat.offsets[ei][0] < 0:
                        continue
                    if not feat.token_is_max_context[si] or ei < si or ei - si + 1 > max_len:
                        continue
                    prelim.append((f_idx, si, ei, s_logits[si], e_logits[ei]))
        if v2:
            prelim.append((null[0], 0, 0, null[1], null[2]))
        prelim = sorted(prelim, key=lambda x: x[3] + x[4], reverse=True)
        seen, nbest = set(), []
        for f_idx, si, ei, sl, el in prelim:
            if len(nbest) >= n_best:
                break
            if si > 0:
                offsets = features[f_idx].offsets
                text = example.context[offsets[si][0]:offsets[ei][1]]
                if text in seen:
                    continue
            else:
                text = ""
            seen.add(text)
            nbest.append((text, sl, el))
        if v2 and "" not in seen:
            nbest.append(("", null[1], null[2]))
        if not nbest:
            nbest.append(("", 0.0, 0.0))
        totals = [sl + el for _, sl, el in nbest]
        exps = [math.exp(t - max(totals)) for t in totals]
        all_nbest[example.id] = [{"text": t, "probability": x / sum(exps), "start_logit": sl,
                                  "end_logit": el} for (t, sl, el), x in zip(nbest, exps)]
        best = next((n for n in nbest if n[0]), None)
        if not v2:
            predictions[example.id] = nbest[0][0]
            continue
        odds[example.id] = score_null - best[1] - best[2] if best else math.inf
        predictions[example.id] = "" if odds[example.id] > threshold else best[0]
    return predictions, all_nbest, odds


@pytest.mark.parametrize("version_2", [False, True])
def test_postprocess_matches_bert_loop_on_random_windows(version_2):
    rng = np.random.default_rng(int(version_2))
    context = " ".join(f"w{i % 3}" for i in range(20))  # repeated words: equal texts to merge
    spans = _word_spans(context)
    examples, features = [], []
    for e in range(6):  # three overlapping windows of 8 words each, random max-context flags
        examples.append(squad.SquadExample(f"e{e}", context, "q?"))
        for first in (0, 6, 12):
            flags = dict(enumerate(rng.random(20) < 0.7))
            features.append(_window(spans, list(range(first, first + 8)), 13, e, flags))
    # Small integer logits: many ties, so tie-breaking order is checked too.
    start = rng.integers(-3, 4, size=(len(features), 13)).astype(np.float32)
    end = rng.integers(-3, 4, size=(len(features), 13)).astype(np.float32)
    start[:9, 0] += 12  # the first three examples lean to "no answer"
    got = squad.postprocess(examples, features, start, end, n_best_size=4, max_answer_length=3,
                            version_2=version_2, null_score_diff_threshold=-1.0)
    ref = _bert_write_predictions(examples, features, start, end, 4, 3, version_2, -1.0)
    assert got[0] == ref[0]
    assert got[2] == ref[2]
    for qid, entries in ref[1].items():
        assert [e["text"] for e in got[1][qid]] == [e["text"] for e in entries]
        for g, r in zip(got[1][qid], entries):
            # Texts compare exactly; only the floats get a tolerance (pytest.approx on a mapping
            # holding strings is a TypeError from pytest 9.2 on).
            assert g.keys() == r.keys() and g["text"] == r["text"]
            numbers = [k for k in r if k != "text"]
            assert [g[k] for k in numbers] == pytest.approx([r[k] for k in numbers], rel=1e-12)
    if version_2:
        assert "" in got[0].values() and set(got[0].values()) != {""}  # both outcomes occur


def test_best_f1_thresh_as_null_score_diff_threshold_reproduces_best_f1():
    rng = np.random.default_rng(3)
    context = " ".join(f"w{i}" for i in range(10))
    spans = _word_spans(context)
    examples = [squad.SquadExample(f"e{e}", context, "q?") for e in range(12)]
    features = [_window(spans, list(range(10)), 14, e) for e in range(12)]
    start, end = rng.normal(size=(2, 12, 14))
    data = _dataset(*[_qa(f"e{e}", [] if e % 3 == 0 else [f"w{e % 10} w{(e + 1) % 10}"],
                          impossible=e % 3 == 0) for e in range(12)])
    _, nbest, null_odds = squad.postprocess(examples, features, start, end, version_2=True)
    best = squad.best_threshold(data, nbest, null_odds)
    preds, _, _ = squad.postprocess(examples, features, start, end, version_2=True,
                                    null_score_diff_threshold=best["best_f1_thresh"])
    scored = squad.evaluate(data, preds)
    assert scored["f1"] == pytest.approx(best["f1"], abs=1e-12)
    assert scored["exact"] == pytest.approx(best["exact"], abs=1e-12)
    assert best["f1"] == pytest.approx(best["best_f1"])  # distinct odds: no ties to split


def test_postprocess_argument_errors():
    example, feature, start, end = _single_window()
    with pytest.raises(ValueError, match="start_logits"):
        squad.postprocess([example], [feature], start[:, :5], end)
    with pytest.raises(ValueError, match="example_index"):
        squad.postprocess([example], [squad.SquadFeature(3, feature.offsets,
                                                         feature.token_is_max_context)],
                          start, end)
    with pytest.raises(ValueError, match="no window"):
        squad.postprocess([example, example], [feature], start, end)
    with pytest.raises(ValueError, match="n_best_size"):
        squad.postprocess([example], [feature], start, end, n_best_size=0)


# --------------------------------------------------------------------------------------------
# writers
# --------------------------------------------------------------------------------------------


def test_writers_round_trip_in_the_official_format(tmp_path):
    example, features, start, end = _two_window_v2()
    preds, nbest, null_odds = squad.postprocess([example], features, start, end, version_2=True)
    out_dir = tmp_path / "out"
    paths = squad.write_predictions(out_dir, preds, nbest, {**null_odds, "e1": math.inf})
    assert sorted(os.listdir(out_dir)) == ["nbest_predictions.json", "null_odds.json",
                                           "predictions.json"]  # no temp files left
    with open(paths["predictions"]) as f:
        assert json.load(f) == preds
    with open(paths["nbest"]) as f:
        assert json.load(f) == nbest
    with open(paths["null_odds"]) as f:
        assert json.load(f) == {"e0": -2.0, "e1": math.inf}
    assert (out_dir / "predictions.json").read_text() == json.dumps(preds, indent=4) + "\n"
    # v1: no null odds, no null_odds.json.
    assert set(squad.write_predictions(tmp_path / "v1", preds, nbest, {})) == {"predictions",
                                                                                "nbest"}


def test_failed_write_leaves_the_previous_file_whole(tmp_path):
    squad.write_predictions(tmp_path, {"e0": "old"})
    with pytest.raises(TypeError):
        squad.write_predictions(tmp_path, {"e0": {"not", "json"}})
    assert json.loads((tmp_path / "predictions.json").read_text()) == {"e0": "old"}
    assert os.listdir(tmp_path) == ["predictions.json"]
