"""Labelled sentence(-pair) classification sets over the synthetic world, written as GLUE-style
TSV or JSON Lines so they go through the same loader (zoo.data.readers.classification) as users'
files.

Two tasks:

* `relation` (single sentence, SST/CoLA-shaped): a document sentence stating exactly one fact,
  labelled with that fact's relation (19 classes). Sentences are taken as the documents have
  them, so "She keeps a canary at home." must be read for its verb phrase, not its subject.
* `fact_check` (sentence pair, MNLI/RTE-shaped): a premise of 1-3 consecutive sentences of one
  document and a claim "<subject> <relation phrase> <object>." about it, labelled

  - `entailment`: the premise states the claim's fact;
  - `contradiction`: the premise states the fact with another object, and the relation is
    functional (Lomira lives in one city), so the claim is false;
  - `neutral`: the claim is about an entity the premise names, with a relation the premise
    neither states nor implies by the world's rules; the claim is true or false in the world
    (half each), which the premise cannot tell.

  Claims always name their subject (the premise may say "She"), and use a different template
  than the premise's statement, so matching needs more than copying. The premise decides the
  label, the claim alone must not: every (relation, claim template) cell holds the same number
  of claims of each label, wrong objects are drawn from the objects that relation takes in the
  world (so a wrong age looks like a real one), and neutral claims are half true. The classes
  are therefore exactly balanced.

A third, `binding` (sentence pair), is the one where a word's context decides the label: the
premise states where a person was born and where they live, two different cities, in either
order ("Lomira was born in Fagagirmar. Lomira's home is in Stoukron."); the claim attaches one
of the two cities to one of the two relations ("Lomira comes from Stoukron."): `entailment` if
the premise binds them so, else `contradiction`. Every premise comes with all four claims, so the
labels are balanced and the claim alone tells nothing; and the premise always holds both cities
and both relations' words, so a bag of (static) word vectors cannot tell the answer either: only
which relation's words surround each city can.

Everything is keyed off an explicit seed through `random.Random`, iterating only ordered
containers, so equal seeds give equal datasets in every process.
"""

from __future__ import annotations

import collections
import json
import os
import random
from collections.abc import Collection, Iterable, Sequence

from zoo.data.synthetic.documents import Document, Sentence, corpus_splits
from zoo.data.synthetic.world import (
    DEFAULT_NUM_ENTITIES,
    NUMBER,
    RELATIONS,
    Fact,
    World,
    make_world,
)
from zoo.errors import ConfigError

TASKS = ("relation", "fact_check", "binding")
BINDING_LABELS = ("entailment", "contradiction")
_BINDING_RELATIONS = ("born_in", "lives_in")  # a person's two facts with a city as object
FACT_CHECK_LABELS = ("entailment", "contradiction", "neutral")
_MAX_PREMISE_SENTENCES = 3
_TSV_COLUMNS = {False: ("id", "sentence", "label"), True: ("id", "sentence1", "sentence2", "label")}
_FORBIDDEN = ("\t", "\n", "\r")  # a TSV field cannot hold them


# ---------------------------------------------------------------------------------------------
# Reading the documents


def _template_index(sentence: Sentence, fact: Fact) -> int | None:
    """Which of the relation's templates states `fact` in `sentence` (None if unclear).

    The sentence may say "She"/"Her" for the subject and coordinate two facts ("X lives in Y and
    works as a Z."), so each template is matched by its literal text around the subject, with
    the object filled in.
    """
    matches = []
    for i, template in enumerate(RELATIONS[fact.relation].templates):
        before, after = template.removesuffix(".").replace("{o}", fact.object).split("{s}")
        # A possessive template loses its "'s" after a pronoun ("Her favourite color is red").
        after = after.removeprefix("'s")
        if before in sentence.text and after in sentence.text:
            matches.append(i)
    return matches[0] if len(matches) == 1 else None


