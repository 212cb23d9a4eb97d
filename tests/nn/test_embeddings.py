"""Embeddings: the sinusoidal closed form, and every learned lookup equals gathering its table."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.nn.embeddings import (
    Embed,
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    TokenSegmentPositionEmbedding,
    sinusoidal_encoding,
    sinusoidal_table,
)


def _closed_form(length, d):
    """P[i, 2j] = sin(i / 10000^(2j/d)), P[i, 2j+1] = cos(i / 10000^(2j/d)), element by element."""
    p = np.zeros((length, d), np.float64)
    for i in range(length):
        for k in range(d):
            two_j = k - (k % 2)
            angle = i / 10000.0 ** (two_j / d)
            p[i, k] = np.sin(angle) if k % 2 == 0 else np.cos(angle)
    return p


@pytest.mark.parametrize("d", [8, 7])
def test_sinusoidal_table_is_the_interleaved_closed_form(d):
    table = sinusoidal_table(12, d)
    assert table.shape == (12, d) and table.dtype == np.float32
    assert_close(table, _closed_form(12, d), 1e-6)
    # Position 0 is sin(0), cos(0), ... = 0, 1, 0, 1; position 1 starts with sin(1), cos(1).
    np.testing.assert_array_equal(table[0], np.arange(d) % 2)
    assert_close(table[1, :2], np.array([np.sin(1.0), np.cos(1.0)]), 1e-7)


def test_sinusoidal_offset_is_a_fixed_linear_map():
    # The paper's motivation: P[i + k] is a linear function (a rotation per sin/cos pair) of
    # P[i], the same for every i. Fit that map for k = 3 and check it explains every row.
    table = sinusoidal_table(40, 8).astype(np.float64)
    k = 3
    m, *_ = np.linalg.lstsq(table[:-k], table[k:], rcond=None)
    assert_close(table[:-k] @ m, table[k:], 1e-5)


def test_sinusoidal_encoding_of_traced_positions_matches_table():
    positions = jnp.array([[0, 1, 2, 0, 1], [5, 6, 7, 8, 9]])
    got = jax.jit(lambda p: sinusoidal_encoding(p, 6))(positions)
    assert_close(got, sinusoidal_table(10, 6)[np.asarray(positions)], 1e-6)


def test_sinusoidal_module_adds_table_at_default_packed_and_decode_positions():
    x = jax.random.normal(jax.random.key(0), (2, 5, 6))
    table = sinusoidal_table(16, 6)
    module = SinusoidalPositionalEncoding()
    assert_close(module.apply({}, x), x + table[:5], 1e-6)
    # Packed rows: each sequence restarts at position 0.
    packed = np.array([[0, 1, 2, 0, 1], [0, 1, 0, 1, 2]])
    assert_close(module.apply({}, x, packed), x + table[packed], 1e-6)

    # decode=True: init sizes nothing but starts the counter; each call continues from it.
    decoder = SinusoidalPositionalEncoding(decode=True)
    variables = decoder.init(jax.random.key(1), x)
    outs = []
    for t in range(5):
        y, variables = decoder.apply(variables, x[:, t : t + 1], mutable=["cache"])
        outs.append(y)
    assert_close(jnp.concatenate(outs, axis=1), x + table[:5], 1e-6)


def test_learned_positional_embedding_adds_gathered_rows():
    x = jax.random.normal(jax.random.key(0), (2, 4, 8))
    module = LearnedPositionalEmbedding(max_length=6, features=8)
    variables = module.init(jax.random.key(1), x)
    assert nn.get_partition_spec(variables)["params"]["embedding"] == jax.P("position", "embed")
    table = np.asarray(nn.unbox(variables)["params"]["embedding"])
    assert_close(module.apply(variables, x), x + table[:4], 1e-7)
    positions = np.array([[0, 1, 0, 1], [5, 4, 3, 2]])
    assert_close(module.apply(variables, x, positions), x + table[positions], 1e-7)

    # decode=True continues from a running offset.
    decoder = LearnedPositionalEmbedding(max_length=6, features=8, decode=True)
    cache = decoder.init(jax.random.key(1), x)["cache"]
    steps = []
    for t in range(4):
        y, mutated = decoder.apply(
            {**variables, "cache": cache}, x[:, t : t + 1], mutable=["cache"]
        )
        cache = mutated["cache"]
        steps.append(y)
    assert_close(jnp.concatenate(steps, axis=1), x + table[:4], 1e-7)


def test_learned_positional_embedding_rejects_too_long_input():
    module = LearnedPositionalEmbedding(max_length=3, features=8)
    with pytest.raises(ValueError, match="max_length=3"):
        module.init(jax.random.key(0), jnp.zeros((1, 4, 8)))


def test_embed_gathers_rows_and_attend_is_x_times_table_transpose():
    module = Embed(num_embeddings=11, features=6)
    ids = jnp.array([[1, 0, 10], [4, 4, 7]])
    variables = module.init(jax.random.key(0), ids)
    assert nn.get_partition_spec(variables)["params"]["embedding"] == jax.P("vocab", "embed")
    table = np.asarray(nn.unbox(variables)["params"]["embedding"], np.float64)
    np.testing.assert_array_equal(
        module.apply(variables, ids), table[np.asarray(ids)].astype(np.float32)
    )

    x = np.asarray(jax.random.normal(jax.random.key(1), (2, 3, 6)), np.float64)
    logits = module.apply(variables, jnp.asarray(x, jnp.float32), method=Embed.attend)
    assert logits.shape == (2, 3, 11)
    assert_close(logits, x @ table.T, 1e-5)


def test_embed_clamps_out_of_range_ids():
    # Documented behaviour: no wrap-around for negatives, no NaN past the end.
    module = Embed(num_embeddings=5, features=3)
    variables = module.init(jax.random.key(0), jnp.zeros((1,), jnp.int32))
    table = np.asarray(nn.unbox(variables)["params"]["embedding"])
    got = module.apply(variables, jnp.array([-1, 5, 99]))
    np.testing.assert_array_equal(got, table[[0, 4, 4]])


def test_token_segment_position_embedding_is_sum_of_three_lookups():
    module = TokenSegmentPositionEmbedding(
        vocab_size=13, features=8, max_length=7, type_vocab_size=2
    )
    ids = jnp.array([[3, 12, 0, 5], [1, 2, 2, 9]])
    types = jnp.array([[0, 0, 1, 1], [0, 1, 1, 1]])
    variables = module.init(jax.random.key(0), ids, types)
    params = nn.unbox(variables)["params"]
    assert set(params) == {"word_embeddings", "token_type_embeddings", "position_embeddings"}
    specs = nn.get_partition_spec(variables)["params"]
    assert specs["token_type_embeddings"]["embedding"] == jax.P(None, "embed")
    word = np.asarray(params["word_embeddings"]["embedding"], np.float64)
    typ = np.asarray(params["token_type_embeddings"]["embedding"], np.float64)
    pos = np.asarray(params["position_embeddings"]["embedding"], np.float64)
    ids_np, types_np = np.asarray(ids), np.asarray(types)

    expected = word[ids_np] + typ[types_np] + pos[np.arange(4)]
    assert_close(module.apply(variables, ids, types), expected, 1e-6)
    # No token types means all segment 0 (BERT's default).
    assert_close(module.apply(variables, ids), word[ids_np] + typ[0] + pos[:4], 1e-6)
    positions = np.array([[0, 1, 2, 0], [6, 5, 4, 3]])
    assert_close(
        module.apply(variables, ids, types, positions),
        word[ids_np] + typ[types_np] + pos[positions],
        1e-6,
    )
