"""SQuAD: the synthetic generator, loading (JSON and TFDS, with every bad-input path) and BERT's
windowed featurization with both tokenizers."""

import collections
import copy
import json
import logging
import os
import re

import numpy as np
import pytest

from zoo.data.readers import squad
from zoo.data.synthetic import squad as synthetic_squad
from zoo.data.synthetic.documents import Document, corpus_splits, generate_documents
from zoo.data.synthetic.world import RELATIONS, Fact, make_world
from zoo.data.tokenizers import base as tokenizers
from zoo.data.tokenizers import wordpiece

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# The consequences the generator must not ask about as unanswerable, restated here: a stated
# (s, r, o) answers (o, r') by the world's rules.
IMPLIED = {"capital": "located_in", "mayor": "lives_in", "founded_by": "works_for",
           "knows": "knows"}


@pytest.fixture(scope="module")
def world():
    return make_world(seed=0, num_entities=60)


@pytest.fixture(scope="module")
def documents(world):
    return generate_documents(world, seed=0)


@pytest.fixture(scope="module")
def v2(world, documents):
    return synthetic_squad.squad_dataset(world, documents, seed=0, version="2.0")


@pytest.fixture(scope="module")
def v2_path(v2, tmp_path_factory):
    path = tmp_path_factory.mktemp("squad") / "synthetic-v2.0.json"
    synthetic_squad.write_squad_json(path, v2)
    return str(path)


@pytest.fixture(scope="module")
def examples(v2_path):
    return squad.load_squad(v2_path)


@pytest.fixture(scope="module")
def sentencepiece(documents):
    return tokenizers.train_sentencepiece([s for d in documents for s in d.texts], vocab_size=300)


@pytest.fixture(scope="module")
def wordpiece_tok(documents):
    # Frequent words whole; everything else (the invented names, numbers) from single letters
    # and digits, so answers span several pieces.
    counts = collections.Counter(
        w for d in documents for s in d.texts for w in re.findall(r"[a-z]+", s.lower()))
    chars = "abcdefghijklmnopqrstuvwxyz0123456789"
    vocab = (SPECIALS + list(".,'?") + list(chars) + ["##" + c for c in chars]
             + sorted(w for w, n in counts.items() if n >= 20 and len(w) > 1))
    return wordpiece.WordPieceTokenizer(vocab)


@pytest.fixture(scope="module", params=["sentencepiece", "wordpiece"])
def tokenizer(request, sentencepiece, wordpiece_tok):
    return {"sentencepiece": sentencepiece, "wordpiece": wordpiece_tok}[request.param]