def _named(sentences: Iterable[Sentence]) -> list[str]:
    """Entities the sentences call by name (not "She"), in order of first mention."""
    names: list[str] = []
    for sentence in sentences:
        for fact, subject_span in zip(sentence.facts, sentence.subject_spans):
            if subject_span is not None:
                names.append(fact.subject)
            if RELATIONS[fact.relation].object_type != NUMBER:
                names.append(fact.object)
    return list(dict.fromkeys(names))


def _windows(document: Document, rng: random.Random) -> list[tuple[Sentence, ...]]:
    """Consecutive runs of 1-3 sentences in document order, none starting with a pronoun (so
    every "She" in a premise has its antecedent inside it)."""
    sentences = document.sentences
    out, start = [], 0
    while start < len(sentences):
        end = min(len(sentences), start + rng.randint(1, _MAX_PREMISE_SENTENCES))
        while (end < len(sentences) and sentences[end].subject_spans[0] is None
               and end - start < _MAX_PREMISE_SENTENCES):
            end += 1  # keep a pronoun sentence with its antecedent
        out.append(sentences[start:end])
        start = end
        while start < len(sentences) and sentences[start].subject_spans[0] is None:
            start += 1  # a pronoun sentence whose antecedent is in a full window: leave it out
    return out


# ---------------------------------------------------------------------------------------------
# What a premise implies


def _closure(facts: Iterable[Fact]) -> dict[tuple[str, str], set[str]]:
    """(subject, relation) -> objects stated or implied by `facts` under the world's rules.

    make_world guarantees: a country's capital lies in it, a mayor lives in their city, a
    founder works for the company, `knows` is mutual, and a person speaks the language of the
    country of their birthplace.
    """
    known: dict[tuple[str, str], set[str]] = {}
    pending = list(facts)
    while pending:
        fact = pending.pop()
        objects = known.setdefault((fact.subject, fact.relation), set())
        if fact.object in objects:
            continue
        objects.add(fact.object)
        s, r, o = fact
        new = []
        if r == "capital":
            new.append(Fact(o, "located_in", s))
        elif r == "mayor":
            new.append(Fact(o, "lives_in", s))
        elif r == "founded_by":
            new.append(Fact(o, "works_for", s))
        elif r == "knows":
            new.append(Fact(o, "knows", s))
        # speaks = language(located_in(born_in)): re-derived whenever one of its links arrives.
        for (p, rel), cities in list(known.items()):
            if rel != "born_in":
                continue
            for city in cities:
                for country in known.get((city, "located_in"), ()):
                    new.extend(Fact(p, "speaks", lang)
                               for lang in known.get((country, "language"), ()))
        pending.extend(f for f in new if f.object not in known.get((f.subject, f.relation), ()))
    return known


def _consistent(known: dict[tuple[str, str], set[str]]) -> bool:
    return all(len(objects) <= 1 for (_, relation), objects in known.items()
               if RELATIONS[relation].functional)


# ---------------------------------------------------------------------------------------------
# The tasks


def _claim(relation: str, template: int, subject: str, obj: str) -> str:
    return RELATIONS[relation].templates[template].format(s=subject, o=obj)


def _relation_examples(documents: Sequence[Document], exclude: Collection[str]) -> list[dict]:
    examples, seen = [], set(exclude)
    for document in documents:
        for sentence in document.sentences:
            # A sentence stated in several documents ("She has a pet dog.") is one example.
            if len(sentence.facts) == 1 and sentence.text not in seen:
                seen.add(sentence.text)
                examples.append({"text_a": sentence.text, "text_b": None,
                                 "label": sentence.facts[0].relation})
    return examples


def _relation_objects(world: World) -> dict[str, list[str]]:
    """Relation -> the distinct objects it takes in the world (world order): wrong objects are
    drawn from these, so they are distributed like right ones."""
    objects: dict[str, dict[str, None]] = {name: {} for name in RELATIONS}
    for fact in world.facts:
        objects[fact.relation][fact.object] = None
    return {name: list(values) for name, values in objects.items()}


