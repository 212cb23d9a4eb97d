"""Documents about the synthetic world: templated English sentences that state its facts.

Every document is about one entity of zoo.data.synthetic.world (a person, city, country or
company) and has at least two sentences, so next-sentence prediction has pairs; every `Sentence`
keeps the facts it states and the character spans of their subjects and objects, so SQuAD-style
answer offsets are known rather than searched for. `corpus_splits` deals the default corpus into
disjoint train / validation / test documents; `default_corpus_text` formats it as BERT
pretraining text (zoo.data.readers.text_files).

Everything is keyed off an explicit seed through `random.Random`, as the world is.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Sequence

from zoo.data.readers.text_files import corpus_text
from zoo.data.synthetic.world import (
    DEFAULT_NUM_ENTITIES,
    DOCUMENT_TYPES,
    PRONOUNS,
    RELATIONS,
    Entity,
    Fact,
    World,
    make_world,
)


# Facts *about other entities* that a document mentions too (a city's document says who lives
# there), so documents are longer and an entity's name appears in varied positions.
_INVERSE_MENTIONS = {
    "person": ("mayor", "founded_by"),
    "city": ("lives_in", "born_in", "headquartered_in", "capital"),
    "country": ("located_in",),
    "company": ("works_for",),
}
_MAX_INVERSE_MENTIONS = 3


@dataclasses.dataclass(frozen=True)
class Sentence:
    """One sentence and the facts it states.

    `object_spans[i]` is the (start, end) character span of `facts[i].object` in `text`, so
    `text[start:end] == facts[i].object`. `subject_spans[i]` likewise for the subject, or None when
    the subject is referred to by a pronoun ("She", "Its").
    """

    text: str
    facts: tuple[Fact, ...]
    object_spans: tuple[tuple[int, int], ...]
    subject_spans: tuple[tuple[int, int] | None, ...]


@dataclasses.dataclass(frozen=True)
class Document:
    """Sentences about one entity (`subject`), in order."""

    subject: str
    sentences: tuple[Sentence, ...]

    @property
    def texts(self) -> tuple[str, ...]:
        return tuple(s.text for s in self.sentences)

    @property
    def text(self) -> str:
        """The sentences joined by single spaces (a SQuAD-style context paragraph)."""
        return " ".join(self.texts)

    @property
    def sentence_offsets(self) -> tuple[int, ...]:
        """Start of each sentence in `text`: add it to a sentence span to get a context span."""
        offsets, pos = [], 0
        for s in self.sentences:
            offsets.append(pos)
            pos += len(s.text) + 1
        return tuple(offsets)

    @property
    def facts(self) -> tuple[Fact, ...]:
        return tuple(f for s in self.sentences for f in s.facts)


# ---------------------------------------------------------------------------------------------
# Documents

_PLACEHOLDER = re.compile(r"\{(s|o|o2)\}")


def _render(template: str, values: dict[str, str]) -> tuple[str, dict[str, tuple[int, int]]]:
    """Fills `{s}`/`{o}`/`{o2}` and returns the text with each placeholder's character span."""
    out, spans, pos = [], {}, 0
    for piece in _PLACEHOLDER.split(template):
        # re.split with one group alternates literal, placeholder-name, literal, ...
        if len(out) % 2 == 1:
            text = values[piece]
            spans[piece] = (pos, pos + len(text))
        else:
            text = piece
        out.append(text)
        pos += len(text)
    return "".join(out), spans


def _sentence(rng: random.Random, facts: Sequence[Fact],
              pronouns: tuple[str, str] | None = None) -> Sentence:
    """States one fact, or two facts of one subject joined by "and".

    `pronouns` = (subject form, possessive form) replaces the subject's name when the drawn
    template starts with it ("She works as a baker.", "Her favourite color is red.").
    """
    if len(facts) == 1:
        template = rng.choice(RELATIONS[facts[0].relation].templates)
    else:
        # Only "{s} <verb phrase>." templates coordinate grammatically ("X lives in Y and ...").
        first = rng.choice([t for t in RELATIONS[facts[0].relation].templates
                            if t.startswith("{s} ")])
        second = rng.choice([t for t in RELATIONS[facts[1].relation].templates
                             if t.startswith("{s} ")])
        template = first[:-1] + " and " + second[len("{s} "):].replace("{o}", "{o2}")
    subject = facts[0].subject
    use_pronoun = pronouns is not None and template.startswith("{s}")
    if use_pronoun and template.startswith("{s}'s"):
        template, subject = "{s}" + template[len("{s}'s"):], pronouns[1]
    elif use_pronoun:
        subject = pronouns[0]
    values = {"s": subject, "o": facts[0].object}
    if len(facts) == 2:
        values["o2"] = facts[1].object
    text, spans = _render(template, values)
    return Sentence(
        text=text,
        facts=tuple(facts),
        object_spans=tuple(spans[k] for k in ("o", "o2")[: len(facts)]),
        subject_spans=(None if use_pronoun else spans["s"],) * len(facts),
    )


def _can_coordinate(a: Fact, b: Fact) -> bool:
    return a.subject == b.subject and all(
        any(t.startswith("{s} ") for t in RELATIONS[f.relation].templates) for f in (a, b))


