import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.nn import masks


def test_causal_mask_square_is_lower_triangular():
    m = masks.causal_mask(4, batch=2)
    assert m.shape == (2, 1, 4, 4) and m.dtype == jnp.bool_
    expected = np.array(
        [[1, 0, 0, 0],
         [1, 1, 0, 0],
         [1, 1, 1, 0],
         [1, 1, 1, 1]], bool)
    np.testing.assert_array_equal(m[0, 0], expected)
    np.testing.assert_array_equal(m[1, 0], expected)


def test_causal_mask_queries_are_the_last_positions_when_keys_are_longer():
    # 2 new queries after 3 cached positions: query 0 is position 3, query 1 is position 4.
    m = masks.causal_mask(2, 5)
    expected = np.array(
        [[1, 1, 1, 1, 0],
         [1, 1, 1, 1, 1]], bool)
    np.testing.assert_array_equal(m[0, 0], expected)


def test_causal_mask_rejects_fewer_keys_than_queries():
    with pytest.raises(ValueError, match="q_len"):
        masks.causal_mask(4, 3)


def test_padding_mask_from_ids():
    ids = np.array([[5, 3, 0], [7, 0, 0]])
    valid = masks.valid_from_ids(ids)
    np.testing.assert_array_equal(valid, [[1, 1, 0], [1, 0, 0]])
    m = masks.padding_mask(valid)
    assert m.shape == (2, 1, 3, 3)
    expected0 = np.array([[1, 1, 0], [1, 1, 0], [0, 0, 0]], bool)
    expected1 = np.array([[1, 0, 0], [0, 0, 0], [0, 0, 0]], bool)
    np.testing.assert_array_equal(m[0, 0], expected0)
    np.testing.assert_array_equal(m[1, 0], expected1)


def test_padding_mask_cross_attention_and_custom_pad_id():
    q_valid = masks.valid_from_ids(np.array([[1, 1]]), pad_id=-1)
    k_valid = masks.valid_from_ids(np.array([[4, -1, 6, -1]]), pad_id=-1)
    m = masks.padding_mask(q_valid, k_valid)
    assert m.shape == (1, 1, 2, 4)
    np.testing.assert_array_equal(m[0, 0], [[1, 0, 1, 0], [1, 0, 1, 0]])


def test_padding_mask_rejects_non_boolean_validity():
    with pytest.raises(ValueError, match="boolean"):
        masks.padding_mask(np.array([[5, 3, 0]]))


def test_segment_mask_hand_built():
    seg = np.array([[1, 1, 2, 2, 0]])
    m = masks.segment_mask(seg)
    expected = np.array(
        [[1, 1, 0, 0, 0],
         [1, 1, 0, 0, 0],
         [0, 0, 1, 1, 0],
         [0, 0, 1, 1, 0],
         [0, 0, 0, 0, 0]], bool)
    assert m.shape == (1, 1, 5, 5)
    np.testing.assert_array_equal(m[0, 0], expected)


def test_segment_mask_never_crosses_documents():
    rng = np.random.default_rng(0)
    seg = np.sort(rng.integers(0, 4, size=(3, 12)), axis=1)[:, ::-1]  # packed, padding (0) last
    m = np.asarray(masks.segment_mask(seg))[:, 0]
    same = seg[:, :, None] == seg[:, None, :]
    real = (seg[:, :, None] != 0) & (seg[:, None, :] != 0)
    np.testing.assert_array_equal(m, same & real)
    # Packed + causal: still never crosses a document, and a document's first token sees itself.
    both = np.asarray(masks.combine_masks(masks.segment_mask(seg), masks.causal_mask(12)))[:, 0]
    assert not np.any(both & ~same)
    assert np.all(np.diagonal(both, axis1=1, axis2=2) == (seg != 0))


def test_combine_masks_is_and_with_broadcast_ignoring_none():
    assert masks.combine_masks(None, None) is None
    causal = masks.causal_mask(3)  # (1, 1, 3, 3)
    pad = masks.padding_mask(np.array([[True, True, False], [True, False, False]]))  # (2, 1, 3, 3)
    out = masks.combine_masks(None, causal, pad, None)
    assert out.shape == (2, 1, 3, 3)
    np.testing.assert_array_equal(out, np.asarray(causal) & np.asarray(pad))
    np.testing.assert_array_equal(masks.combine_masks(pad), pad)