def _questions(dataset):
    """(title, context, qa) for every question of a SQuAD dict."""
    for article in dataset["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                yield article["title"], paragraph["context"], qa


_PARSERS = [
    (re.compile("^" + re.escape(t).replace(re.escape("{s}"), "(?P<s>[A-Z][a-z]+)") + "$"), r)
    for r, templates in synthetic_squad.QUESTION_TEMPLATES.items() for t in templates
]


def _parse(question):
    """(subject, relation) a synthetic question asks about."""
    matches = [(m["s"], r) for pattern, r in _PARSERS if (m := pattern.match(question))]
    assert len(matches) == 1, (question, matches)
    return matches[0]


# --- the synthetic generator -----------------------------------------------------------------


def test_generator_is_deterministic_with_unique_ids(world, documents, v2):
    assert synthetic_squad.squad_dataset(world, documents, seed=0, version="2.0") == v2
    other = synthetic_squad.squad_dataset(world, documents, seed=1, version="2.0")
    assert [qa["question"] for _, _, qa in _questions(other)] != [
        qa["question"] for _, _, qa in _questions(v2)]
    ids = [qa["id"] for _, _, qa in _questions(v2)]
    assert len(ids) == len(set(ids)) > 300
    assert all(re.fullmatch(r"[0-9a-f]{24}", i) for i in ids)
    templates = [t for ts in synthetic_squad.QUESTION_TEMPLATES.values() for t in ts]
    assert len(templates) == len(set(templates))  # a question names its relation
    assert set(synthetic_squad.QUESTION_TEMPLATES) == set(RELATIONS)


def test_answerable_questions_ask_for_stated_facts_at_exact_offsets(world, documents, v2):
    facts = set(world.facts)
    by_text = {d.text: d for d in documents}
    relations_asked = set()
    for title, context, qa in _questions(v2):
        if qa["is_impossible"]:
            continue
        subject, relation = _parse(qa["question"])
        relations_asked.add(relation)
        doc = by_text[context]
        assert doc.subject == title
        # Every statement of (subject, relation) in the paragraph is a gold answer, no other.
        stated = [f for f in doc.facts if (f.subject, f.relation) == (subject, relation)]
        assert sorted(a["text"] for a in qa["answers"]) == sorted(f.object for f in stated)
        for a in qa["answers"]:
            start, text = a["answer_start"], a["text"]
            assert context[start:start + len(text)] == text
            assert Fact(subject, relation, text) in facts
            # A whole word of the context, not a piece of a longer one.
            assert not context[start - 1:start].isalnum()
            assert not context[start + len(text):start + len(text) + 1].isalnum()
    assert relations_asked == set(RELATIONS)


def test_v2_mixes_answerable_and_really_unanswerable_questions(world, documents, v2):
    assert v2["version"] == "v2.0"
    by_text = {d.text: d for d in documents}
    impossible = 0
    total = 0
    with_plausible = 0
    for _, context, qa in _questions(v2):
        total += 1
        assert isinstance(qa["is_impossible"], bool)
        if not qa["is_impossible"]:
            continue
        impossible += 1
        assert qa["answers"] == []
        subject, relation = _parse(qa["question"])
        doc = by_text[context]
        # Not stated, not implied by a stated fact, yet a fact of the world about an entity
        # the paragraph names.
        assert all((f.subject, f.relation) != (subject, relation) for f in doc.facts)
        assert all((f.object, IMPLIED.get(f.relation)) != (subject, relation) for f in doc.facts)
        assert world.objects(subject, relation)
        assert re.search(rf"\b{subject}\b", context)
        for a in qa.get("plausible_answers", []):
            with_plausible += 1
            assert context[a["answer_start"]:a["answer_start"] + len(a["text"])] == a["text"]
    assert 0.2 < impossible / total < 0.4  # about SQuAD 2.0's third
    assert with_plausible > 0


def test_v1_is_answerable_only_in_the_v1_format(world, documents):
    v1 = synthetic_squad.squad_dataset(world, documents[:10], seed=0, version="1.1")
    assert v1["version"] == "1.1"
    qas = [qa for _, _, qa in _questions(v1)]
    assert qas and all(set(qa) == {"id", "question", "answers"} and qa["answers"] for qa in qas)
    with pytest.raises(ValueError, match="version"):
        synthetic_squad.squad_dataset(world, documents, version="v3")


def test_a_fact_stated_twice_has_two_gold_answers(world, documents):
    doc = documents[0]
    twice = Document(doc.subject, doc.sentences + doc.sentences[:1])
    fact = doc.sentences[0].facts[0]
    dataset = synthetic_squad.squad_dataset(world, [twice], seed=0)
    (qa,) = [qa for _, _, qa in _questions(dataset)
             if _parse(qa["question"]) == (fact.subject, fact.relation)]
    starts = sorted(a["answer_start"] for a in qa["answers"])
    first = doc.sentences[0].object_spans[0][0]
    assert starts == [first, len(doc.text) + 1 + first]
    assert {a["text"] for a in qa["answers"]} == {fact.object}


def test_squad_splits_use_disjoint_paragraphs(tmp_path):
    splits = synthetic_squad.squad_splits(seed=1, version="2.0", num_entities=40)
    contexts = {k: {c for _, c, _ in _questions(v)} for k, v in splits.items()}
    ids = {k: {qa["id"] for _, _, qa in _questions(v)} for k, v in splits.items()}
    assert all(contexts.values()) and set(splits) == {"train", "validation", "test"}
    assert not contexts["train"] & contexts["validation"]
    assert not ids["train"] & ids["validation"]
    expected = {d.text for d in corpus_splits(1, 40)["validation"]}
    assert contexts["validation"] == expected


def test_written_json_loads_back_as_examples(v2, v2_path, examples):
    with open(v2_path, encoding="utf-8") as f:
        assert json.load(f) == v2
    expected = [
        {"id": qa["id"], "title": title, "context": context, "question": qa["question"],
         "answers": qa["answers"], "is_impossible": qa["is_impossible"]}
        for title, context, qa in _questions(v2)
    ]
    assert examples == expected


# --- loading: bad input ----------------------------------------------------------------------


def _write(tmp_path, dataset, name="bad.json"):
    path = tmp_path / name
    path.write_text(json.dumps(dataset, indent=1), encoding="utf-8")
    return str(path)


@pytest.fixture
def small(world, documents):
    return synthetic_squad.squad_dataset(world, documents[:4], seed=0, version="2.0")


def test_malformed_json_names_file_line_and_column(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"data": [\n  {"title": "x",, "paragraphs": []}\n]}', encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{path}:2:17: malformed JSON")):
        squad.load_squad(str(path))
    with pytest.raises(FileNotFoundError, match="missing.json"):
        squad.load_squad(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="is a directory; pass one JSON file"):
        squad.load_squad(tmp_path)


@pytest.mark.parametrize("edit, match", [
    (lambda d, qa: qa.pop("question"), r"question '{qid}' .* has no field 'question'"),
    (lambda d, qa: qa["answers"][0].pop("answer_start") if qa["answers"] else qa.pop("answers"),
     r"question '{qid}' .* has no field '(answer_start|answers)'"),
    (lambda d, qa: qa.__setitem__("question", 7), r"field 'question' of question '{qid}'.*str"),
    (lambda d, qa: qa.pop("id"), r"data\[0\]\.paragraphs\[0\]\.qas\[0\] has no field 'id'"),
    (lambda d, qa: d["data"][0]["paragraphs"][0].pop("context"),
     r"data\[0\]\.paragraphs\[0\] \(title '\w+'\) has no field 'context'"),
    (lambda d, qa: d.pop("data"), r"the top level has no field 'data'"),
    (lambda d, qa: qa.update(is_impossible=False, answers=[]),
     r"question '{qid}' .* has no answers but is not marked is_impossible"),
])
def test_missing_or_mistyped_fields_name_field_and_question(tmp_path, small, edit, match):
    dataset = copy.deepcopy(small)
    qa = dataset["data"][0]["paragraphs"][0]["qas"][0]
    qid = qa["id"]
    edit(dataset, qa)
    path = _write(tmp_path, dataset)
    with pytest.raises(ValueError, match=re.escape(path) + ": .*" + match.format(qid=qid)):
        squad.load_squad(path)


def test_misaligned_answers_are_skipped_warned_and_counted(tmp_path, small, caplog):
    dataset = copy.deepcopy(small)
    answerable = [qa for _, _, qa in _questions(dataset) if qa["answers"]]
    for qa in answerable[:2]:
        qa["answers"][0]["answer_start"] += 1
    total = sum(1 for _ in _questions(dataset))
    path = _write(tmp_path, dataset)
    with caplog.at_level(logging.WARNING, logger="zoo.data.readers.squad"):
        loaded = squad.load_squad(path)
    assert len(loaded) == total - 2
    assert {e["id"] for e in loaded}.isdisjoint(qa["id"] for qa in answerable[:2])
    messages = [r.getMessage() for r in caplog.records]
    for qa in answerable[:2]:
        assert any(qa["id"] in m and "could not find answer" in m for m in messages)
    assert messages[-1].startswith(f"{path}: skipped 2 of {total} questions whose answer_start")


def test_empty_context_is_skipped_naming_title_and_question(tmp_path, small, caplog):
    dataset = copy.deepcopy(small)
    article = dataset["data"][1]
    article["paragraphs"][0]["context"] = "  \n"
    skipped = [qa["id"] for qa in article["paragraphs"][0]["qas"]]
    path = _write(tmp_path, dataset)
    with caplog.at_level(logging.WARNING, logger="zoo.data.readers.squad"):
        loaded = squad.load_squad(path)
    assert {e["id"] for e in loaded}.isdisjoint(skipped)
    assert len(loaded) == sum(1 for _ in _questions(dataset)) - len(skipped)
    first = caplog.records[0].getMessage()
    assert skipped[0] in first and repr(article["title"]) in first and "empty context" in first
    assert f"skipped {len(skipped)} of" in caplog.records[-1].getMessage()


def test_duplicate_ids_are_an_error(tmp_path, small):
    dataset = copy.deepcopy(small)
    qas = dataset["data"][0]["paragraphs"][0]["qas"]
    qas[1]["id"] = qas[0]["id"]
    path = _write(tmp_path, dataset)
    with pytest.raises(ValueError, match=rf"duplicate question id '{qas[0]['id']}'.*qas\[1\]"):
        squad.load_squad(path)


# --- loading from TFDS -----------------------------------------------------------------------


def test_tfds_squad_reads_like_the_json(tmp_path, world, documents):
    tfds = pytest.importorskip("tensorflow_datasets")
    from etils import epath
    from tensorflow_datasets.datasets.squad import squad_dataset_builder

    files = {}
    for version in ("1.1", "2.0"):
        for split, docs in (("train", documents[:6]), ("validation", documents[6:9])):
            path = tmp_path / f"{split}-v{version}.json"
            synthetic_squad.write_squad_json(path, synthetic_squad.squad_dataset(world, docs, 0, version))
            files[f"v{version}", split] = str(path)

    # TFDS's own squad builder and features, reading our files instead of downloading.
    class Squad(squad_dataset_builder.Builder, skip_registration=True):
        __module__ = "zoo_test_tfds_builders"  # top-level: TFDS skips checksum lookups
        pkg_dir_path = epath.Path(os.path.dirname(squad_dataset_builder.__file__))

        def _split_generators(self, dl_manager):
            return {split: self._generate_examples(files[self.builder_config.name, split])
                    for split in ("train", "validation")}

    data_dir = str(tmp_path / "tfds")
    for config in ("v1.1", "v2.0"):
        Squad(config=config, data_dir=data_dir, file_format="array_record").download_and_prepare(
            download_config=tfds.download.DownloadConfig(try_download_gcs=False))

    def by_id(examples):
        return sorted(examples, key=lambda e: e["id"])

    for config in ("v1.1", "v2.0"):
        for split in ("train", "validation"):
            from_tfds = squad.load_squad(f"squad/{config}", split=split, data_dir=data_dir)
            assert by_id(from_tfds) == by_id(squad.load_squad(files[config, split]))
    assert any(e["is_impossible"] for e in squad.load_squad("squad/v2.0", "train", data_dir))
    with pytest.raises(ValueError, match="split 'dev'.*validation"):
        squad.load_squad("squad/v1.1", split="dev", data_dir=data_dir)
    with pytest.raises(FileNotFoundError, match="tfds build"):
        squad.load_squad("squad/v1.1", data_dir=str(tmp_path / "empty"))


# --- featurization ---------------------------------------------------------------------------

SEQ, STRIDE, QUERY = 40, 8, 16  # short windows: every synthetic context needs several


@pytest.fixture(scope="module")
def features(examples, tokenizer):
    return squad.featurize(examples[:200], tokenizer, max_seq_length=SEQ, doc_stride=STRIDE,
                           max_query_length=QUERY, is_training=True)


def _windows(features):
    """example index -> its rows, in order."""
    out = collections.defaultdict(list)
    for row, e in enumerate(features["example_index"]):
        out[int(e)].append(row)
    return out


def test_rows_follow_berts_layout(examples, tokenizer, features):
    assert {k: v.dtype for k, v in features.items()} == squad.FEATURE_DTYPES
    n = len(features["input_ids"])
    assert features["offsets"].shape == (n, SEQ, 2) and features["input_ids"].shape == (n, SEQ)
    assert max(len(rows) for rows in _windows(features).values()) >= 4  # the stride matters
    for e, rows in list(_windows(features).items())[:40]:
        example = examples[e]
        q = tokenizer.encode(example["question"])[:QUERY]
        ids, offsets = tokenizer.encode_with_offsets(example["context"])
        room = SEQ - len(q) - 3
        for k, row in enumerate(rows):
            start = k * STRIDE  # windows start doc_stride tokens apart ...
            window = ids[start:start + room]
            tokens = [tokenizer.cls_id, *q, tokenizer.sep_id, *window, tokenizer.sep_id]
            pad = SEQ - len(tokens)
            np.testing.assert_array_equal(features["input_ids"][row],
                                          tokens + [tokenizer.pad_id] * pad)
            segments = [0] * (len(q) + 2) + [1] * (len(window) + 1) + [0] * pad
            np.testing.assert_array_equal(features["token_type_ids"][row], segments)
            np.testing.assert_array_equal(features["attention_mask"][row],
                                          [1] * len(tokens) + [0] * pad)
            expected = np.full((SEQ, 2), -1)
            expected[len(q) + 2:len(q) + 2 + len(window)] = offsets[start:start + room]
            np.testing.assert_array_equal(features["offsets"][row], expected)
            # ... full but for the last, which ends at the context's last token.
            last = k == len(rows) - 1
            assert (start + len(window) == len(ids)) == last
            assert last or len(window) == room
        for a, b in zip(rows, rows[1:]):  # consecutive windows share room - stride tokens
            shared = room - STRIDE
            np.testing.assert_array_equal(
                features["offsets"][a][len(q) + 2 + STRIDE:len(q) + 2 + room],
                features["offsets"][b][len(q) + 2:len(q) + 2 + shared])


def test_windows_cover_every_context_token(examples, tokenizer, features):
    for e, rows in _windows(features).items():
        context = examples[e]["context"]
        covered = np.zeros(len(context), bool)
        for row in rows:
            for s, t in features["offsets"][row]:
                if s >= 0:
                    covered[s:t] = True
        in_token = np.zeros(len(context), bool)
        for s, t in tokenizer.encode_with_offsets(context)[1]:
            in_token[s:t] = True
        np.testing.assert_array_equal(covered, in_token)
        assert in_token.sum() == len(re.sub(r"\s", "", context))  # only spaces fall between


def test_exactly_one_window_is_each_tokens_max_context(examples, tokenizer, features):
    for e, rows in _windows(features).items():
        n_tokens = len(tokenizer.encode_with_offsets(examples[e]["context"])[0])
        q = len(tokenizer.encode(examples[e]["question"])[:QUERY])
        room = SEQ - q - 3
        flags = np.zeros((len(rows), n_tokens), bool)
        score = np.full((len(rows), n_tokens), -np.inf)
        for k, row in enumerate(rows):
            start = k * STRIDE
            length = min(room, n_tokens - start)
            flags[k, start:start + length] = features["token_is_max_context"][row][
                q + 2:q + 2 + length]
            assert not features["token_is_max_context"][row][:q + 2].any()
            assert not features["token_is_max_context"][row][q + 2 + length:].any()
            for t in range(start, start + length):  # BERT's score, in float64
                score[k, t] = min(t - start, start + length - 1 - t) + 0.01 * length
        np.testing.assert_array_equal(flags.sum(0), 1)
        np.testing.assert_array_equal(flags.argmax(0), score.argmax(0))


def test_max_context_matches_berts_worked_example():
    # run_squad's docstring: spans "the man went to the", "to the store and bought",
    # "and bought a gallon of"; "bought" has max context in the third.
    words = "the man went to the store and bought a gallon of milk".split()
    tok = wordpiece.WordPieceTokenizer(SPECIALS + sorted(set(words)) + ["who"])
    example = {"id": "q", "title": "t", "context": " ".join(words), "question": "who",
               "answers": [], "is_impossible": True}
    f = squad.featurize([example], tok, max_seq_length=9, doc_stride=3, max_query_length=1,
                        is_training=False)
    assert "start_positions" not in f and len(f["input_ids"]) == 4
    bought = [row for row in range(4) if tok.token_to_id("bought") in f["input_ids"][row]]
    assert bought == [1, 2]
    flags = [f["token_is_max_context"][row][list(f["input_ids"][row]).index(
        tok.token_to_id("bought"))] for row in bought]
    assert flags == [False, True]


def test_labels_recover_the_answer_or_point_at_cls(examples, features):
    labelled = set()
    for row, e in enumerate(features["example_index"]):
        example = examples[e]
        s, t = features["start_positions"][row], features["end_positions"][row]
        offsets = features["offsets"][row]
        context = example["context"]
        if example["is_impossible"]:
            assert s == t == 0
            continue
        answer = example["answers"][0]
        a, b = answer["answer_start"], answer["answer_start"] + len(answer["text"])
        in_context = offsets[:, 0] >= 0
        inside = offsets[in_context, 0].min() <= a and b <= offsets[in_context, 1].max()
        if inside:
            assert 0 < s <= t
            assert context[offsets[s, 0]:offsets[t, 1]] == answer["text"]
            labelled.add(int(e))
        else:
            assert s == t == 0
    answerable = {e for e in set(features["example_index"].tolist())
                  if not examples[e]["is_impossible"]}
    assert labelled == answerable


def test_every_gold_answer_is_a_token_span_of_some_window(examples, tokenizer):
    several = 0
    subset = examples[:200]
    f = squad.featurize(subset, tokenizer, max_seq_length=SEQ, doc_stride=STRIDE,
                        max_query_length=QUERY, is_training=False)
    rows = _windows(f)
    for e, example in enumerate(subset):
        several += len(example["answers"]) > 1
        for answer in example["answers"]:
            a, b = answer["answer_start"], answer["answer_start"] + len(answer["text"])
            assert any(
                a in f["offsets"][row][:, 0] and b in f["offsets"][row][:, 1]
                for row in rows[e]), (example["id"], answer)
    assert several > 0


def test_long_questions_are_truncated_with_a_counted_warning(examples, tokenizer, caplog):
    example = dict(examples[0], question=examples[0]["question"] + " Really?" * 10)
    q = tokenizer.encode(example["question"])
    assert len(q) > 5
    with caplog.at_level(logging.WARNING, logger="zoo.data.readers.squad"):
        f = squad.featurize([example, dict(examples[1], question="Who?")], tokenizer,
                            max_seq_length=32, doc_stride=8, max_query_length=5, is_training=True)
    row = f["input_ids"][0]
    assert list(row[:7]) == [tokenizer.cls_id, *q[:5], tokenizer.sep_id]
    message = caplog.records[-1].getMessage()
    assert message.startswith("1 of 2 questions longer than max_query_length=5")
    assert example["id"] in message


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_seq_length=67, max_query_length=64), "max_seq_length=67 leaves no room"),
    (dict(doc_stride=0), "doc_stride=0 must be an int >= 1"),
    (dict(max_query_length=2.5), "max_query_length=2.5"),
])
def test_featurize_rejects_bad_lengths(examples, sentencepiece, kwargs, match):
    with pytest.raises(ValueError, match=match):
        squad.featurize(examples[:2], sentencepiece, is_training=True, **kwargs)


def test_no_examples_give_empty_arrays(sentencepiece):
    f = squad.featurize([], sentencepiece, max_seq_length=16, max_query_length=4,
                        is_training=True)
    assert f["input_ids"].shape == (0, 16) and f["offsets"].shape == (0, 16, 2)
    assert f["start_positions"].shape == (0,)