def _document(world: World, entity: Entity, rng: random.Random, keep_prob: float,
              pronoun_prob: float, conjunction_prob: float) -> Document:
    own = list(world.facts_about(entity.name))
    rng.shuffle(own)
    kept = [f for f in own if rng.random() < keep_prob]
    for f in own:  # NSP needs >= 2 sentences: top up from the dropped facts
        if len(kept) >= 2:
            break
        if f not in kept:
            kept.append(f)
    inverse = [f for f in world.facts_mentioning(entity.name)
               if f.relation in _INVERSE_MENTIONS[entity.type]]
    inverse = rng.sample(inverse, min(len(inverse), rng.randint(0, _MAX_INVERSE_MENTIONS)))

    # Group facts into sentences: occasionally two facts of the entity share one sentence, as
    # long as the document keeps at least two sentences.
    groups: list[list[Fact]] = []
    remaining = len(kept) + len(inverse)
    i = 0
    while i < len(kept):
        if (i + 1 < len(kept) and remaining - 1 >= 2 and _can_coordinate(kept[i], kept[i + 1])
                and rng.random() < conjunction_prob):
            groups.append([kept[i], kept[i + 1]])
            i, remaining = i + 2, remaining - 1
        else:
            groups.append([kept[i]])
            i += 1
    groups.extend([f] for f in inverse)

    sentences: list[Sentence] = []
    for group in groups:
        # A pronoun only right after a sentence whose subject is the entity too, so the
        # antecedent is the subject of the previous sentence.
        use_pronoun = (
            sentences
            and group[0].subject == entity.name
            and sentences[-1].facts[0].subject == entity.name
            and rng.random() < pronoun_prob
        )
        sentences.append(_sentence(rng, group, PRONOUNS[entity.gender] if use_pronoun else None))
    return Document(subject=entity.name, sentences=tuple(sentences))


def generate_documents(
    world: World,
    num_documents: int | None = None,
    seed: int = 0,
    *,
    keep_prob: float = 0.85,
    pronoun_prob: float = 0.3,
    conjunction_prob: float = 0.15,
) -> list[Document]:
    """Writes documents about the world's persons, cities, countries and companies.

    Args:
      world: from `make_world`.
      num_documents: None for one document per such entity (in a seeded order); a larger number
        cycles through the entities again with fresh template/fact choices, a smaller one stops
        early.
      seed: drives entity order, which facts each document states, templates and pronouns.
      keep_prob: chance each of the entity's own facts is stated (facts left out of a document
        are the world's material for unanswerable questions).
      pronoun_prob: chance a sentence refers to the entity as He/She/It instead of by name.
      conjunction_prob: chance two facts share one sentence ("... and ...").

    Returns:
      Documents of >= 2 sentences each, every sentence tied to the facts it states.
    """
    if num_documents is not None and (not isinstance(num_documents, int) or num_documents < 1):
        raise ValueError(f"num_documents={num_documents!r} must be None or a positive int")
    for name, p in (("keep_prob", keep_prob), ("pronoun_prob", pronoun_prob),
                    ("conjunction_prob", conjunction_prob)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name}={p!r} must be a probability in [0, 1]")
    rng = random.Random(seed)
    subjects = [e for e in world.entities if e.type in DOCUMENT_TYPES]
    n = len(subjects) if num_documents is None else num_documents
    documents: list[Document] = []
    order: list[Entity] = []
    while len(documents) < n:
        if not order:
            order = list(subjects)
            rng.shuffle(order)
        documents.append(_document(world, order.pop(), rng, keep_prob, pronoun_prob,
                                   conjunction_prob))
    return documents


def split_documents(
    documents: Sequence[Document],
    validation_fraction: float = 0.1,
    test_fraction: float = 0.1,
    seed: int = 0,
) -> dict[str, list[Document]]:
    """Deals documents into disjoint train/validation/test lists (a seeded permutation).

    Each held-out split gets round(fraction * len(documents)) documents, at least one when its
    fraction is positive; train gets the rest and must not end up empty.
    """
    for name, f in (("validation_fraction", validation_fraction),
                    ("test_fraction", test_fraction)):
        if not 0.0 <= f < 1.0:
            raise ValueError(f"{name}={f!r} must be in [0, 1)")
    n = len(documents)
    n_val = max(1, round(validation_fraction * n)) if validation_fraction > 0 else 0
    n_test = max(1, round(test_fraction * n)) if test_fraction > 0 else 0
    if n - n_val - n_test < 1:
        raise ValueError(
            f"{n} documents leave no training data with validation_fraction={validation_fraction} "
            f"and test_fraction={test_fraction}; generate more documents or lower the fractions")
    perm = list(range(n))
    random.Random(seed).shuffle(perm)
    return {
        "train": [documents[i] for i in perm[n_val + n_test:]],
        "validation": [documents[i] for i in perm[:n_val]],
        "test": [documents[i] for i in perm[n_val:n_val + n_test]],
    }


def corpus_splits(
    seed: int = 0,
    num_entities: int = DEFAULT_NUM_ENTITIES,
    num_documents: int | None = None,
    validation_fraction: float = 0.1,
    test_fraction: float = 0.1,
) -> dict[str, list[Document]]:
    """The default corpus of `seed`, split into disjoint train/validation/test documents."""
    documents = generate_documents(make_world(seed, num_entities), num_documents, seed=seed)
    return split_documents(documents, validation_fraction, test_fraction, seed=seed)


def default_corpus_text(seed: int = 0, num_entities: int = DEFAULT_NUM_ENTITIES) -> str:
    """All documents of the default world of `seed`, as BERT pretraining text."""
    return corpus_text(generate_documents(make_world(seed, num_entities), seed=seed))
