"""Dropout's generator (zoo.train.dropout_rng): 'auto' per platform; every generator's masks keep
1 - rate of the values, independently per step and per key, and the same again on a rerun; the
state's key stays threefry; a train step built for an accelerator draws with rbg."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax.sharding import Mesh, NamedSharding, PartitionSpec

from benchmarks.step_jobs import build, job_config, make_task
from tests.libtpu import needs_libtpu
from zoo.errors import ConfigError
from zoo.train import dropout_rng, partitioning, program

GENERATORS = ("threefry", "rbg", "unsafe_rbg")
RATE, SHAPE = 0.1, (512, 1024)


@pytest.mark.parametrize("platforms, devices, expected", [
    (("cpu",), 1, "threefry"), (("tpu",), 1, "rbg"), (("cuda",), 1, "rbg"),
    (("cpu", "tpu"), 1, "rbg"), ((), 1, "rbg"), (("tpu",), 8, "threefry"),
    (("cuda",), 2, "threefry"), (("cpu",), 8, "threefry")])
def test_auto_is_rbg_on_one_accelerator_and_threefry_elsewhere(platforms, devices, expected):
    assert dropout_rng.generator("auto", platforms, devices) == expected
    assert dropout_rng.generator("unsafe_rbg", ("cpu",), 8) == "unsafe_rbg"


@needs_libtpu
@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg", "threefry2x32"])
def test_the_tpu_compiler_draws_rbg_bits_for_the_whole_batch_on_every_device(impl):
    # Why `auto` is threefry across devices: a mask of a batch sharded 8 ways is drawn whole,
    # u32[64, 128, 256], by each of v5e-8's chips under rbg; threefry draws 1/8 of it on each.
    from zoo.train.compilation import topologies

    devices = topologies.compile_only_devices(topologies.parse("v5e-8"))
    rows = NamedSharding(Mesh(np.array(devices), ("data",)), PartitionSpec("data"))

    def dropout(x, key_data):
        keep = jax.random.bernoulli(jax.random.wrap_key_data(key_data, impl=impl), 0.9, x.shape)
        return jnp.where(keep, x, 0.0)

    key_data = jax.random.key_data(jax.random.key(0, impl=impl))
    x = jax.ShapeDtypeStruct((64, 128, 256), jnp.float32, sharding=rows)
    hlo = jax.jit(dropout, out_shardings=rows).lower(
        x, jax.ShapeDtypeStruct(key_data.shape, key_data.dtype)).compile().as_text()
    drawn = re.findall(r"(u32\[[\d,]+\])[^=]*rng-bit-generator\(", hlo)
    assert drawn == ([] if impl == "threefry2x32" else ["u32[64,128,256]"])


def test_an_unknown_generator_names_the_key():
    with pytest.raises(ConfigError, match=r"config.train.dropout_rng='philox'.*auto"):
        dropout_rng.generator("philox", ("cpu",), 1)


def _mask(key) -> np.ndarray:
    out = nn.Dropout(RATE).apply({}, jnp.ones(SHAPE), deterministic=False,
                                 rngs={"dropout": key})
    kept = np.asarray(out) != 0
    # Kept values are scaled by 1 / (1 - rate), dropped ones are exactly 0.
    np.testing.assert_allclose(np.asarray(out)[kept], 1 / (1 - RATE), rtol=1e-6)
    return kept


@pytest.mark.parametrize("generator", GENERATORS)
def test_masks_keep_one_minus_rate_independently_and_reproducibly(generator):
    base = jax.random.key(7)
    masks = [_mask(dropout_rng.step_key(base, jnp.int32(s), generator)) for s in (0, 1)]
    n = masks[0].size
    sd = np.sqrt(RATE * (1 - RATE) / n)
    for m in masks:
        assert abs(m.mean() - (1 - RATE)) < 5 * sd, m.mean()
        # Rows too: each of the 512 rows of 1,024 keeps ~90% (a stuck or periodic generator
        # would put whole rows or columns off).
        row_sd = np.sqrt(RATE * (1 - RATE) / SHAPE[1])
        assert np.abs(m.mean(axis=1) - (1 - RATE)).max() < 6 * row_sd
        col_sd = np.sqrt(RATE * (1 - RATE) / SHAPE[0])
        assert np.abs(m.mean(axis=0) - (1 - RATE)).max() < 6 * col_sd
    # Two steps' masks are independent: they agree where both keep or both drop, at
    # (1 - rate)^2 + rate^2 of the positions.
    agree = (masks[0] == masks[1]).mean()
    p = (1 - RATE) ** 2 + RATE ** 2
    assert abs(agree - p) < 5 * np.sqrt(p * (1 - p) / n), agree
    # A key split for two layers gives two independent masks too.
    a, b = jax.random.split(dropout_rng.step_key(base, jnp.int32(3), generator))
    agree = (_mask(a) == _mask(b)).mean()
    assert abs(agree - p) < 5 * np.sqrt(p * (1 - p) / n), agree
    # The same step draws the same mask again (a resumed run's dropout).
    again = _mask(dropout_rng.step_key(base, jnp.int32(1), generator))
    np.testing.assert_array_equal(again, masks[1])


def _tiny_bert(dropout_rng: str, dropout: float = 0.1):
    config = job_config("bert", "tiny", 32, 4, "float32")
    config.train.dropout_rng = dropout_rng
    config.model.update(dropout_rate=dropout, attention_dropout_rate=dropout)
    task = make_task("bert", config, 2048)
    return config, task, build(config, task)


def _one_step(config, setup, platforms):
    step_fn = program.jit_train_step(setup.task, setup.optimizer, config, setup.state_sharding,
                                     setup.batch_sharding, platforms)
    batch = jax.device_put(setup.task.init_batch(), setup.batch_sharding)
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
        text = step_fn.lower(setup.state, batch).as_text()
        state = jax.tree.map(lambda x: x.copy() if isinstance(x, jax.Array) else x, setup.state)
        new_state, metrics = step_fn(state, batch)
    return text, new_state, metrics


@pytest.mark.slow
@pytest.mark.parametrize("generator", ("rbg", "unsafe_rbg"))
def test_the_state_key_stays_threefry_and_a_rerun_draws_the_same_dropout(generator):
    config, _, setup = _tiny_bert(generator)
    _, first, m1 = _one_step(config, setup, ("cpu",))
    _, again, m2 = _one_step(config, setup, ("cpu",))
    assert str(jax.random.key_impl(first.rng)) == str(jax.random.key_impl(setup.state.rng))
    assert float(m1["loss_sum"]) == float(m2["loss_sum"])
    # Not threefry's masks: the loss differs from the threefry step's; and 'auto' built for
    # an accelerator is this generator's step (rbg), for a CPU threefry's.
    config_t, _, setup_t = _tiny_bert("threefry")
    _, _, mt = _one_step(config_t, setup_t, ("cpu",))
    assert float(mt["loss_sum"]) != float(m1["loss_sum"])
    config_a, _, setup_a = _tiny_bert("auto")
    text, _, on_tpu = _one_step(config_a, setup_a, ("tpu",))
    assert "rng_bit_generator" in text
    _, _, on_cpu = _one_step(config_a, setup_a, ("cpu",))
    assert float(on_cpu["loss_sum"]) == float(mt["loss_sum"])
    if generator == "rbg":
        assert float(on_tpu["loss_sum"]) == float(m1["loss_sum"])


@pytest.mark.parametrize("generator", GENERATORS)
def test_each_shard_of_a_sharded_batch_draws_its_own_mask(generator):
    """Rows on 8 devices (the batch split over a data axis, as the loop shards it) must not
    repeat one device's mask: the partitioner must not hand every shard the same bits."""
    mesh = partitioning.make_mesh(8, 1, 1, devices=jax.devices()[:8])
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    key = dropout_rng.step_key(jax.random.key(7), jnp.int32(0), generator)

    @jax.jit
    def masks(x, key):
        x = jax.lax.with_sharding_constraint(x, sharding)
        out = nn.Dropout(RATE).apply({}, x, deterministic=False, rngs={"dropout": key})
        return jax.lax.with_sharding_constraint(out != 0, sharding)

    kept = np.asarray(masks(jax.device_put(jnp.ones((8, 65536)), sharding), key))
    p = (1 - RATE) ** 2 + RATE ** 2
    sd = np.sqrt(p * (1 - p) / kept.shape[1])
    for i in range(1, 8):
        agree = (kept[0] == kept[i]).mean()
        assert abs(agree - p) < 6 * sd, (i, agree)
    assert abs(kept.mean() - (1 - RATE)) < 6 * np.sqrt(RATE * (1 - RATE) / kept.size)
