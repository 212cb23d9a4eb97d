"""A synthetic multiple-choice set over the world, shaped as zoo.data.readers.multiple_choice reads.

Built from zoo.data.synthetic.classification's fact_check premises: each premise with its
entailed claim, the claim contradicting it and the neutral one, shuffled; the answer is the
entailed claim. The premise decides it, the claims alone do not (fact_check balances every claim
cell across labels). zoo.data.readers.multiple_choice.write_jsonl writes it in the format users'
files have, so it is read back through the same reader.
"""

from __future__ import annotations

import collections
import random

from zoo.data.synthetic.classification import FACT_CHECK_LABELS, classification_splits


def multiple_choice_splits(seed: int = 0, num_entities: int = 2000) -> dict[str, list[dict]]:
    """{'train', 'validation', 'test'}: per fact_check premise, its entailed, contradicting and
    neutral claims as three options in random order; the answer is the entailed claim."""
    rng = random.Random(seed)
    out = {}
    splits = classification_splits(seed, "fact_check", num_entities)
    for split, examples in splits.items():
        claims: dict[str, dict[str, str]] = collections.defaultdict(dict)
        for ex in examples:
            claims[ex["text_a"]][ex["label"]] = ex["text_b"]
        rows = []
        for premise, by_label in claims.items():
            if len(by_label) != len(FACT_CHECK_LABELS):
                continue  # fact_check's balancing trimmed one of its claims
            options = list(by_label.values())
            rng.shuffle(options)
            rows.append({"id": f"multiple_choice-{split}-{len(rows)}", "context": premise,
                         "options": options,
                         "label": str(options.index(by_label["entailment"]))})
        out[split] = rows
    return out
