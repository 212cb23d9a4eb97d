"""SQuAD post-processing (logits of overlapping windows -> answers, n-best lists, null odds) and
the prediction writers: hand-worked windows and a transcription of google-research/bert's
write_predictions loop."""

import json
import math
import os
import re

import numpy as np
import pytest

from tests.eval import squad_cases as cases
from zoo.eval import squad_metrics
from zoo.eval.squad_postprocess import SquadExample, SquadFeature, postprocess, write_predictions


def _word_spans(context):
    return [(m.start(), m.end()) for m in re.finditer(r"\S+", context)]


def _window(context_spans, words, length, example_index=0, max_context=None):
    """[CLS] Q [SEP] <words> [SEP] <pad>: offsets (-1, -1) outside the context."""
    offsets = np.full((length, 2), -1, np.int64)
    is_max = np.zeros(length, bool)
    for pos, w in enumerate(words, start=3):
        offsets[pos] = context_spans[w]
        is_max[pos] = True if max_context is None else max_context[w]
    return SquadFeature(example_index, offsets, is_max)


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
    example = SquadExample("e0", context, "q?")
    preds, nbest, null_odds = postprocess([example], [a, b], start, end, n_best_size=4)
    assert preds == {"e0": "three-four  five."}
    assert preds["e0"] == context[spans[3][0]:spans[4][1]]
    assert nbest["e0"][0]["start_logit"] == 5.0 and nbest["e0"][0]["end_logit"] == 5.0
    texts = [e["text"] for e in nbest["e0"]]
    assert len(texts) == len(set(texts))  # spans both windows propose appear once
    assert null_odds == {}
    # Giving A word 3's max context lets its higher-scoring span win.
    a_max = _window(spans, [0, 1, 2, 3], 8)
    preds, _, _ = postprocess([example], [a_max, b], start, end, n_best_size=4)
    assert preds == {"e0": "three-four"}


