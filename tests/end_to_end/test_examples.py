"""examples/: the "an apple and an orange" worked example of the Transformer course slides
reproduces the lecture's numbers to two decimals."""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.process_env import process_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FRUIT = ("Orange", "Apple", "And", "An")
PHONE = ("Phone", "Apple", "An")


@pytest.fixture(scope="module")
def apple_orange():
    spec = importlib.util.spec_from_file_location(
        "apple_orange", os.path.join(ROOT, "examples", "apple_orange.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _two(x):
    return np.round(np.asarray(x, np.float64), 2).tolist()


def test_dot_and_scaled_dot_products(apple_orange):
    products = apple_orange.dot_products()
    assert _two(products["dot"]) == [12.0, 3.0, 0.0]
    assert _two(products["scaled_dot"]) == [8.49, 2.12, 0.0]


def test_cosine_similarity_table(apple_orange):
    words = ("Orange", "Phone", "Apple", "And", "An")
    assert _two(apple_orange.cosine_similarities(words)) == [
        [1.0, 0.0, 0.71, 0.0, 0.0],
        [0.0, 1.0, 0.71, 0.0, 0.0],
        [0.71, 0.71, 1.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 1.0, 1.0],
        [0.0, 0.0, 0.0, 1.0, 1.0],
    ]


def test_normalising_breaks_where_the_softmax_does_not(apple_orange):
    assert _two(apple_orange.normalised_without_softmax([1.0, 0.71])) == [0.58, 0.42]
    assert not np.isfinite(apple_orange.normalised_without_softmax([1.0, -1.0])).any()
    assert _two(apple_orange.softmax_weights([1.0, 0.71])) == [0.57, 0.43]
    assert _two(apple_orange.softmax_weights([1.0, -1.0])) == [0.88, 0.12]


def test_mixing_over_related_words(apple_orange):
    fruit = _two(apple_orange.mixing_weights(FRUIT, related_only=True))
    assert fruit[0] == [0.57, 0.43, 0.0, 0.0]  # Orange -> 0.57 Orange + 0.43 Apple
    assert fruit[1] == [0.43, 0.57, 0.0, 0.0]  # Apple -> 0.43 Orange + 0.57 Apple
    assert fruit[2] == fruit[3] == [0.0, 0.0, 0.5, 0.5]  # And, An -> 0.5 And + 0.5 An
    phone = _two(apple_orange.mixing_weights(PHONE, related_only=True))
    assert phone == [[0.57, 0.43, 0.0], [0.43, 0.57, 0.0], [0.0, 0.0, 1.0]]


def test_softmax_over_every_word(apple_orange):
    # Orange -> 0.4 Orange + 0.3 Apple + 0.15 And + 0.15 An (the seed's "real result")
    assert _two(apple_orange.mixing_weights(FRUIT, related_only=False)[0]) == [
        0.4, 0.3, 0.15, 0.15]


def test_apple_moves_toward_fruit_with_orange_and_toward_tech_with_phone(apple_orange):
    apple = np.asarray(apple_orange.EMBEDDINGS["Apple"])  # Tech 2, Fruitness 2
    with_orange = apple_orange.contextual_vector(FRUIT, "Apple")
    with_phone = apple_orange.contextual_vector(PHONE, "Apple")
    # 0.43 Orange + 0.57 Apple and 0.43 Phone + 0.57 Apple
    np.testing.assert_allclose(with_orange, [1.14, 2.43, 0.0], atol=0.01)
    np.testing.assert_allclose(with_phone, [2.86, 1.14, 0.0], atol=0.01)
    assert with_orange[1] > apple[1] and with_orange[0] < apple[0]
    assert with_phone[0] > apple[0] and with_phone[1] < apple[1]


def test_the_script_runs_and_prints_the_seed_numbers():
    env = process_env(1, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "apple_orange.py")],
                         env=env, capture_output=True, text=True, check=True, timeout=300).stdout
    for line in ("Orange -> 0.57 Orange + 0.43 Apple",
                 "Orange -> 0.40 Orange + 0.30 Apple + 0.15 And + 0.15 An",
                 "Apple  -> 0.43 Phone + 0.57 Apple"):
        assert line in out, out
