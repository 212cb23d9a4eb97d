"""SQuAD-format question answering over the synthetic world: contexts are its documents,
answers the facts they state (v1.1), plus unanswerable questions about facts a paragraph
neither states nor implies (v2.0). Written as official SQuAD JSON, so the synthetic set goes
through the same loader (zoo.data.readers.squad) as a user's files.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Sequence

from zoo.data.synthetic.documents import Document, corpus_splits
from zoo.data.synthetic.world import DEFAULT_NUM_ENTITIES, NUMBER, RELATIONS, World, make_world
from zoo.errors import ConfigError

SQUAD_VERSIONS = {"1.1": "1.1", "2.0": "v2.0"}  # ours -> the official files' "version" field

# Questions per relation, asked about `{s}`; the answer is the object. Every template is unique
# across relations, so a question names its relation unambiguously.
QUESTION_TEMPLATES: dict[str, tuple[str, ...]] = {
    "age": ("How old is {s}?", "What is the age of {s}?", "What age is {s}?"),
    "profession": ("What does {s} work as?", "What is {s}'s profession?",
                   "What is the job of {s}?"),
    "favourite_color": ("What is {s}'s favourite color?", "Which color does {s} like best?",
                        "What color does {s} love most?"),
    "favourite_food": ("What is {s}'s favourite food?", "What food does {s} like to eat?",
                       "Which food does {s} love most?"),
    "pet": ("What pet does {s} have?", "What animal does {s} own?",
            "What does {s} keep at home?"),
    "born_in": ("Where was {s} born?", "Where does {s} come from?",
                "What is the birthplace of {s}?"),
    "lives_in": ("Where does {s} live?", "Where is {s}'s home?",
                 "In which city does {s} have a house?"),
    "works_for": ("Where does {s} work?", "Which company employs {s}?",
                  "For which company does {s} work?"),
    "speaks": ("What language does {s} speak?", "What is {s}'s native language?",
               "Which language did {s} grow up speaking?"),
    "knows": ("Who does {s} know?", "Who is a friend of {s}?", "Whom does {s} often meet?"),
    "located_in": ("In which country is {s}?", "Where is {s} located?",
                   "Which country does {s} lie in?"),
    "population": ("How many thousand people live in {s}?",
                   "What is the population of {s} in thousands?",
                   "How many thousands of people is {s} home to?"),
    "mayor": ("Who is the mayor of {s}?", "Who governs {s}?", "Who is {s}'s mayor?"),
    "capital": ("What is the capital of {s}?", "Which city is the capital of {s}?",
                "Where does {s} have its capital?"),
    "language": ("What language do people in {s} speak?",
                 "What is the official language of {s}?", "Which language is spoken in {s}?"),
    "founded_by": ("Who founded {s}?", "Who started {s}?", "By whom was {s} founded?"),
    "headquartered_in": ("Where is {s} based?", "Where are the headquarters of {s}?",
                         "In which city does {s} have its main office?"),
    "product": ("What does {s} make?", "What does {s} sell?", "What is {s} known for?"),
    "founded_in": ("When was {s} founded?", "In which year was {s} founded?",
                   "Since when has {s} existed?"),
}

# A stated (s, r, o) makes (o, r') answerable by the world's consistency rules alone (a capital
# lies in its country, a mayor lives in their city, a founder works for the company, `knows` is
# symmetric), so (o, r') is never asked as an unanswerable question beside it.
_IMPLIED = {"capital": "located_in", "mayor": "lives_in", "founded_by": "works_for",
            "knows": "knows"}


def _stated_answers(document: Document) -> dict[tuple[str, str], list[dict]]:
    """(subject, relation) -> SQuAD answers (one per statement) in the document's text."""
    answers: dict[tuple[str, str], list[dict]] = {}
    for offset, sentence in zip(document.sentence_offsets, document.sentences):
        for fact, (start, _) in zip(sentence.facts, sentence.object_spans):
            answers.setdefault((fact.subject, fact.relation), []).append(
                {"text": fact.object, "answer_start": offset + start})
    return answers


def _unanswerable(world: World, document: Document, stated: dict) -> list[tuple[str, str]]:
    """(subject, relation) pairs the world knows but the document neither states nor implies,
    about entities the document names (so the question is plausible)."""
    named: list[str] = []  # in order of first mention
    for sentence in document.sentences:
        for fact, subject_span in zip(sentence.facts, sentence.subject_spans):
            names = [fact.subject] if subject_span is not None else []  # not "She"
            if RELATIONS[fact.relation].object_type != NUMBER:
                names.append(fact.object)
            named.extend(n for n in names if n not in named)
    implied = {(f.object, _IMPLIED[f.relation]) for f in document.facts if f.relation in _IMPLIED}
    pairs = []
    for name in named:
        type_ = world.entity(name).type
        for relation in RELATIONS.values():
            key = (name, relation.name)
            if (relation.subject_type == type_ and key not in stated and key not in implied
                    and world.objects(*key)):
                pairs.append(key)
    return pairs


def _plausible_answers(world: World, document: Document, relation: str) -> list[dict]:
    """Spans of the document of the relation's object type: what a reader might wrongly pick."""
    object_type = RELATIONS[relation].object_type
    out = []
    for offset, sentence in zip(document.sentence_offsets, document.sentences):
        for fact, (start, _) in zip(sentence.facts, sentence.object_spans):
            if RELATIONS[fact.relation].object_type == NUMBER:
                type_ = NUMBER
            else:
                type_ = world.entity(fact.object).type
            if type_ == object_type:
                out.append({"text": fact.object, "answer_start": offset + start})
    return out[:1]


