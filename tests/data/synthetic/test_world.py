"""The synthetic world and its documents: deterministic, consistent with the world, learnable."""

import collections
import math
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from zoo.data.synthetic.documents import (
    corpus_splits,
    default_corpus_text,
    generate_documents,
    split_documents,
)
from zoo.data.synthetic.world import (
    DOCUMENT_TYPES,
    ENTITY_TYPES,
    NAMED_TYPES,
    NUMBER,
    RELATIONS,
    make_world,
)

_PRONOUN_FORMS = {"female": ("She", "Her"), "male": ("He", "His"), None: ("It", "Its")}


@pytest.fixture(scope="module")
def world():
    return make_world(seed=0)


@pytest.fixture(scope="module")
def documents(world):
    return generate_documents(world, seed=0)


def _words(text):
    return re.findall(r"[A-Za-z]+", text)


def _tokens(sentence):
    return ["<s>"] + re.findall(r"\w+|[^\w\s]", sentence.lower()) + ["</s>"]


# --- determinism -----------------------------------------------------------------------------


def test_same_seed_gives_identical_world_and_documents(world, documents):
    again = make_world(seed=0)
    assert again == world
    assert generate_documents(again, seed=0) == documents


def test_different_seeds_give_different_worlds_and_documents(world, documents):
    other = make_world(seed=1)
    assert other.facts != world.facts
    assert {e.name for e in other.of_type("person")} != {e.name for e in world.of_type("person")}
    # Same world, another document seed: other facts kept, templates and order.
    texts = [d.texts for d in documents]
    assert [d.texts for d in generate_documents(world, seed=1)] != texts


def test_output_does_not_depend_on_python_hash_seed():
    # Iterating a set of strings would make the corpus differ between processes.
    code = ("from zoo.data.synthetic import documents; import hashlib; "
            "print(hashlib.sha256(documents.default_corpus_text(3, 60).encode()).hexdigest())")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    digests = set()
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, check=True,
                             capture_output=True, text=True)
        digests.add(out.stdout.strip())
    assert len(digests) == 1


# --- the world -------------------------------------------------------------------------------


def test_names_unique_ascii_and_every_type_present(world):
    names = [e.name for e in world.entities]
    assert len(names) == len(set(names))
    assert len({n.lower() for n in names}) == len(names)
    for e in world.entities:
        assert e.name.isascii() and e.name.isalpha(), e
        assert (e.gender in ("female", "male")) == (e.type == "person"), e
    assert {e.type for e in world.entities} == set(ENTITY_TYPES)
    assert len(world.of_type("person")) > len(world.of_type("city")) > len(world.of_type("country"))


def test_facts_are_well_typed_and_functional_relations_single_valued(world):
    objects = collections.defaultdict(set)
    for f in world.facts:
        rel = RELATIONS[f.relation]
        assert world.entity(f.subject).type == rel.subject_type, f
        if rel.object_type == NUMBER:
            assert f.object.isdigit(), f
        else:
            assert world.entity(f.object).type == rel.object_type, f
        objects[f.subject, f.relation].add(f.object)
    assert len(set(world.facts)) == len(world.facts)
    for (subject, relation), objs in objects.items():
        if RELATIONS[relation].functional:
            assert len(objs) == 1, (subject, relation, objs)
    for p in world.of_type("person"):  # every person has the always-present attributes
        for relation in ("age", "profession", "born_in", "lives_in", "speaks"):
            assert len(world.objects(p.name, relation)) == 1, (p, relation)


def test_relations_are_mutually_consistent(world):
    def one(subject, relation):
        (obj,) = world.objects(subject, relation)
        return obj

    for country in world.of_type("country"):
        assert one(one(country.name, "capital"), "located_in") == country.name
    for city in world.of_type("city"):
        assert one(one(city.name, "mayor"), "lives_in") == city.name
    for company in world.of_type("company"):
        assert one(one(company.name, "founded_by"), "works_for") == company.name
    for p in world.of_type("person"):
        birth_country = one(one(p.name, "born_in"), "located_in")
        assert one(p.name, "speaks") == one(birth_country, "language")
        for friend in world.objects(p.name, "knows"):
            assert friend != p.name
            assert p.name in world.objects(friend, "knows")