def test_combine_masks_rejects_additive_masks():
    with pytest.raises(ValueError, match="boolean"):
        masks.combine_masks(masks.causal_mask(3), jnp.zeros((1, 1, 3, 3)))


def test_masked_softmax_zero_rows_and_finite_gradient():
    logits = jnp.asarray(np.random.default_rng(1).normal(size=(2, 3, 4)), jnp.float32)
    mask = np.array([[[1, 0, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]],
                     [[0, 0, 0, 1], [1, 1, 0, 0], [0, 0, 0, 0]]], bool)
    w = masks.masked_softmax(logits, mask)
    lg = np.asarray(logits, np.float64)
    e = np.where(mask, np.exp(lg - lg.max(-1, keepdims=True)), 0.0)
    den = e.sum(-1, keepdims=True)
    expected = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
    assert_close(w, expected, 1e-5)
    np.testing.assert_array_equal(np.asarray(w)[~mask], 0.0)
    grad = jax.grad(lambda x: jnp.sum(masks.masked_softmax(x, mask) ** 2))(logits)
    assert np.all(np.isfinite(grad))
    np.testing.assert_array_equal(np.asarray(grad)[0, 1], 0.0)  # a fully-masked row is inert


# ---- MaskSpec: the same masks, described ----------------------------------------------------


def test_mask_spec_dense_equals_the_builders():
    segments = jnp.array([[1, 1, 2, 2, 2, 0], [3, 3, 3, 3, 0, 0]])
    valid = segments != 0
    spec = masks.MaskSpec.self_attention(segments, causal=True, packed=True)
    want = masks.combine_masks(masks.causal_mask(6, batch=2), masks.segment_mask(segments))
    np.testing.assert_array_equal(spec.dense(6, 6), want)
    np.testing.assert_array_equal(masks.MaskSpec.self_attention(valid).dense(6, 6),
                                  masks.padding_mask(valid))
    np.testing.assert_array_equal(masks.MaskSpec.self_attention(causal=True).dense(3, 5),
                                  masks.causal_mask(3, 5))
    k_valid = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0]], bool)
    np.testing.assert_array_equal(masks.MaskSpec.key_padding(k_valid).dense(2, 4),
                                  jnp.broadcast_to(k_valid[:, None, None, :], (2, 1, 2, 4)))


def test_mask_spec_window_by_hand():
    both = np.asarray(masks.MaskSpec.self_attention(window=(2, 1)).dense(5, 5))[0, 0]
    i, j = np.indices((5, 5))
    np.testing.assert_array_equal(both, (j >= i - 2) & (j <= i + 1))
    causal = np.asarray(masks.MaskSpec.self_attention(causal=True, window=2).dense(5, 5))[0, 0]
    np.testing.assert_array_equal(causal, (j >= i - 2) & (j <= i))
    # A single number without causal is that many keys either side.
    assert masks.MaskSpec.self_attention(window=3).window == (3, 3)


def test_mask_spec_queries_with_a_key():
    segments = jnp.array([[1, 1, 0], [2, 0, 0]])
    spec = masks.MaskSpec.self_attention(segments, causal=True)
    np.testing.assert_array_equal(spec.query_has_key(3, 3), segments != 0)
    keys = masks.MaskSpec.key_padding(jnp.array([[1, 0], [0, 0]], bool))
    np.testing.assert_array_equal(keys.query_has_key(3, 2), [[True], [False]])
    assert masks.MaskSpec.self_attention(causal=True).query_has_key(4, 4) is None


def test_mask_spec_bad_inputs():
    with pytest.raises(ValueError, match="window"):
        masks.MaskSpec.self_attention(window=(-1, 2))
    with pytest.raises(ValueError, match="int or bool"):
        masks.MaskSpec.self_attention(jnp.ones((2, 3), jnp.float32))
    with pytest.raises(ValueError, match="length 3"):
        masks.MaskSpec.self_attention(jnp.ones((2, 3), jnp.int32)).dense(4, 4)
    with pytest.raises(ValueError, match="q_len <= k_len"):
        masks.MaskSpec.self_attention(causal=True).dense(5, 4)
