"""The SQuAD metric: hand-worked cases and an independent transcription of the official
evaluate-v1.1.py / evaluate-v2.0.py algorithms (post-processing and the prediction writers:
test_squad_postprocess.py)."""

import collections
import json
import random
import re
import string

import pytest

from tests.eval import squad_cases as cases
from zoo.eval import squad_metrics


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
    assert squad_metrics.normalize_answer(text) == expected


def test_exact_score_after_normalisation():
    assert squad_metrics.exact_score("The Denver Broncos!", "denver  broncos") == 1
    assert squad_metrics.exact_score("Denver Broncos", "Broncos") == 0


@pytest.mark.parametrize("version", ["1.1", "2.0"])
def test_f1_partial_overlap_by_hand(version):
    # gold {cat, sat, on, mat}, pred {cat, on, mat}: P = 3/3, R = 3/4 -> F1 = 2*0.75/1.75 = 6/7.
    f1 = squad_metrics.f1_score("the cat sat on the mat", "Cat on a mat.", version)
    assert f1 == pytest.approx(6 / 7)
    # Multiset overlap: gold x y y z, pred y y y -> 2 shared y's, P = 2/3, R = 2/4 -> F1 = 4/7.
    assert squad_metrics.f1_score("x y y z", "y y y", version) == pytest.approx(4 / 7)
    assert squad_metrics.f1_score("x y", "z", version) == 0.0
    assert squad_metrics.f1_score("Broncos", "the broncos", version) == 1.0


def test_f1_empty_answers_differ_between_versions():
    # Both sides normalise to nothing: v1.1's overlap count is 0 -> F1 0; v2.0: both "no answer".
    assert squad_metrics.f1_score("The", "a", "1.1") == 0.0
    assert squad_metrics.f1_score("The", "a", "2.0") == 1.0
    assert squad_metrics.f1_score("", "", "2.0") == 1.0
    # text against an unanswerable question
    assert squad_metrics.f1_score("", "Paris", "2.0") == 0.0
    assert squad_metrics.f1_score("Paris", "", "2.0") == 0.0
    assert squad_metrics.f1_score("Paris", "", "1.1") == 0.0


# --------------------------------------------------------------------------------------------
# evaluate: v1.1
# --------------------------------------------------------------------------------------------

V1 = cases.dataset(
    cases.qa("q1", ["Denver Broncos", "Broncos", "the Denver Broncos team"]),
    cases.qa("q2", ["the cat sat on the mat"]),
    cases.qa("q3", ["x y y z"]),
    cases.qa("q4", ["Paris"]),
)


def test_max_over_gold_answers():
    # "Denver" vs golds: 2/3 ("denver broncos": P 1, R 1/2), 0, 1/2 ("denver broncos team").
    one = cases.dataset(V1[0]["paragraphs"][0]["qas"][0])
    out = squad_metrics.evaluate(one, {"q1": "Denver"})
    assert out["exact_match"] == 0.0
    assert out["f1"] == pytest.approx(100 * 2 / 3)
    out = squad_metrics.evaluate(one, {"q1": "broncos"})
    assert out["exact_match"] == 100.0 and out["f1"] == 100.0


def test_v1_missing_prediction_scores_zero_and_counts(caplog):
    preds = {"q1": "broncos", "q2": "Cat on a mat.", "q3": "y y y"}  # q4 missing
    with caplog.at_level("WARNING"):
        out = squad_metrics.evaluate(V1, preds)
    # EM: q1 only -> 1/4. F1: (1 + 6/7 + 4/7 + 0) / 4 = 17/28.
    assert out == pytest.approx({"exact_match": 25.0, "f1": 100 * 17 / 28, "exact": 25.0,
                                 "total": 4})
    assert "q4" in caplog.text
    complete = squad_metrics.evaluate(V1, {**preds, "q4": "paris"})
    assert complete["exact_match"] == 50.0 and complete["f1"] == pytest.approx(100 * 24 / 28)