def test_equal_texts_merge_into_one_nbest_entry():
    context = "Paris is in France and Paris is big"
    spans = _word_spans(context)
    feature = _window(spans, list(range(8)), 12)  # words at positions 3..10
    start, end = np.zeros((1, 12)), np.zeros((1, 12))
    start[0, [3, 8, 6]] = [2.0, 3.0, 1.0]  # "Paris" (word 0), "Paris" (word 5), "France"
    end[0, [3, 8, 6]] = [2.0, 3.0, 1.0]
    example = SquadExample("e0", context, "q?")
    _, nbest, _ = postprocess([example], [feature], start, end, n_best_size=3,
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
    return SquadExample("e0", context, "q?"), feature, start, end


def test_invalid_spans_and_max_answer_length_are_filtered():
    example, feature, start, end = _single_window()
    # Top-3 starts: 1 (question), 5, 4; top-3 ends: 7 ([SEP]), 3, 6. Every pair with start 1 or
    # end 7 leaves the context, end 3 < both starts; left: (5, 6) = 8 + 3, (4, 6) = 2 + 3 (3 long).
    preds, nbest, _ = postprocess([example], [feature], start, end, n_best_size=3,
                                        max_answer_length=3)
    assert preds == {"e0": "gamma delta"}
    assert [e["text"] for e in nbest["e0"]] == ["gamma delta", "beta  gamma delta"]
    p = 1 / (1 + math.exp(-6.0))  # softmax([11, 5])
    np.testing.assert_allclose([e["probability"] for e in nbest["e0"]], [p, 1 - p], rtol=1e-12)
    _, nbest, _ = postprocess([example], [feature], start, end, n_best_size=3,
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
    ref = postprocess([example], [feature], start, end, n_best_size=3)
    assert postprocess([example], stacked, start, end, n_best_size=3) == ref
    assert postprocess([example_dict], as_dicts, start, end, n_best_size=3) == ref


def _two_window_v2():
    context = "one two three four"
    spans = _word_spans(context)
    a = _window(spans, [0, 1, 2], 7, max_context={0: 1, 1: 1, 2: 0})
    b = _window(spans, [1, 2, 3], 7, max_context={1: 0, 2: 1, 3: 1})
    start, end = np.zeros((2, 7)), np.zeros((2, 7))
    start[0, 0], end[0, 0] = 1.0, 1.0  # null score of A: 2
    start[1, 0], end[1, 0] = 0.5, 0.5  # null score of B: 1 <- the minimum counts
    start[0, 3], end[0, 4] = 1.0, 2.0  # "one two": 3, the best span
    return SquadExample("e0", context, "q?"), [a, b], start, end


def test_v2_null_score_is_the_minimum_over_windows():
    example, features, start, end = _two_window_v2()
    preds, nbest, null_odds = postprocess([example], features, start, end, n_best_size=3,
                                                version_2=True)
    assert null_odds == {"e0": 1.0 - 3.0}  # with the maximum (2) it would be -1
    assert preds == {"e0": "one two"}
    null = [e for e in nbest["e0"] if e["text"] == ""]
    assert null == [{"text": "", "probability": null[0]["probability"], "start_logit": 0.5,
                     "end_logit": 0.5}]


@pytest.mark.parametrize("threshold, expected", [(-3.0, ""), (-2.0, "one two"), (0.0, "one two")])
def test_v2_threshold_flips_the_answer(threshold, expected):
    example, features, start, end = _two_window_v2()
    preds, _, null_odds = postprocess([example], features, start, end, version_2=True,
                                            null_score_diff_threshold=threshold)
    assert null_odds["e0"] == -2.0
    assert preds == {"e0": expected}  # "" only when null odds exceed the threshold


def test_no_valid_span_predicts_empty():
    example, feature, start, end = _single_window()
    context_only = SquadFeature(0, feature.offsets, np.zeros(8, bool))  # no max context
    preds, nbest, _ = postprocess([example], [context_only], start, end)
    assert preds == {"e0": ""}
    assert nbest["e0"] == [{"text": "", "probability": 1.0, "start_logit": 0.0, "end_logit": 0.0}]
    preds, nbest, null_odds = postprocess([example], [context_only], start, end,
                                                version_2=True, null_score_diff_threshold=1e9)
    assert preds == {"e0": ""} and null_odds == {"e0": math.inf}
    assert [e["text"] for e in nbest["e0"]] == [""]


def test_nbest_probabilities_are_a_softmax_that_sums_to_one():
    rng = np.random.default_rng(0)
    context = " ".join(f"w{i}" for i in range(12))
    spans = _word_spans(context)
    features = [_window(spans, list(range(8)), 12, example_index=0),
                _window(spans, list(range(4, 12)), 12, example_index=1)]
    examples = [SquadExample("e0", context, "q?"), SquadExample("e1", context, "q?")]
    start, end = rng.normal(size=(2, 2, 12)) * 3
    for version_2 in (False, True):
        preds, nbest, _ = postprocess(examples, features, start, end, n_best_size=5,
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
        examples.append(SquadExample(f"e{e}", context, "q?"))
        for first in (0, 6, 12):
            flags = dict(enumerate(rng.random(20) < 0.7))
            features.append(_window(spans, list(range(first, first + 8)), 13, e, flags))
    # Small integer logits: many ties, so tie-breaking order is checked too.
    start = rng.integers(-3, 4, size=(len(features), 13)).astype(np.float32)
    end = rng.integers(-3, 4, size=(len(features), 13)).astype(np.float32)
    start[:9, 0] += 12  # the first three examples lean to "no answer"
    got = postprocess(examples, features, start, end, n_best_size=4, max_answer_length=3,
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
    examples = [SquadExample(f"e{e}", context, "q?") for e in range(12)]
    features = [_window(spans, list(range(10)), 14, e) for e in range(12)]
    start, end = rng.normal(size=(2, 12, 14))
    data = cases.dataset(*[cases.qa(f"e{e}", [] if e % 3 == 0 else [f"w{e % 10} w{(e + 1) % 10}"],
                          impossible=e % 3 == 0) for e in range(12)])
    _, nbest, null_odds = postprocess(examples, features, start, end, version_2=True)
    best = squad_metrics.best_threshold(data, nbest, null_odds)
    preds, _, _ = postprocess(examples, features, start, end, version_2=True,
                                    null_score_diff_threshold=best["best_f1_thresh"])
    scored = squad_metrics.evaluate(data, preds)
    assert scored["f1"] == pytest.approx(best["f1"], abs=1e-12)
    assert scored["exact"] == pytest.approx(best["exact"], abs=1e-12)
    assert best["f1"] == pytest.approx(best["best_f1"])  # distinct odds: no ties to split


def test_postprocess_argument_errors():
    example, feature, start, end = _single_window()
    with pytest.raises(ValueError, match="start_logits"):
        postprocess([example], [feature], start[:, :5], end)
    with pytest.raises(ValueError, match="example_index"):
        postprocess([example], [SquadFeature(3, feature.offsets,
                                                         feature.token_is_max_context)],
                          start, end)
    with pytest.raises(ValueError, match="no window"):
        postprocess([example, example], [feature], start, end)
    with pytest.raises(ValueError, match="n_best_size"):
        postprocess([example], [feature], start, end, n_best_size=0)


# --------------------------------------------------------------------------------------------
# writers
# --------------------------------------------------------------------------------------------


def test_writers_round_trip_in_the_official_format(tmp_path):
    example, features, start, end = _two_window_v2()
    preds, nbest, null_odds = postprocess([example], features, start, end, version_2=True)
    out_dir = tmp_path / "out"
    paths = write_predictions(out_dir, preds, nbest, {**null_odds, "e1": math.inf})
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
    assert set(write_predictions(tmp_path / "v1", preds, nbest, {})) == {"predictions",
                                                                                "nbest"}


def test_failed_write_leaves_the_previous_file_whole(tmp_path):
    write_predictions(tmp_path, {"e0": "old"})
    with pytest.raises(TypeError):
        write_predictions(tmp_path, {"e0": {"not", "json"}})
    assert json.loads((tmp_path / "predictions.json").read_text()) == {"e0": "old"}
    assert os.listdir(tmp_path) == ["predictions.json"]