def _question_id(seed: int, index: int, context: str, question: str) -> str:
    digest = hashlib.sha1(f"{seed}\0{index}\0{context}\0{question}".encode())
    return digest.hexdigest()[:24]  # SQuAD's ids are 24 hex digits too


def squad_dataset(
    world: World,
    documents: Sequence[Document],
    seed: int = 0,
    version: str = "1.1",
    *,
    unanswerable_fraction: float = 1 / 3,
    max_answerable_per_paragraph: int | None = None,
) -> dict:
    """Questions about the documents, in the official SQuAD JSON format.

    Each document is one paragraph (its `text` is the context); documents about the same entity
    are paragraphs of one article titled by it. For every (subject, relation) a paragraph states,
    one question asks for the object ("Where does Lomira live?" -> "Tavesh"), worded by a
    template drawn from `QUESTION_TEMPLATES`; every statement of it is a gold answer (several
    objects for `knows`, several spans when a fact is stated twice), `answer_start` exact. The
    question names its subject even where the paragraph says "She", so coreference is needed.

    Version '2.0' adds unanswerable questions (`is_impossible`, `answers` []): the same kind of
    question about an entity the paragraph names and a relation the world knows for it, which the
    paragraph neither states nor implies by the world's rules (a mayor lives in their city, a
    capital lies in its country, a founder works for the company, `knows` is mutual). Their
    `plausible_answers` hold one span of the right type when the paragraph has one.

    Args:
      world: the world the documents were written from.
      documents: from `generate_documents` (or `corpus_splits`).
      seed: drives templates and which questions are asked; equal seeds give equal datasets.
      version: '1.1' (answerable only) or '2.0'.
      unanswerable_fraction: v2.0: the share of each paragraph's questions that are
        unanswerable, as far as the paragraph offers candidates (SQuAD 2.0 has about 1/3).
      max_answerable_per_paragraph: None asks about every stated (subject, relation); else a
        seeded sample of at most this many per paragraph.

    Returns:
      {"version", "data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question",
      "answers": [{"text", "answer_start"}], ("is_impossible", "plausible_answers" in 2.0)}]}]}]}
      with unique ids.
    """
    if version not in SQUAD_VERSIONS:
        raise ConfigError(f"version={version!r} must be one of {tuple(SQUAD_VERSIONS)}")
    if not 0.0 <= unanswerable_fraction < 1.0:
        raise ValueError(f"unanswerable_fraction={unanswerable_fraction!r} must be in [0, 1)")
    if max_answerable_per_paragraph is not None and (
            not isinstance(max_answerable_per_paragraph, int) or max_answerable_per_paragraph < 1):
        raise ValueError(f"max_answerable_per_paragraph={max_answerable_per_paragraph!r} must be "
                         "None or a positive int")
    v2 = version == "2.0"
    rng = random.Random(seed)
    articles: dict[str, list[dict]] = {}  # title -> paragraphs, in first-appearance order
    ids: set[str] = set()
    for index, document in enumerate(documents):
        context = document.text
        stated = _stated_answers(document)
        keys = list(stated)
        if max_answerable_per_paragraph is not None and len(keys) > max_answerable_per_paragraph:
            keys = sorted(rng.sample(range(len(keys)), max_answerable_per_paragraph))
            keys = [list(stated)[k] for k in keys]
        asked = [(key, stated[key], False) for key in keys]
        if v2:
            candidates = _unanswerable(world, document, stated)
            wanted = round(len(keys) * unanswerable_fraction / (1.0 - unanswerable_fraction))
            for key in rng.sample(candidates, min(wanted, len(candidates))):
                asked.append((key, [], True))
        qas = []
        for (subject, relation), answers, impossible in asked:
            question = rng.choice(QUESTION_TEMPLATES[relation]).format(s=subject)
            qid = _question_id(seed, index, context, question)
            if qid in ids:  # a question repeated within one paragraph: a template bug
                raise RuntimeError(f"duplicate question {question!r} in document {index}")
            ids.add(qid)
            qa = {"id": qid, "question": question, "answers": answers}
            if v2:
                qa["is_impossible"] = impossible
                if impossible:
                    qa["plausible_answers"] = _plausible_answers(world, document, relation)
            qas.append(qa)
        rng.shuffle(qas)
        articles.setdefault(document.subject, []).append({"context": context, "qas": qas})
    return {
        "version": SQUAD_VERSIONS[version],
        "data": [{"title": title, "paragraphs": paragraphs}
                 for title, paragraphs in articles.items()],
    }


def write_squad_json(path: str | os.PathLike, dataset: dict) -> None:
    """Writes a SQuAD dataset (from `squad_dataset`) as UTF-8 JSON, as the official files are."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(dataset, f, ensure_ascii=False)


def squad_splits(
    seed: int = 0,
    version: str = "1.1",
    num_entities: int = DEFAULT_NUM_ENTITIES,
    **kwargs,
) -> dict[str, dict]:
    """SQuAD datasets over the disjoint document splits of `corpus_splits(seed, num_entities)`.

    Returns {'train', 'validation', 'test'} -> SQuAD dict; `kwargs` go to `squad_dataset`.
    The splits share the world (facts recur) but never a paragraph.
    """
    world = make_world(seed, num_entities)
    splits = corpus_splits(seed, num_entities)
    return {name: squad_dataset(world, docs, seed=seed, version=version, **kwargs)
            for name, docs in splits.items()}