@pytest.mark.parametrize("num_entities", [0, 19, 20.0, "500"])
def test_make_world_rejects_bad_num_entities(num_entities):
    with pytest.raises(ValueError, match="num_entities"):
        make_world(0, num_entities)


def test_smallest_world_is_still_consistent():
    small = make_world(5, num_entities=20)
    docs = generate_documents(small, seed=5)
    assert len(docs) == 20
    assert all(len(d.sentences) >= 2 for d in docs)
    assert set(f.subject for d in docs for f in d.facts) <= {e.name for e in small.entities}


# --- documents -------------------------------------------------------------------------------


def test_every_sentence_states_facts_of_the_world(world, documents):
    facts = set(world.facts)
    names = {e.name for e in world.entities if e.type in NAMED_TYPES}
    for doc in documents:
        for i, s in enumerate(doc.sentences):
            assert s.text[0].isupper() and s.text.endswith("."), s.text
            assert 1 <= len(s.facts) <= 2
            mentioned = set()
            for fact, (start, end), subj_span in zip(s.facts, s.object_spans, s.subject_spans):
                assert fact in facts, fact
                assert s.text[start:end] == fact.object
                # Independently of the spans: the object is a whole word of the sentence.
                assert re.search(rf"(?<!\w){re.escape(fact.object)}(?!\w)", s.text), (fact, s)
                if subj_span is None:
                    # A pronoun opens the sentence, agrees with the subject, and the previous
                    # sentence's subject is the antecedent.
                    forms = _PRONOUN_FORMS[world.entity(fact.subject).gender]
                    assert s.text.split()[0] in forms, s.text
                    assert i > 0 and doc.sentences[i - 1].facts[0].subject == fact.subject
                else:
                    assert s.text[subj_span[0]:subj_span[1]] == fact.subject
                mentioned |= {fact.subject, fact.object}
            # No name leaks in that is not part of a stated fact (e.g. from a template).
            assert {w for w in _words(s.text) if w in names} <= mentioned, s.text


def test_documents_are_coherent_and_long_enough_for_nsp(world, documents):
    about = collections.Counter()
    for doc in documents:
        assert world.entity(doc.subject).type in DOCUMENT_TYPES
        assert len(doc.sentences) >= 2
        for s in doc.sentences:  # every sentence is about the document's entity
            assert any(doc.subject in (f.subject, f.object) for f in s.facts), (doc.subject, s)
        about[doc.subject] += 1
    # Default: exactly one document per person, city, country and company.
    expected = [e.name for e in world.entities if e.type in DOCUMENT_TYPES]
    assert about == collections.Counter(expected)


def test_documents_never_contradict_a_functional_relation(documents):
    stated = collections.defaultdict(set)
    for doc in documents:
        for f in doc.facts:
            stated[f.subject, f.relation].add(f.object)
    for (subject, relation), objs in stated.items():
        if RELATIONS[relation].functional:
            assert len(objs) == 1, (subject, relation, objs)


def test_each_relation_is_worded_several_ways(documents):
    wordings = collections.defaultdict(set)
    for doc in documents:
        for s in doc.sentences:
            if len(s.facts) == 1 and s.subject_spans[0] is not None:
                (a, b), (c, d) = sorted([s.subject_spans[0], s.object_spans[0]])
                wordings[s.facts[0].relation].add(s.text[:a] + "#" + s.text[b:c] + "#" + s.text[d:])
    assert set(wordings) == set(RELATIONS)
    for relation, forms in wordings.items():
        assert len(forms) >= 2, (relation, forms)


def test_document_text_offsets_locate_answers(documents):
    for doc in documents[:50]:
        context = doc.text
        for offset, s in zip(doc.sentence_offsets, doc.sentences):
            assert context[offset:offset + len(s.text)] == s.text
            for fact, (start, end) in zip(s.facts, s.object_spans):
                assert context[offset + start:offset + end] == fact.object


