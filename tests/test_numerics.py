"""tests/numerics.assert_close: the bound is each tensor's largest value, so rounding of a
different reduction order passes on small entries, and a real error fails on any entry."""

import numpy as np
import pytest

from tests.numerics import assert_close, assert_params_close

# The gradient leaf of issue 27 in miniature: values up to ~40, one small entry moved by
# 2.4e-5 (~6e-7 of the largest) by another CPU's reduction order.
LEAF = np.array([[40.0, -3.0], [0.05611681938171387, 1.0]], np.float32)
OTHER_CPU = LEAF.copy()
OTHER_CPU[1, 0] = 0.0561407208442688


def test_rounding_of_small_entries_against_the_largest_value_passes():
    with pytest.raises(AssertionError):  # what a bare per-entry tolerance made of it
        np.testing.assert_allclose(OTHER_CPU, LEAF, rtol=2e-5, atol=2e-5)
    assert_close(OTHER_CPU, LEAF, 2e-6)
    assert_close({"a": OTHER_CPU, "b": [LEAF]}, {"a": LEAF, "b": [LEAF]}, 2e-6)


def test_a_real_error_fails_and_names_the_leaf_and_entry():
    wrong = LEAF.copy()
    wrong[1, 0] += 4e-3  # 1e-4 of the largest value
    with pytest.raises(AssertionError, match=r"grads \['w'\]: 1 of 4 entries .* at \(1, 0\)"):
        assert_close({"w": wrong}, {"w": LEAF}, 1e-5, err_msg="grads")


def test_each_leaf_has_its_own_scale():
    small = LEAF * 1e-4  # an error fine for the big leaf is 1e4 times too much here
    with pytest.raises(AssertionError, match=r"\['small'\]"):
        assert_close({"big": LEAF, "small": small + 1e-4},
                     {"big": LEAF + 1e-4, "small": small}, 1e-5)


def test_a_documented_scale_replaces_the_largest_value():
    zeros = np.zeros(3)
    assert_close(zeros + 1e-9, zeros, 1e-6, scale=1.0)
    with pytest.raises(AssertionError):
        assert_close(zeros + 1e-9, zeros, 1e-6)  # its own scale is 0: only exact passes


def test_non_finite_entries_must_match_exactly():
    masked = np.array([-np.inf, 1.0, 2.0])
    assert_close(masked, masked.copy(), 1e-6)
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close(np.array([0.0, 1.0, 2.0]), masked, 1e-6)
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close(np.array([np.nan, 1.0, 2.0]), np.array([0.0, 1.0, 2.0]), 1e-6)


def test_an_array_against_a_list_of_numbers_is_one_tensor():
    assert_close(np.array([1.0, 2.0]), [1.0, 2.0 + 1e-9], 1e-6)
    with pytest.raises(AssertionError):
        assert_close([1.0, 2.1], np.array([1.0, 2.0]), 1e-6)


def test_shapes_and_structures_must_match():
    with pytest.raises(AssertionError, match="shapes differ"):
        assert_close(np.zeros(3), np.zeros(4), 1e-6)
    with pytest.raises(AssertionError, match="trees differ"):
        assert_close({"a": 1.0}, {"b": 1.0}, 1e-6)
    with pytest.raises(AssertionError, match="trees differ"):
        assert_params_close({"a": np.ones(2)}, {"b": np.ones(2)}, 1e-6)


def test_params_hold_the_key_bias_to_the_scale_of_the_whole_tree():
    """A `['key']['bias']` leaf's true gradient is 0: its values are noise of the other leaves'
    sums, held to the largest value of the tree; every other leaf keeps its own scale."""
    noise = np.array([3e-8, -1e-8])
    grads = {"attention": {"key": {"bias": noise, "kernel": LEAF}}, "norm": {"bias": LEAF * 1e-3}}
    moved = {"attention": {"key": {"bias": -noise, "kernel": LEAF}}, "norm": {"bias": LEAF * 1e-3}}
    with pytest.raises(AssertionError, match=r"\['key'\]\['bias'\]"):
        assert_close(moved, grads, 1e-5)
    assert_params_close(moved, grads, 1e-5)
    moved["norm"]["bias"] = LEAF * 1e-3 + 1e-6  # 2.5e-5 of its own scale: still caught
    with pytest.raises(AssertionError, match=r"\['norm'\]\['bias'\]"):
        assert_params_close(moved, grads, 1e-5)


def test_a_boxed_key_bias_is_recognised():
    import flax.linen as nn

    boxed = lambda x: {"key": {"bias": nn.Partitioned(x, names=("kv",))},  # noqa: E731
                       "query": {"kernel": nn.Partitioned(LEAF, names=("embed", "kv"))}}
    assert_params_close(boxed(np.array([3e-8, -1e-8])), boxed(np.array([-3e-8, 1e-8])), 1e-5)


def _compare_the_leaf(other):  # a module's helper: its caller compares floats through it
    assert_close(other, LEAF, 2e-6)


def test_a_test_comparing_through_a_helper_is_marked_numerics(request):
    _compare_the_leaf(OTHER_CPU)
    assert request.node.get_closest_marker("numerics") is not None


def test_a_test_of_the_same_module_that_compares_nothing_is_not_marked(request):
    # CI's reordered step reruns only the marked tests (tests/conftest.py: _compares_floats).
    assert LEAF.shape == (2, 2)
    assert request.node.get_closest_marker("numerics") is None
