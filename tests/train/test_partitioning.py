"""Sharded == single device, and parameters land where the logical rules say."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.nn import masks
from zoo.nn.recurrent import StackedRNN
from zoo.nn.transformer import TransformerEncoder
from zoo.train import partitioning

RULES = partitioning.DEFAULT_RULES


def _rule(name):
    return dict(RULES)[name]


def _expected_spec(names, mesh):
    # What the rule table promises for a parameter with these logical axis names; mesh axes of
    # size 1 still appear in the spec (they shard trivially).
    return jax.sharding.PartitionSpec(*(_rule(n) if n else None for n in names))


def _run_sharded(model, mesh, *args):
    variables, shardings = partitioning.sharded_init(model.init, mesh, RULES, jax.random.key(0),
                                                     *args)
    with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
        out = jax.jit(model.apply)(variables, *args)
    return variables, shardings, out


def _run_single(model, variables, *args):
    host = jax.device_get(variables)
    single = jax.devices()[0]
    # Everything committed to one device: jit runs there, unsharded.
    return jax.jit(model.apply)(*jax.device_put((host, *args), single))


def _check_param_shardings(model, args, variables, mesh):
    boxed = jax.eval_shape(model.init, jax.random.key(0), *args)
    names = jax.tree.map(lambda b: b.names, boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    flat_names = jax.tree_util.tree_leaves_with_path(
        names, is_leaf=lambda x: isinstance(x, tuple))
    flat_vars = dict(jax.tree_util.tree_leaves_with_path(variables))
    assert flat_names, "the model has no logically partitioned parameters"
    sharded_somewhere = False
    for path, axis_names in flat_names:
        leaf = flat_vars[path]
        assert leaf.sharding.spec == _expected_spec(axis_names, mesh), (path, axis_names)
        sharded_somewhere |= any(s is not None for s in leaf.sharding.spec)
    assert sharded_somewhere


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(2, 1, 4), (1, 2, 4), (2, 2, 2)])
def test_transformer_stack_sharded_equals_single_device(shape):
    mesh = partitioning.make_mesh(*shape)
    model = TransformerEncoder(num_layers=2, num_heads=4, mlp_dim=32, norm_position="post")
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(4, 6, 16)), jnp.float32)
    valid = jnp.asarray(rng.random((4, 6)) > 0.3)
    mask = masks.padding_mask(valid)
    variables, _, out = _run_sharded(model, mesh, x, mask)
    expected = _run_single(model, variables, x, mask)
    assert_close(out, expected, 1e-5)
    _check_param_shardings(model, (x, mask), variables, mesh)
    # The activations really were split: the output is sharded over the batch axes.
    assert out.sharding.spec[0] is not None or shape[0] * shape[1] == 1


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(2, 1, 4), (1, 2, 4)])
def test_lstm_stack_sharded_equals_single_device(shape):
    mesh = partitioning.make_mesh(*shape)
    model = StackedRNN(num_layers=2, hidden_size=16, cell="lstm", bidirectional=True)
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(4, 7, 8)), jnp.float32)
    lengths = jnp.asarray([7, 3, 5, 1], jnp.int32)
    variables, _, (out, carries) = _run_sharded(model, mesh, x, lengths)
    expected, expected_carries = _run_single(model, variables, x, lengths)
    assert_close(out, expected, 1e-5)
    assert_close(carries, expected_carries, 1e-5)
    _check_param_shardings(model, (x, lengths), variables, mesh)


def test_make_mesh_fills_minus_one_and_rejects_bad_shapes():
    assert dict(partitioning.make_mesh(-1, 2, 2).shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert dict(partitioning.make_mesh(1, -1, 1).shape) == {"data": 1, "fsdp": 8, "tensor": 1}
    with pytest.raises(ValueError, match="data/fsdp/tensor"):
        partitioning.make_mesh(3, 1, 1)
    with pytest.raises(ValueError, match="at most one"):
        partitioning.make_mesh(-1, -1, 1)
    with pytest.raises(ValueError, match="cannot be split"):
        partitioning.make_mesh(-1, 3, 1)


def test_batch_sharding_splits_over_data_axes():
    mesh = partitioning.make_mesh(2, 2, 2)
    sharding = partitioning.batch_sharding(mesh, RULES)
    x = jax.device_put(np.zeros((8, 3), np.float32), sharding)
    # 4 distinct batch shards (data x fsdp), replicated over tensor.
    assert len({str(s.index) for s in x.addressable_shards}) == 4