def test_dataset_given_as_path_object_or_list(tmp_path):
    path = tmp_path / "dev-v1.1.json"
    path.write_text(json.dumps({"version": "1.1", "data": V1}))
    preds = {"q1": "Denver", "q2": "mat", "q3": "z", "q4": "paris"}
    from_list = squad_metrics.evaluate(V1, preds)
    assert squad_metrics.evaluate(str(path), preds) == from_list
    assert squad_metrics.evaluate(path, preds) == from_list
    assert squad_metrics.evaluate({"version": "1.1", "data": V1}, preds) == from_list


def test_na_probs_rejected_for_v1():
    with pytest.raises(ValueError, match="na_probs"):
        squad_metrics.evaluate(V1, {"q1": "x"}, na_probs={"q1": 0.5})


# --------------------------------------------------------------------------------------------
# evaluate: v2.0
# --------------------------------------------------------------------------------------------

V2 = cases.dataset(
    cases.qa("q1", ["Broncos"]),
    cases.qa("q2", ["cat"]),
    cases.qa("q3", [], impossible=True),
    cases.qa("q4", [], impossible=True),
    cases.qa("q5", ["Paris"]),
)
V2_PREDS = {"q1": "Denver Broncos", "q2": "", "q3": "", "q4": "something", "q5": "paris"}
# Raw (EM, F1): q1 (0, 2/3: P 1/2, R 1), q2 (0, 0), q3 (1, 1), q4 (0, 0), q5 (1, 1).


def test_v2_breakdown_by_hand():
    out = squad_metrics.evaluate(V2, V2_PREDS)
    assert list(out) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
                         "NoAns_exact", "NoAns_f1", "NoAns_total"]
    assert out == pytest.approx({
        "exact": 100 * 2 / 5, "f1": 100 * (2 / 3 + 2) / 5, "total": 5,
        "HasAns_exact": 100 / 3, "HasAns_f1": 100 * (5 / 3) / 3, "HasAns_total": 3,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2})


def test_v2_na_prob_threshold_turns_answers_into_no_answer():
    na = {"q1": 0.9, "q2": 0.2, "q3": 0.8, "q4": 0.7, "q5": 0.4}
    out = squad_metrics.evaluate(V2, V2_PREDS, na_probs=na, na_prob_thresh=0.5)
    # Above 0.5 -> scored as "" : q1 (answerable) 0, q3 and q4 (unanswerable) 1. q2 0, q5 1 raw.
    assert out["exact"] == pytest.approx(100 * 3 / 5)
    assert out["f1"] == pytest.approx(100 * 3 / 5)
    assert out["HasAns_f1"] == pytest.approx(100 / 3)
    assert out["NoAns_exact"] == 100.0


def test_v2_best_thresholds_by_hand():
    na = {"q1": 0.55, "q2": 0.6, "q3": 0.3, "q4": 0.9, "q5": 0.5}
    out = squad_metrics.evaluate(V2, V2_PREDS, na_probs=na)
    # Start at 2 (every unanswerable right when nothing is answered); answer in rising na order:
    #   q3 (+0, "" stays right), q5 (+1 -> 3), q1 (EM +0 | F1 +2/3 -> 11/3), q2 (+0), q4 (-1).
    assert out["best_exact"] == pytest.approx(100 * 3 / 5)
    assert out["best_exact_thresh"] == 0.5
    assert out["best_f1"] == pytest.approx(100 * (11 / 3) / 5)
    assert out["best_f1_thresh"] == 0.55
    # The best F1 is what the threshold gives when applied.
    at_best = squad_metrics.evaluate(V2, V2_PREDS, na_probs=na, na_prob_thresh=0.55)
    assert at_best["f1"] == pytest.approx(out["best_f1"])


