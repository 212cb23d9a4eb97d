"""A custom config.mesh.rules table: parameters land where it says (not where the default table
would put them), training on it equals one device, and a table the mesh cannot follow is one
ConfigError naming config.mesh.rules."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from configs import gpt as gpt_config
from tests.numerics import assert_params_close
from tests.train import loop_steps
from zoo.commands import jobs
from zoo.errors import ConfigError
from zoo.train import partitioning

# Megatron's tensor-parallel axes (mlp, heads) moved onto fsdp, and the embedding width
# replicated: every parameter the default table splits over (fsdp, tensor) moves.
CUSTOM = {"embed": None, "mlp": "fsdp", "heads": "fsdp"}
# (path, default table's spec, custom table's spec) on the (data=2, fsdp=2, tensor=2) mesh.
EXPECTED = [
    (("h", "layer_0", "mlp", "wi", "kernel"), P("fsdp", "tensor"), P(None, "fsdp")),
    (("h", "layer_1", "mlp", "wo", "kernel"), P("tensor", "fsdp"), P("fsdp", None)),
    (("h", "layer_0", "self_attention", "query", "kernel"),
     P("fsdp", "tensor", None), P(None, "fsdp", None)),
    (("h", "layer_1", "self_attention", "out", "kernel"),
     P("tensor", None, "fsdp"), P("fsdp", None, None)),
    (("wte", "embedding"), P("tensor", "fsdp"), P("tensor", None)),  # vocab stays on tensor
]


def _config(rules=None, mesh=(1, 1, 1)):
    config = gpt_config.get_config("size=tiny")
    config.data.update(seq_len=16, batch_size=8, eval_batch_size=8, vocab_size=128)
    # SGD, not Adam: Adam's m/sqrt(v) would blow float-rounding differences between layouts up
    # to full-size updates (see tests/train/test_loop.py).
    config.optim.update(name="sgd", learning_rate=0.5, warmup_steps=1)
    config.mesh.update(data=mesh[0], fsdp=mesh[1], tensor=mesh[2])
    if rules is not None:
        config.mesh.rules = rules
    return config


def _custom_rules():
    return [[name, CUSTOM.get(name, axes)] for name, axes in partitioning.DEFAULT_RULES]


def _leaf(tree, path):
    for key in path:
        tree = tree[key]
    return tree


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("rules"))  # one tokenizer for every build below


@pytest.mark.slow
def test_params_follow_a_custom_rules_table_and_train_as_on_one_device(workdir):
    config = _config()
    single = jobs.build(config, workdir, devices=jax.devices()[:1])
    it = single.task.train_batches(0, 1)
    batches = [next(it) for _ in range(2)]
    state, losses = loop_steps.train(single, config, batches)
    expected_params = jax.device_get(state.params)

    default = jobs.build(_config(mesh=(2, 2, 2)), workdir)
    custom_config = _config(_custom_rules(), mesh=(2, 2, 2))
    custom = jobs.build(custom_config, workdir)
    for path, default_spec, custom_spec in EXPECTED:
        assert _leaf(default.state_sharding.params, path).spec == default_spec, path
        assert _leaf(custom.state_sharding.params, path).spec == custom_spec, path
        # The arrays themselves were created on those shards.
        assert _leaf(custom.state.params, path).sharding.spec == custom_spec, path

    state, custom_losses = loop_steps.train(custom, custom_config, batches)
    np.testing.assert_allclose(custom_losses, losses, rtol=2e-5)
    for path, _, custom_spec in EXPECTED:  # the step keeps the layout
        assert _leaf(state.params, path).sharding.spec == custom_spec, path
    assert_params_close(state.params, expected_params, 1e-4)


@pytest.mark.parametrize("rules,message", [
    ([["embed", "model"]], r"entry 0 \['embed', 'model'\] maps 'embed' to the mesh axis 'model'"),
    ([["act_batch", ["data", "pipeline"]]], r"to the mesh axis 'pipeline', which the mesh"),
    ([["embed", "fsdp"], "mlp"], r"entry 1 is 'mlp', not a \[logical_axis, mesh_axes\] pair"),
    ([["embed", "fsdp", "tensor"]], r"entry 0 is .*, not a \[logical_axis, mesh_axes\] pair"),
    ([["mlp", 2]], r"maps 'mlp' to 2, not mesh axis names"),
], ids=["unknown-axis", "unknown-axis-in-list", "not-a-pair", "three-items", "not-a-name"])
def test_a_bad_rules_table_is_one_config_error_naming_the_key(workdir, rules, message):
    config = _config(rules)
    # Refused before the task builds anything (the rules are read right after the mesh).
    with pytest.raises(ConfigError, match=r"^config\.mesh\.rules: .*" + message):
        jobs.build(config, workdir, devices=jax.devices()[:1])


def test_the_dry_run_reads_the_table_the_same_way(workdir):
    with pytest.raises(ConfigError, match=r"^config\.mesh\.rules: .*'model'"):
        jobs.dry_run(_config([["embed", "model"]]), workdir, jax.devices()[:1])
    figures = jobs.dry_run(_config(_custom_rules(), mesh=(2, 2, 2)), workdir)
    default = jobs.dry_run(_config(mesh=(2, 2, 2)), workdir)
    # Moving embed off fsdp (and mlp/heads off tensor onto fsdp) changes what a device holds:
    # the token embedding (vocab x embed) is now split 2 ways instead of 4.
    assert figures["param_bytes_per_device"] > default["param_bytes_per_device"]