def _fact_check_examples(world: World, documents: Sequence[Document], rng: random.Random,
                         exclude: Collection[str]) -> list[dict]:
    """One claim of each label per premise, MNLI-style, so the premise alone tells nothing.

    The entailed claim is a random stated fact; the contradicting and neutral claims are then
    picked, among the premise's options, from the (relation, template) cell where their label
    lags furthest behind entailment, so the claims' cells end up distributed alike across
    labels; a final trim makes every cell's counts equal, so the claim alone tells nothing.
    """
    objects = _relation_objects(world)
    counts = {label: collections.Counter() for label in FACT_CHECK_LABELS}  # label -> cell -> n
    chosen: list[tuple[str, str, tuple[str, int], str]] = []  # (premise, label, cell, claim)
    seen = set(exclude)

    def wrong_object(subject: str, relation: str, premise: Sequence[Fact] | None) -> str | None:
        """An object of `relation` other than the world's; with `premise`, one that no rule
        chain from the premise rules out (else the claim would be a contradiction)."""
        right = world.objects(subject, relation)
        candidates = [o for o in objects[relation] if o not in right]
        rng.shuffle(candidates)
        for obj in candidates[:8]:  # the first almost always does
            if premise is None or _consistent(_closure([*premise, Fact(subject, relation, obj)])):
                return obj
        return None

    def by_deficit(options: list, label: str) -> list:
        """Options, the cells where `label` lags entailment most first (ties in random order)."""
        options = list(options)
        rng.shuffle(options)
        options.sort(key=lambda o: counts[label][o[0]] - counts["entailment"][o[0]])
        return options

    for document in documents:
        for window in _windows(document, rng):
            premise = " ".join(s.text for s in window)
            if premise in seen:
                continue
            seen.add(premise)
            premise_facts = [f for s in window for f in s.facts]
            known = _closure(premise_facts)
            # (cell, subject, stated object) per way of restating a fact in another template.
            stated = []
            for sentence in window:
                for fact in sentence.facts:
                    if not RELATIONS[fact.relation].functional:
                        continue  # "X knows Y" is never contradicted by "X knows Z"
                    used = _template_index(sentence, fact)
                    stated.extend(((fact.relation, t), fact.subject, fact.object)
                                  for t in range(len(RELATIONS[fact.relation].templates))
                                  if t != used)
            # (cell, subject) per unstated, unimplied relation of an entity the premise names.
            unstated = []
            for name in _named(window):
                type_ = world.entity(name).type
                unstated.extend(((relation.name, t), name)
                                for relation in RELATIONS.values()
                                if relation.subject_type == type_ and relation.functional
                                and (name, relation.name) not in known
                                for t in range(len(relation.templates)))
            if not stated or not unstated:
                continue  # the premise cannot carry all three labels

            claims = {}
            cell, subject, obj = rng.choice(stated)
            claims["entailment"] = cell, _claim(*cell, subject, obj)
            counts["entailment"][cell] += 1
            for cell, subject, _ in by_deficit(stated, "contradiction"):
                # Any other object contradicts a functional relation's stated one.
                obj = wrong_object(subject, cell[0], None)
                if obj is not None:
                    claims["contradiction"] = cell, _claim(*cell, subject, obj)
                    break
            for cell, subject in by_deficit(unstated, "neutral"):
                right = world.objects(subject, cell[0])
                # True or false in the world, half each; a false object must be one the
                # premise cannot rule out by a rule chain.
                obj = (right[0] if right and rng.random() < 0.5
                       else wrong_object(subject, cell[0], premise_facts))
                if obj is not None:
                    claims["neutral"] = cell, _claim(*cell, subject, obj)
                    break
            for label, (cell, claim) in claims.items():
                if label != "entailment":
                    counts[label][cell] += 1
                chosen.append((premise, label, cell, claim))

    # Trim every cell to the same count per label, dropping random surplus claims.
    keep = {cell: min(counts[label][cell] for label in FACT_CHECK_LABELS)
            for cell in counts["entailment"]}
    order = list(range(len(chosen)))
    rng.shuffle(order)
    taken: collections.Counter = collections.Counter()
    examples = []
    for i in order:
        premise, label, cell, claim = chosen[i]
        if taken[label, cell] < keep.get(cell, 0):
            taken[label, cell] += 1
            examples.append({"text_a": premise, "text_b": claim, "label": label})
    return examples


