"""A seeded, offline "world": the default data of every quickstart, test and demo.

There is no network here, so TFDS text corpora and hub datasets cannot be fetched. Instead a small
world of invented people, cities, countries, languages and companies (plus real-word colors,
foods, animals, professions and products) is generated from a seed, and documents
(zoo.data.synthetic.documents) state its facts in English sentences drawn from several templates
per relation::

    Lomira was born in Tavesh. She works as a baker and has a pet dog. Lomira is the mayor of Orvin.

This module holds the world itself: entity types, relations with their templates, and
`make_world`, which invents entities and facts that are consistent with each other.

Why it looks like this:
  * Language modelling: templates, consistent facts and relational regularities (a person speaks
    the language of the country they were born in) give text far more predictable than its word
    frequencies: a bigram model already has ~6x lower held-out perplexity than a unigram one
    (24 vs 136 on the default corpus), leaving a Transformer plenty to learn.
  * BERT pretraining: every document is about one entity, so consecutive sentences are coherent
    and next-sentence prediction is learnable; zoo.data.readers.text_files writes BERT's format.
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
import random
import re
from typing import NamedTuple

from zoo.errors import ConfigError

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

# (subject, possessive) pronouns by gender: what documents call an entity, and words that
# invented names must not collide with.
PRONOUNS = {"female": ("She", "Her"), "male": ("He", "His"), None: ("It", "Its")}


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

# ---------------------------------------------------------------------------------------------
# World


def _reserved_words() -> frozenset[str]:
    """Lower-case words used by templates and value types: invented names must avoid them."""
    words = set(re.findall(r"[a-z]+", " ".join(
        t.lower() for r in RELATIONS.values() for t in r.templates)))
    for values in VALUE_WORDS.values():
        words.update(values)
    words.update(w.lower() for pair in PRONOUNS.values() for w in pair)
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
