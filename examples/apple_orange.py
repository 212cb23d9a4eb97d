"""The Transformer course slides' worked example, computed with zoo's attention layers: how
"apple" moves toward "orange" in "an apple and an orange" and toward "phone" in "an apple phone".

    python examples/apple_orange.py

The lecture builds attention by hand from three-feature word embeddings (Tech, Fruitness,
Other): score every pair of words by similarity, turn a word's row of scores into weights with a
softmax, and replace the word by the weighted mix of the sentence's words. Every number below is
the seed's (tests/end_to_end/test_examples.py checks them to two decimals):

  * dot products of (1, 4), (0, 3), (3, 0): 12, 3, 0; scaled by 1/sqrt(2): 8.49, 2.12, 0;
  * cosine similarities: Orange-Apple = Phone-Apple = 0.71, And-An = 1, the rest 0;
  * plain normalisation (1 Orange + 0.71 Apple) / 1.71 = 0.58 Orange + 0.42 Apple, which breaks
    for a similarity of -1 (1 - 1 = 0 in the denominator); the softmax gives 0.57 / 0.43, and
    0.88 Orange + 0.12 Motorcycle for the -1 case;
  * mixing over the related words only (the seed's first pass): Orange -> 0.57 Orange + 0.43
    Apple, Apple -> 0.43 Orange + 0.57 Apple, And -> 0.5 And + 0.5 An; in the other sentence
    Apple -> 0.43 Phone + 0.57 Apple;
  * the real softmax over all four words: Orange -> 0.40 Orange + 0.30 Apple + 0.15 And +
    0.15 An.

The similarity is the seed's cosine: zoo.nn.scoring's dot score on unit-length vectors. "Related
words only" is an attention mask (similarity > 0), so both passes are KeyValueAttention calls.
"""

import numpy as np

import jax.numpy as jnp

from zoo.nn.scoring import DotScore, KeyValueAttention, ScaledDotScore

FEATURES = ("Tech", "Fruitness", "Other")
EMBEDDINGS = {  # the seed's table
    "Orange": (0.0, 3.0, 0.0),
    "Phone": (4.0, 0.0, 0.0),
    "Apple": (2.0, 2.0, 0.0),
    "And": (0.0, 0.0, 2.0),
    "An": (0.0, 0.0, 3.0),
}
# Each sentence's distinct words, in the order of the seed's tables.
SENTENCES = {
    "an apple and an orange": ("Orange", "Apple", "And", "An"),
    "an apple phone": ("Phone", "Apple", "An"),
}


def _batch(vectors) -> jnp.ndarray:
    return jnp.asarray(np.asarray(vectors, np.float32)[None])  # (1, n, d): one "sentence"


def dot_products() -> dict[str, np.ndarray]:
    """The seed's dot-product slides: (1, 4) against (0, 3) and (3, 0), and (0, 3)·(3, 0)."""
    a, b, c = (1.0, 4.0), (0.0, 3.0), (3.0, 0.0)
    queries, keys = _batch([a, a, b]), _batch([b, c, c])
    dot = np.diagonal(np.asarray(DotScore().apply({}, queries, keys))[0])
    scaled = np.diagonal(np.asarray(ScaledDotScore().apply({}, queries, keys))[0])
    return {"dot": dot, "scaled_dot": scaled}


def cosine_similarities(words) -> np.ndarray:
    """[n, n] cosine similarities of the words' embeddings (dot score on unit vectors)."""
    vectors = np.asarray([EMBEDDINGS[w] for w in words], np.float32)
    unit = _batch(vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    return np.asarray(DotScore().apply({}, unit, unit))[0]


def mixing_weights(words, related_only: bool) -> np.ndarray:
    """[n, n] attention weights of each (distinct) word over the others: softmax of the cosine
    similarities, restricted to positively related words when `related_only` (the seed's
    first pass) or over every word of the sentence (its "real result")."""
    vectors = np.asarray([EMBEDDINGS[w] for w in words], np.float32)
    unit = _batch(vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
    mask = cosine_similarities(words)[None] > 0 if related_only else None
    _, weights = KeyValueAttention(score="dot").apply({}, unit, unit, _batch(vectors), mask)
    return np.asarray(weights)[0]


def contextual_vector(words, word: str, related_only: bool = True) -> np.ndarray:
    """`word`'s embedding after attention among the (distinct) `words`: sum_n alpha_n x_n."""
    vectors = np.asarray([EMBEDDINGS[w] for w in words], np.float64)
    return mixing_weights(words, related_only)[words.index(word)] @ vectors


def normalised_without_softmax(similarities) -> np.ndarray:
    """The seed's first attempt: weights s_n / sum s (undefined when the sum is 0)."""
    s = np.asarray(similarities, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return s / s.sum()


def softmax_weights(similarities) -> np.ndarray:
    _, weights = KeyValueAttention(score="dot").apply(
        {}, _batch([[1.0]]), _batch([[s] for s in similarities]))  # scores = the similarities
    return np.asarray(weights)[0, 0]


def _row(name, weights, words) -> str:
    terms = " + ".join(f"{w:.2f} {x}" for w, x in zip(weights, words) if w > 0)
    return f"  {name:<6} -> {terms}"


def main() -> None:
    d = dot_products()
    print("dot products (1,4)·(0,3), (1,4)·(3,0), (0,3)·(3,0):", np.round(d["dot"], 2),
          " scaled by 1/sqrt(2):", np.round(d["scaled_dot"], 2))
    words = tuple(EMBEDDINGS)
    print("\ncosine similarities", words)
    for w, row in zip(words, cosine_similarities(words)):
        print(f"  {w:<6}", " ".join(f"{x:5.2f}" for x in row))
    print("\nOrange with Apple (0.71) and with Motorcycle (-1):")
    print("  s / sum s:", np.round(normalised_without_softmax([1.0, 0.71]), 2),
          np.round(normalised_without_softmax([1.0, -1.0]), 2), "(divides by zero)")
    print("  softmax:  ", np.round(softmax_weights([1.0, 0.71]), 2),
          np.round(softmax_weights([1.0, -1.0]), 2))
    for sentence, words in SENTENCES.items():
        print(f"\n\"{sentence}\": mixing over related words")
        for w, row in zip(words, mixing_weights(words, related_only=True)):
            print(_row(w, row, words))
        print("  over every word:")
        for w, row in zip(words, mixing_weights(words, related_only=False)):
            print(_row(w, row, words))
    print("\nApple's embedding", dict(zip(FEATURES, EMBEDDINGS["Apple"])), "moves:")
    for sentence, words in SENTENCES.items():
        v = contextual_vector(words, "Apple")
        print(f"  in \"{sentence}\": " + ", ".join(f"{f} {x:.2f}" for f, x in zip(FEATURES, v)))


if __name__ == "__main__":
    main()