def _binding_examples(world: World, documents: Sequence[Document], rng: random.Random,
                      exclude: Collection[str]) -> list[dict]:
    """Four claims per person document whose birthplace and home differ (module docstring)."""
    examples, seen = [], set(exclude)
    for document in documents:
        person = document.subject
        if world.entity(person).type != "person":
            continue
        cities = {r: world.objects(person, r) for r in _BINDING_RELATIONS}
        if any(len(c) != 1 for c in cities.values()):
            continue
        cities = {r: c[0] for r, c in cities.items()}
        if len(set(cities.values())) < 2:
            continue
        order = list(_BINDING_RELATIONS)
        rng.shuffle(order)  # which fact comes first says nothing
        templates = {r: rng.randrange(len(RELATIONS[r].templates)) for r in order}
        premise = " ".join(_claim(r, templates[r], person, cities[r]) for r in order)
        if premise in seen:
            continue
        seen.add(premise)
        for relation in _BINDING_RELATIONS:
            # The claim says it another way than the premise did.
            others = [i for i in range(len(RELATIONS[relation].templates))
                      if i != templates[relation]]
            for city in cities.values():
                claim = _claim(relation, rng.choice(others), person, city)
                label = BINDING_LABELS[0] if cities[relation] == city else BINDING_LABELS[1]
                examples.append({"text_a": premise, "text_b": claim, "label": label})
    return examples


def classification_dataset(world: World, documents: Sequence[Document], task: str,
                           seed: int = 0, *, exclude_texts: Collection[str] = (),
                           id_prefix: str = "") -> list[dict]:
    """Labelled examples of `task` over `documents`, as `read_examples` returns them.

    Args:
      world: the world the documents were written from.
      documents: from `generate_documents` (or `corpus_splits`).
      task: 'relation', 'fact_check' or 'binding' (see the module docstring).
      seed: drives premises, templates, wrong objects and the sampling; equal seeds give equal
        datasets.
      exclude_texts: sentences / premises never to use (those of another split).
      id_prefix: ids are '<id_prefix>-<n>'; '' means the task name.

    Returns:
      [{"id", "text_a", "text_b" (None for 'relation'), "label"}], each text_a (and text_b
      pair) once.
    """
    if task not in TASKS:
        raise ConfigError(f"task={task!r} must be one of {TASKS}")
    if task == "relation":
        examples = _relation_examples(documents, exclude_texts)
    elif task == "binding":
        examples = _binding_examples(world, documents, random.Random(seed), exclude_texts)
    else:
        examples = _fact_check_examples(world, documents, random.Random(seed), exclude_texts)
    prefix = id_prefix or task
    width = len(str(max(len(examples) - 1, 0)))
    return [{"id": f"{prefix}-{i:0{width}d}", **ex} for i, ex in enumerate(examples)]


def classification_splits(seed: int = 0, task: str = "fact_check",
                          num_entities: int = DEFAULT_NUM_ENTITIES) -> dict[str, list[dict]]:
    """`task`'s examples over the disjoint document splits of `corpus_splits(seed, num_entities)`.

    Returns {'train', 'validation', 'test'} -> examples. The splits share the world (facts
    recur) but no sentence (relation) or premise (fact_check): a text another split already
    used, which documents about different entities can share, is left out of the later split.
    """
    world = make_world(seed, num_entities)
    used: set[str] = set()
    out = {}
    for name, documents in corpus_splits(seed, num_entities).items():
        out[name] = classification_dataset(world, documents, task, seed, exclude_texts=used,
                                           id_prefix=f"{task}-{name}")
        used.update(ex["text_a"] for ex in out[name])
    return out