def test_v2_best_thresh_is_zero_when_answering_nothing_wins():
    data = cases.dataset(cases.qa("q1", ["a b"]), cases.qa("q2", [], impossible=True))
    out = squad_metrics.evaluate(data, {"q1": "wrong", "q2": "also wrong"},
                         na_probs={"q1": 0.3, "q2": 0.7})
    assert out["best_f1"] == 50.0 and out["best_f1_thresh"] == 0.0


def test_v2_gold_that_normalises_to_nothing_means_no_answer():
    data = cases.dataset(cases.qa("q1", ["The"]), cases.qa("q2", [], impossible=True))
    out = squad_metrics.evaluate(data, {"q1": "", "q2": ""})
    assert out["exact"] == 100.0 and out["f1"] == 100.0
    assert out["HasAns_total"] == 1  # still counted as answerable: it has an answer entry


def test_v2_missing_prediction_is_an_error():
    with pytest.raises(ValueError, match=r"predictions: 1 of 5 .*'q4'"):
        squad_metrics.evaluate(V2, {k: v for k, v in V2_PREDS.items() if k != "q4"})
    with pytest.raises(ValueError, match="na_probs"):
        squad_metrics.evaluate(V2, V2_PREDS, na_probs={"q1": 0.0})


def test_version_detection_and_override():
    answerable = cases.dataset(cases.qa("q1", ["The"]))
    # v1.1 (no is_impossible): "" vs "The" -> EM 1 (both normalise to ""), F1 0 (no overlap).
    assert squad_metrics.evaluate(answerable, {"q1": ""}) == {"exact_match": 100.0, "f1": 0.0,
                                                     "exact": 100.0, "total": 1}
    forced = squad_metrics.evaluate(answerable, {"q1": ""}, version="2.0")
    assert forced["exact"] == 100.0 and forced["f1"] == 100.0
    with pytest.raises(ValueError, match="version"):
        squad_metrics.evaluate(answerable, {"q1": ""}, version="3")


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
    qas = [cases.qa(f"q{i}", [_phrase(rng, 1, 4) for _ in range(rng.randint(1, 3))])
           for i in range(40)]
    preds = {qa["id"]: _phrase(rng, 0, 4) for qa in qas if rng.random() > 0.1}
    data = cases.dataset(*qas)
    out = squad_metrics.evaluate(data, preds)
    ref = _official_evaluate_v1(data, preds)
    assert out["exact_match"] == pytest.approx(ref["exact_match"], abs=1e-12)
    assert out["f1"] == pytest.approx(ref["f1"], abs=1e-12)
    assert 0 < out["f1"] < 100  # the random cases are neither all right nor all wrong


@pytest.mark.parametrize("seed", range(4))
def test_matches_official_v2_on_random_predictions(seed):
    rng = random.Random(seed)
    qas = [cases.qa(f"q{i}", [] if i % 3 == 0 else
               [_phrase(rng, 1, 3) for _ in range(rng.randint(1, 3))], impossible=i % 3 == 0)
           for i in range(45)]
    preds = {qa["id"]: _phrase(rng, 0, 3) if rng.random() > 0.3 else "" for qa in qas}
    na_probs = {qa["id"]: rng.choice([0.1, 0.2, 0.3, 0.5, 0.8]) for qa in qas}  # with ties
    thresh = rng.choice([0.15, 0.4, 1.0])
    data = cases.dataset(*qas)
    for na in (None, na_probs):
        out = squad_metrics.evaluate(data, preds, na_probs=na, na_prob_thresh=thresh)
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
    out = squad_metrics.best_threshold(V2, lists, na)
    assert out["best_f1_thresh"] == 0.55 and out["best_exact_thresh"] == 0.5
    assert out["best_f1"] == pytest.approx(100 * (11 / 3) / 5)
    assert out["f1"] == pytest.approx(out["best_f1"])  # metrics are those at best_f1_thresh
    assert out["NoAns_total"] == 2
    assert squad_metrics.best_threshold(V2, V2_PREDS, na) == out  # plain texts work the same
