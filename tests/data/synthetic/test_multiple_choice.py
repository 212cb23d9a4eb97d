"""The synthetic multiple-choice set: one option per fact_check label of a premise, the answer
the entailed claim, its position shuffled."""

import collections

from zoo.data.synthetic.classification import FACT_CHECK_LABELS, classification_splits
from zoo.data.synthetic.multiple_choice import multiple_choice_splits


def test_synthetic_set_asks_for_the_entailed_claim_among_the_premises_claims():
    splits = multiple_choice_splits(0, 100)
    fact_check = classification_splits(0, "fact_check", 100)
    for split in ("train", "validation"):
        label_of = {(ex["text_a"], ex["text_b"]): ex["label"] for ex in fact_check[split]}
        examples = splits[split]
        assert examples
        for ex in examples:
            labels = [label_of[ex["context"], option] for option in ex["options"]]
            # One option per fact_check label, and the answer is the entailed one.
            assert sorted(labels) == sorted(FACT_CHECK_LABELS)
            assert labels[int(ex["label"])] == "entailment"
    # Shuffled: the answer's position carries (almost) no information.
    positions = collections.Counter(ex["label"] for ex in splits["train"])
    assert set(positions) == {"0", "1", "2"}
    assert max(positions.values()) < 0.45 * len(splits["train"])