# ---------------------------------------------------------------------------------------------
# Writing


def _checked_columns(examples: Sequence[dict], path: str) -> tuple[bool, bool]:
    """(pairs, labelled) after checking every example would read back unchanged."""
    if not examples:
        raise ValueError(f"{path}: no examples to write; a file needs at least one")
    pairs = examples[0]["text_b"] is not None
    labelled = examples[0]["label"] is not None
    ids = set()
    for ex in examples:
        where = f"example {ex['id']!r}"
        if (ex["text_b"] is not None) != pairs or (ex["label"] is not None) != labelled:
            raise ValueError(f"{path}: {where} differs from the first example in having a "
                             "text_b or a label; one file holds one kind of example")
        if not isinstance(ex["id"], str) or not ex["id"] or ex["id"] in ids:
            raise ValueError(f"{path}: {where}: ids must be unique non-empty strings")
        ids.add(ex["id"])
        if not isinstance(ex["text_a"], str) or not ex["text_a"].strip():
            raise ValueError(f"{path}: {where} has a blank text_a, which the reader skips")
        for key in ("text_a", "text_b", "label"):
            value = ex[key]
            if value is not None and (not isinstance(value, str) or value == ""):
                raise ValueError(f"{path}: {where}: {key} must be a non-empty string or None")
    return pairs, labelled


def write_examples(path: str | os.PathLike, examples: Sequence[dict], *,
                   file_format: str = "") -> None:
    """Writes examples as GLUE-style TSV (id, sentence or sentence1 + sentence2, label) or JSON
    Lines (the same keys), UTF-8; `read_examples` reads them back equal, ids included. A file
    of unlabelled examples has no label column.

    Args:
      path: where to write.
      examples: dicts with id, text_a, text_b, label (from `classification_dataset`).
      file_format: 'tsv' or 'jsonl'; '' picks it from the extension of `path` (.tsv, or .jsonl /
        .json), which a temporary name such as 'train.tsv.tmp-123' lacks.

    Raises:
      ValueError: for an unknown format, no examples, a text holding a tab or line break (TSV
        cannot quote it), or examples that would not read back equal.
    """
    path = os.fspath(path)
    if not file_format:
        extension = os.path.splitext(path)[1].lower()
        file_format = {".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}.get(extension, "")
        if not file_format:
            raise ValueError(f"{path}: cannot tell the format from the extension; name the file "
                             ".tsv or .jsonl, or pass file_format='tsv' / 'jsonl'")
    elif file_format not in ("tsv", "jsonl"):
        raise ValueError(f"file_format={file_format!r} must be 'tsv', 'jsonl' or '' (from the "
                         "extension)")
    pairs, labelled = _checked_columns(examples, path)
    columns = [c for c in _TSV_COLUMNS[pairs] if c != "label" or labelled]
    keys = ["id", "text_a", "text_b", "label"][: 2 + pairs] + ["label"] * labelled
    lines = []
    if file_format == "tsv":
        lines.append("\t".join(columns))
        for ex in examples:
            fields = [ex[k] for k in keys]
            bad = next((f for f in fields if any(c in f for c in _FORBIDDEN)), None)
            if bad is not None:
                raise ValueError(f"{path}: example {ex['id']!r} has a tab or line break in "
                                 f"{bad!r:.80}, which a TSV row cannot hold; write .jsonl")
            lines.append("\t".join(fields))
    else:
        lines.extend(json.dumps(dict(zip(columns, (ex[k] for k in keys))), ensure_ascii=False)
                     for ex in examples)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
