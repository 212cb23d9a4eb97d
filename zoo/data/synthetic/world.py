"""A seeded, offline "world" corpus: the default data of every quickstart, test and demo.

There is no network here, so TFDS text corpora and hub datasets cannot be fetched. Instead a small
world of invented people, cities, countries, languages and companies (plus real-word colors,
foods, animals, professions and products) is generated from a seed, and documents state its facts
in English sentences drawn from several templates per relation::

    Lomira was born in Tavesh. She works as a baker and has a pet dog. Lomira is the mayor of Orvin.

Why it looks like this:
  * Language modelling: templates, consistent facts and relational regularities (a person speaks
    the language of the country they were born in) give text far more predictable than its word
    frequencies: a bigram model already has ~6x lower held-out perplexity than a unigram one
    (24 vs 136 on the default corpus), leaving a Transformer plenty to learn.
  * BERT pretraining: every document is about one entity, so consecutive sentences are coherent
    and next-sentence prediction is learnable; `write_text_corpus` writes BERT's format.
  * Question answering: every `Sentence` keeps the `Fact`s it states and the exact character
    spans of their objects, so SQuAD-style answer offsets are known, not searched for; facts of
    the world a document leaves out give unanswerable questions. zoo.data.synthetic.squad
    writes both kinds in the official SQuAD v1.1/v2.0 JSON format.
  * word2vec: entities of one type only ever fill the same template slots, so their contexts
    match and nearest neighbours recover the type.

Task datasets built over this world live in modules of their own: zoo.data.synthetic.squad
(question answering) and zoo.data.synthetic.classification (sentence and sentence-pair labels);
zoo.data.synthetic.translation (Chinese-numeral arithmetic -> English) needs no world.

Everything is keyed off an explicit seed through `random.Random`; no global RNG state is read and
no set or dict is iterated in a hash-dependent order, so output is identical across processes.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import re
from collections.abc import Sequence
from typing import NamedTuple

from zoo.errors import ConfigError, DataError

# Entity types whose names are invented (capitalised, from syllables) ...
NAMED_TYPES = ("person", "city", "country", "language", "company")
# ... and those whose members are ordinary lower-case English words.
VALUE_WORDS: dict[str, tuple[str, ...]] = {
    "color": (
        "red", "blue", "green", "yellow", "purple", "orange", "black", "white", "brown", "pink",
        "gray", "silver", "gold", "teal", "violet",
    ),
    "food": (
        "bread", "rice", "soup", "cheese", "noodles", "apples", "beans", "fish", "pasta", "honey",
        "cake", "dumplings", "lentils", "mangoes", "porridge", "salad", "potatoes", "tomatoes",
        "grapes", "olives",
    ),
    # Consonant-initial only, so "a {animal}" / "a {profession}" never needs "an".
    "animal": (
        "dog", "cat", "horse", "rabbit", "parrot", "goat", "turtle", "hamster", "pony", "canary",
        "ferret", "lizard", "tortoise", "pig", "duck",
    ),
    "profession": (
        "baker", "teacher", "doctor", "farmer", "painter", "pilot", "nurse", "lawyer",
        "carpenter", "chef", "writer", "singer", "tailor", "banker", "sailor", "dentist",
        "plumber", "judge", "potter", "librarian",
    ),
    "product": (
        "shoes", "phones", "bicycles", "lamps", "clocks", "chairs", "toys", "boats", "cars",
        "books", "tools", "radios", "candles", "bags", "hats", "kettles", "tents", "pianos",
        "maps", "soap",
    ),
}
ENTITY_TYPES = NAMED_TYPES + tuple(VALUE_WORDS)
# Entities a document can be about (value words only ever appear as objects).
DOCUMENT_TYPES = ("person", "city", "country", "company")
NUMBER = "number"  # object type of literal facts (age, population, founding year)

DEFAULT_NUM_ENTITIES = 500
_MIN_NUM_ENTITIES = 20


class Fact(NamedTuple):
    """One (subject, relation, object) record; subject/object are entity names or literals."""

    subject: str
    relation: str
    object: str


class Relation(NamedTuple):
    """A relation's signature and the sentence templates that state it.

    Templates use `{s}` (subject) and `{o}` (object) once each. A functional relation has at most
    one object per subject (a person lives in one city).
    """

    name: str
    subject_type: str
    object_type: str
    functional: bool
    templates: tuple[str, ...]


RELATIONS: dict[str, Relation] = {r.name: r for r in (
    Relation("age", "person", NUMBER, True, (
        "{s} is {o} years old.", "{s}'s age is {o}.", "{s} turned {o} this year.")),
    Relation("profession", "person", "profession", True, (
        "{s} works as a {o}.", "{s} is a {o} by trade.", "{s} earns a living as a {o}.")),
    Relation("favourite_color", "person", "color", True, (
        "{s}'s favourite color is {o}.", "{s} likes the color {o} best.",
        "The color {s} loves most is {o}.")),
    Relation("favourite_food", "person", "food", True, (
        "{s}'s favourite food is {o}.", "{s} likes to eat {o}.",
        "{s} loves {o} more than any other food.")),
    Relation("pet", "person", "animal", True, (
        "{s} has a pet {o}.", "{s} owns a {o}.", "{s} keeps a {o} at home.")),
    Relation("born_in", "person", "city", True, (
        "{s} was born in {o}.", "{s} comes from {o}.", "{s}'s birthplace is {o}.")),
    Relation("lives_in", "person", "city", True, (
        "{s} lives in {o}.", "{s}'s home is in {o}.", "{s} has a house in {o}.")),
    Relation("works_for", "person", "company", True, (
        "{s} works for {o}.", "{s} is employed by {o}.", "{s} has a job at {o}.")),
    Relation("speaks", "person", "language", True, (
        "{s} speaks {o}.", "{s}'s native language is {o}.", "{s} grew up speaking {o}.")),
    Relation("knows", "person", "person", False, (
        "{s} knows {o}.", "{s} is a friend of {o}.", "{s} often meets {o}.")),
    Relation("located_in", "city", "country", True, (
        "{s} is a city in {o}.", "{s} lies in {o}.", "{s} is located in {o}.")),
    Relation("population", "city", NUMBER, True, (
        "{s} has a population of {o} thousand.", "About {o} thousand people live in {s}.",
        "{s} is home to {o} thousand people.")),
    Relation("mayor", "city", "person", True, (
        "The mayor of {s} is {o}.", "{o} is the mayor of {s}.", "{s} is governed by mayor {o}.")),
    Relation("capital", "country", "city", True, (
        "The capital of {s} is {o}.", "{o} is the capital of {s}.",
        "{s} has its capital in {o}.")),
    Relation("language", "country", "language", True, (
        "People in {s} speak {o}.", "The language of {s} is {o}.",
        "{s}'s official language is {o}.")),
    Relation("founded_by", "company", "person", True, (
        "{s} was founded by {o}.", "{o} founded {s}.", "{s} was started by {o}.")),
    Relation("headquartered_in", "company", "city", True, (
        "{s} is based in {o}.", "The headquarters of {s} are in {o}.",
        "{s} has its main office in {o}.")),
    Relation("product", "company", "product", True, (
        "{s} makes {o}.", "{s} sells {o}.", "{s} is known for its {o}.")),
    Relation("founded_in", "company", NUMBER, True, (
        "{s} was founded in {o}.", "{s} opened its doors in {o}.", "{s} has existed since {o}.")),
)}

# Facts *about other entities* that a document mentions too (a city's document says who lives
# there), so documents are longer and an entity's name appears in varied positions.
_INVERSE_MENTIONS = {
    "person": ("mayor", "founded_by"),
    "city": ("lives_in", "born_in", "headquartered_in", "capital"),
    "country": ("located_in",),
    "company": ("works_for",),
}
_MAX_INVERSE_MENTIONS = 3

# Syllables for invented names; per-type suffixes make e.g. countries read like countries.
_ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z",
           "br", "dr", "kr", "tr", "st", "sh", "th", "ch")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "i", "o", "ai", "ei", "ou")
_CODAS = ("", "", "", "n", "r", "l", "s", "m", "th", "nd", "sk")
_SUFFIXES = {
    "person": ("",),
    "city": ("", "", "ton", "burg", "holm", "dale", "mar"),
    "country": ("ia", "land", "ora", "istan"),
    "company": ("ex", "ix", "corp", "tek", "ico", "on"),
}
_LANGUAGE_SUFFIXES = ("ish", "ese", "ic", "ian")

_PRONOUNS = {"female": ("She", "Her"), "male": ("He", "His"), None: ("It", "Its")}


@dataclasses.dataclass(frozen=True)
class Entity:
    """A named thing of the world. `gender` ('female'/'male') is set for persons only."""

    name: str
    type: str
    gender: str | None = None


@dataclasses.dataclass(frozen=True)
class World:
    """Entities and the facts relating them; deterministic in `seed`."""

    seed: int
    entities: tuple[Entity, ...]
    facts: tuple[Fact, ...]

    @functools.cached_property
    def _by_name(self) -> dict[str, Entity]:
        return {e.name: e for e in self.entities}

    @functools.cached_property
    def _by_subject(self) -> dict[str, tuple[Fact, ...]]:
        index: dict[str, list[Fact]] = {}
        for f in self.facts:
            index.setdefault(f.subject, []).append(f)
        return {k: tuple(v) for k, v in index.items()}

    @functools.cached_property
    def _by_object(self) -> dict[str, tuple[Fact, ...]]:
        index: dict[str, list[Fact]] = {}
        for f in self.facts:
            index.setdefault(f.object, []).append(f)
        return {k: tuple(v) for k, v in index.items()}

    def entity(self, name: str) -> Entity:
        """The entity called `name` (KeyError with a hint if there is none)."""
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no entity named {name!r} in the world of seed {self.seed}") from None

    def of_type(self, type_: str) -> tuple[Entity, ...]:
        """Entities of one type, in world order."""
        if type_ not in ENTITY_TYPES:
            raise ValueError(f"type_={type_!r} is not an entity type; use one of {ENTITY_TYPES}")
        return tuple(e for e in self.entities if e.type == type_)

    def facts_about(self, subject: str) -> tuple[Fact, ...]:
        """Facts whose subject is `subject`."""
        return self._by_subject.get(subject, ())

    def facts_mentioning(self, obj: str) -> tuple[Fact, ...]:
        """Facts whose object is `obj`."""
        return self._by_object.get(obj, ())

    def objects(self, subject: str, relation: str) -> tuple[str, ...]:
        """Objects of `relation` for `subject` (one for a functional relation, or none)."""
        return tuple(f.object for f in self.facts_about(subject) if f.relation == relation)


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
# World


def _reserved_words() -> frozenset[str]:
    """Lower-case words used by templates and value types: invented names must avoid them."""
    words = set(re.findall(r"[a-z]+", " ".join(
        t.lower() for r in RELATIONS.values() for t in r.templates)))
    for values in VALUE_WORDS.values():
        words.update(values)
    words.update(w.lower() for pair in _PRONOUNS.values() for w in pair)
    return frozenset(words)


def _make_namer(rng: random.Random):
    taken = set(_reserved_words())  # membership only: never iterated, so hash order is moot

    def new_name(kind: str, root: str | None = None) -> str:
        for _ in range(1000):
            if root is None:
                n_syl = rng.choice((2, 2, 3)) if kind == "person" else rng.choice((1, 2, 2))
                stem = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(n_syl))
                stem += rng.choice(_CODAS)
                suffix = rng.choice(_LANGUAGE_SUFFIXES if kind == "language" else _SUFFIXES[kind])
            else:
                stem, suffix = root, rng.choice(_LANGUAGE_SUFFIXES)
            name = (stem + suffix).capitalize()
            if 4 <= len(name) <= 12 and name.lower() not in taken:
                taken.add(name.lower())
                return name
            root = None  # a derived name collided: fall back to a fresh stem
        raise RuntimeError("could not find an unused name; the syllable inventory is exhausted")

    return new_name


def _counts(num_entities: int) -> dict[str, int]:
    countries = max(2, round(0.05 * num_entities))
    cities = max(countries, round(0.15 * num_entities))
    companies = max(2, round(0.12 * num_entities))
    persons = num_entities - countries - cities - companies
    return {"country": countries, "city": cities, "company": companies, "person": persons}


def make_world(seed: int = 0, num_entities: int = DEFAULT_NUM_ENTITIES) -> World:
    """Builds a consistent world of people, cities, countries and companies.

    Args:
      seed: the only source of randomness; equal seeds give equal worlds.
      num_entities: how many document-worthy entities (persons, cities, countries, companies)
        to invent; about 65% are persons. One language per country is added on top, and every
        color, food, animal, profession and product word is an entity too.

    Returns:
      A `World` whose facts satisfy: a country's capital is one of its cities; a city's mayor
      lives there; a company's founder works for it; `knows` is symmetric; a person speaks the
      language of the country they were born in; functional relations have one object.
    """
    if not isinstance(num_entities, int) or num_entities < _MIN_NUM_ENTITIES:
        raise ConfigError(
            f"num_entities={num_entities!r} must be an int >= {_MIN_NUM_ENTITIES} (every country "
            "needs a city and every city a resident); pass a larger num_entities")
    rng = random.Random(seed)
    new_name = _make_namer(rng)
    counts = _counts(num_entities)

    countries = [new_name("country") for _ in range(counts["country"])]
    # A language's name grows from its country's stem ("Kordia" -> "Kordish").
    languages = [new_name("language", re.sub(r"(ia|land|ora|istan)$", "", c.lower()))
                 for c in countries]
    cities = [new_name("city") for _ in range(counts["city"])]
    companies = [new_name("company") for _ in range(counts["company"])]
    persons = [new_name("person") for _ in range(counts["person"])]
    genders = [rng.choice(("female", "male")) for _ in persons]

    facts: list[Fact] = []
    # Cities: the first len(countries) cities seed one country each, so none is empty.
    city_country = [countries[i] if i < len(countries) else rng.choice(countries)
                    for i in range(len(cities))]
    country_language = dict(zip(countries, languages))
    residents: dict[str, list[str]] = {c: [] for c in cities}
    person_home = {}
    for i, p in enumerate(persons):
        # Round-robin first so every city has a resident (and so a mayor).
        home = cities[i] if i < len(cities) else rng.choice(cities)
        person_home[p] = home
        residents[home].append(p)

    for city, country in zip(cities, city_country):
        facts.append(Fact(city, "located_in", country))
        facts.append(Fact(city, "population", str(rng.randrange(20, 1000, 10))))
        facts.append(Fact(city, "mayor", rng.choice(residents[city])))
    for country, language in zip(countries, languages):
        own_cities = [c for c, k in zip(cities, city_country) if k == country]
        facts.append(Fact(country, "capital", rng.choice(own_cities)))
        facts.append(Fact(country, "language", language))

    founders = rng.sample(persons, len(companies))
    employer = {}
    for company, founder in zip(companies, founders):
        facts.append(Fact(company, "founded_by", founder))
        facts.append(Fact(company, "headquartered_in", rng.choice(cities)))
        facts.append(Fact(company, "product", rng.choice(VALUE_WORDS["product"])))
        facts.append(Fact(company, "founded_in", str(rng.randrange(1850, 2021))))
        employer[founder] = company

    city_to_country = dict(zip(cities, city_country))
    friends: dict[str, list[str]] = {p: [] for p in persons}
    for p in persons:
        for q in rng.sample(persons, rng.choice((1, 1, 2))):
            if q != p and q not in friends[p]:
                friends[p].append(q)
                friends[q].append(p)
    for p in persons:
        birthplace = rng.choice(cities)
        facts.append(Fact(p, "age", str(rng.randrange(18, 91))))
        facts.append(Fact(p, "profession", rng.choice(VALUE_WORDS["profession"])))
        facts.append(Fact(p, "favourite_color", rng.choice(VALUE_WORDS["color"])))
        facts.append(Fact(p, "favourite_food", rng.choice(VALUE_WORDS["food"])))
        if rng.random() < 0.6:
            facts.append(Fact(p, "pet", rng.choice(VALUE_WORDS["animal"])))
        facts.append(Fact(p, "born_in", birthplace))
        facts.append(Fact(p, "lives_in", person_home[p]))
        if p in employer:
            facts.append(Fact(p, "works_for", employer[p]))
        elif rng.random() < 0.8:
            facts.append(Fact(p, "works_for", rng.choice(companies)))
        facts.append(Fact(p, "speaks", country_language[city_to_country[birthplace]]))
        facts.extend(Fact(p, "knows", q) for q in friends[p])

    entities = (
        [Entity(p, "person", g) for p, g in zip(persons, genders)]
        + [Entity(c, "city") for c in cities]
        + [Entity(c, "country") for c in countries]
        + [Entity(x, "language") for x in languages]
        + [Entity(c, "company") for c in companies]
        + [Entity(w, t) for t, words in VALUE_WORDS.items() for w in words]
    )
    return World(seed=seed, entities=tuple(entities), facts=tuple(facts))


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
        sentences.append(_sentence(rng, group, _PRONOUNS[entity.gender] if use_pronoun else None))
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


# ---------------------------------------------------------------------------------------------
# BERT pretraining text format: one sentence per line, a blank line between documents.


def _sentences_of(doc: Document | Sequence[str]) -> tuple[str, ...]:
    return doc.texts if isinstance(doc, Document) else tuple(doc)


def corpus_text(documents: Sequence[Document | Sequence[str]]) -> str:
    """Formats documents as BERT pretraining text (with a trailing newline).

    Raises:
      ValueError: for an empty document or a sentence that is blank, has surrounding whitespace
        or holds a line break, none of which would survive a round trip.
    """
    blocks = []
    for d, doc in enumerate(documents):
        sentences = _sentences_of(doc)
        if not sentences:
            raise ValueError(f"documents[{d}] has no sentences; every document needs at least one")
        for s, sentence in enumerate(sentences):
            well_formed = (isinstance(sentence, str) and sentence.strip()
                           and sentence == sentence.strip() and "\n" not in sentence
                           and "\r" not in sentence)
            if not well_formed:
                raise ValueError(
                    f"documents[{d}] sentence {s} = {sentence!r} must be a non-blank str without "
                    "line breaks or surrounding whitespace (one sentence per line)")
        blocks.append("\n".join(sentences) + "\n")
    return "\n".join(blocks)


def default_corpus_text(seed: int = 0, num_entities: int = DEFAULT_NUM_ENTITIES) -> str:
    """All documents of the default world of `seed`, as BERT pretraining text."""
    return corpus_text(generate_documents(make_world(seed, num_entities), seed=seed))


def write_text_corpus(path: str | os.PathLike, documents: Sequence[Document | Sequence[str]]
                      ) -> None:
    """Writes documents (or lists of sentence strings) to `path` in BERT's format, UTF-8."""
    text = corpus_text(documents)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def read_text_corpus(path: str | os.PathLike) -> list[list[str]]:
    """Reads BERT-format text: documents of stripped sentences.

    Tolerates \\r\\n line ends, a UTF-8 byte-order mark, whitespace-only lines and runs of blank
    lines (all treated as one document break).

    Raises:
      ValueError: naming the file and line of the first invalid UTF-8 byte, or the file when it
        holds no sentences.
    """
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataError(
            f"{os.fspath(path)}:{line}: invalid UTF-8 byte 0x{data[e.start]:02x} at column "
            f"{column}; the corpus must be UTF-8 text (re-encode it, e.g. `iconv -t UTF-8`)"
        ) from None
    documents: list[list[str]] = []
    current: list[str] = []
    # split("\n"), not splitlines(): the latter also breaks on \x0c, \u2028, ... inside sentences.
    for line in text.removeprefix("\ufeff").split("\n"):
        line = line.strip()
        if line:
            current.append(line)
        elif current:
            documents.append(current)
            current = []
    if current:
        documents.append(current)
    if not documents:
        raise DataError(
            f"{os.fspath(path)}: the corpus is empty; expected one sentence per line with a blank "
            "line between documents")
    return documents