def test_num_documents_cycles_or_truncates(world, documents):
    n_subjects = len(documents)
    assert generate_documents(world, 7, seed=0) == documents[:7]
    more = generate_documents(world, n_subjects + 30, seed=0)
    assert len(more) == n_subjects + 30
    assert more[:n_subjects] == documents
    with pytest.raises(ValueError, match="num_documents"):
        generate_documents(world, 0)
    with pytest.raises(ValueError, match="pronoun_prob"):
        generate_documents(world, pronoun_prob=1.5)


def test_default_corpus_size_vocabulary_and_speed():
    start = time.perf_counter()
    text = default_corpus_text(seed=0)
    elapsed = time.perf_counter() - start
    # Guard against an accidental quadratic (it takes ~0.1 s); not a benchmark.
    assert elapsed < 2.0
    sentences = [line for line in text.split("\n") if line]
    vocab = {t for s in sentences for t in _tokens(s)}
    assert 2_000 <= len(sentences) <= 10_000
    assert 50_000 <= len(text.encode()) <= 1_000_000
    assert 300 <= len(vocab) <= 2_000


# --- splits ----------------------------------------------------------------------------------


def test_splits_are_disjoint_cover_and_have_requested_sizes(documents):
    splits = corpus_splits(seed=0, validation_fraction=0.1, test_fraction=0.05)
    n = len(documents)
    assert [len(splits[k]) for k in ("validation", "test")] == [round(0.1 * n), round(0.05 * n)]
    assert sum(len(v) for v in splits.values()) == n
    # As multisets, the three splits together are exactly the generated documents.
    key = lambda d: (d.subject, d.texts)  # noqa: E731
    together = collections.Counter(key(d) for v in splits.values() for d in v)
    assert together == collections.Counter(key(d) for d in documents)
    subjects = {k: {d.subject for d in v} for k, v in splits.items()}
    assert not subjects["train"] & subjects["validation"]
    assert not subjects["train"] & subjects["test"]
    assert not subjects["validation"] & subjects["test"]
    assert corpus_splits(seed=0, validation_fraction=0.1, test_fraction=0.05) == splits


def test_split_documents_validates_fractions(documents):
    with pytest.raises(ValueError, match="test_fraction"):
        split_documents(documents, 0.1, 1.0)
    with pytest.raises(ValueError, match="no training data"):
        split_documents(documents[:2], 0.5, 0.5 - 1e-9)
    small = split_documents(documents[:3], 0.01, 0.0)
    assert [len(small[k]) for k in ("train", "validation", "test")] == [2, 1, 0]


# --- learnability ----------------------------------------------------------------------------


def test_bigram_model_beats_unigram_on_held_out_text():
    splits = corpus_splits(seed=0)
    train = [_tokens(s) for d in splits["train"] for s in d.texts]
    valid = [_tokens(s) for d in splits["validation"] for s in d.texts]
    vocab = {w: i for i, w in enumerate(sorted({w for s in train for w in s} | {"<unk>"}))}
    ids = lambda s: [vocab.get(w, vocab["<unk>"]) for w in s]  # noqa: E731
    train_ids, valid_ids = [ids(s) for s in train], [ids(s) for s in valid]

    v = len(vocab)
    unigram = np.ones(v, np.float64)  # add-one smoothing
    bigram = np.zeros((v, v), np.float64)
    for s in train_ids:
        np.add.at(unigram, s[1:], 1.0)  # predicted tokens only (never <s>)
        np.add.at(bigram, (s[:-1], s[1:]), 1.0)
    p_uni = unigram / unigram.sum()
    rows = bigram.sum(axis=1, keepdims=True)
    lam = 0.8  # interpolate with the unigram so unseen bigrams keep some mass
    p_bi = np.where(rows > 0, lam * bigram / np.maximum(rows, 1.0) + (1 - lam) * p_uni, p_uni)

    prev = np.concatenate([s[:-1] for s in valid_ids])
    nxt = np.concatenate([s[1:] for s in valid_ids])
    ppl_uni = math.exp(-np.log(p_uni[nxt]).mean())
    ppl_bi = math.exp(-np.log(p_bi[prev, nxt]).mean())
    assert ppl_bi < 0.5 * ppl_uni, (ppl_bi, ppl_uni)
