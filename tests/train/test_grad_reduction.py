"""With bf16 compute and float32 params, a data-parallel step sums the gradients across devices
in float32 (zoo.nn.precision): the partitioned train step's all-reduces and reduce-scatters
carry no bf16, and the gradient on 8 devices is the one-device gradient (up to float32 rounding
in float32 compute; bf16 compute adds its own rounding, placed differently by each program).
Before, each device's part came out of a bf16 dot and was reduced in bf16
(benchmarks/grad_reduction.py measures what that costs)."""

import glob
import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.numerics import assert_close
from zoo.contract import losses
from zoo.models import bert
from zoo.train import partitioning, step
from zoo.train.state import TrainState

V, T, P, ROWS = 512, 16, 3, 16


def _model(dtype="bfloat16"):
    return bert.BertForPreTraining(bert.config_for_size(
        "tiny", vocab_size=V, max_position_embeddings=T, dropout_rate=0.0,
        attention_dropout_rate=0.0, dtype=dtype))


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "input_ids": rng.integers(0, V, (ROWS, T), dtype=np.int32),
        "token_type_ids": (np.arange(T) >= T // 2).astype(np.int32)[None].repeat(ROWS, 0),
        "attention_mask": np.ones((ROWS, T), np.int32),
        "masked_lm_positions": np.sort(rng.permutation(np.arange(1, T))[:P]
                                       )[None].repeat(ROWS, 0).astype(np.int32),
        "masked_lm_ids": rng.integers(0, V, (ROWS, P), dtype=np.int32),
        "next_sentence_labels": rng.integers(0, 2, (ROWS,), dtype=np.int32),
    }


def _loss_fn(model):
    def loss_fn(params, batch, rng, train):
        mlm, nsp = model.apply({"params": params}, batch["input_ids"], batch["token_type_ids"],
                               batch["attention_mask"], batch["masked_lm_positions"],
                               deterministic=not train)
        mlm = losses.cross_entropy_sums(mlm, batch["masked_lm_ids"])
        nsp = losses.cross_entropy_sums(nsp, batch["next_sentence_labels"])
        return {"loss_sum": mlm["loss_sum"] + nsp["loss_sum"], "weight_sum": mlm["weight_sum"]}

    return loss_fn


def _init_params(rng):
    b = _batch()
    return _model().init(rng, b["input_ids"], b["token_type_ids"], b["attention_mask"],
                         b["masked_lm_positions"])["params"]


def _mesh(devices, fsdp=1):
    return partitioning.make_mesh(devices // fsdp, fsdp, 1, devices=jax.devices()[:devices])


def _partitioned_collectives(compile_fn, tmp_path) -> list[tuple[str, str]]:
    """(op, result type) of every all-reduce / reduce-scatter the SPMD partitioner wrote.

    Read from the module right after partitioning, not from compile().as_text(): XLA:CPU has
    no bf16 collectives and widens them to float32 later (its all-reduce-promotion pass),
    while a TPU keeps what the partitioner wrote (checked with the TPU compiler: before
    zoo.nn.precision its BERT-base step all-reduced bf16[30522,768])."""
    # The persistent cache (tests/conftest.py) keys programs without their dump options and
    # would hand back an executable that dumps nothing: never store this one, so it is never
    # read back either.
    previous = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1e9)
    try:
        compile_fn({"xla_dump_to": str(tmp_path), "xla_dump_hlo_pass_re": "spmd-partitioning"})
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", previous)
    (module,) = glob.glob(os.path.join(tmp_path, "*after_spmd-partitioning*.txt"))
    with open(module) as f:
        text = f.read()
    found = re.findall(r"= (\(.*?\)|\S+) (all-reduce|reduce-scatter)(?:-start)?\(", text)
    return [(op, shape) for shape, op in found]


# data=8: every gradient all-reduced; data=4 x fsdp=2: the sharded params' reduce-scattered.
@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [1, 2])
def test_train_step_reduces_gradients_across_devices_in_float32(tmp_path, fsdp):
    mesh, rules = _mesh(8, fsdp), partitioning.DEFAULT_RULES
    opt = optax.sgd(1.0)

    def init_state(rng):
        return TrainState.create(_init_params(rng), opt, rng)

    state, state_sharding = partitioning.sharded_init(init_state, mesh, rules, jax.random.key(0))
    batch_sharding = partitioning.batch_sharding(mesh, rules)
    batch = jax.device_put(_batch(), batch_sharding)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        lowered = jax.jit(step.make_train_step(_loss_fn(_model()), opt),
                          in_shardings=(state_sharding, batch_sharding),
                          out_shardings=(state_sharding, None)).lower(state, batch)
    collectives = _partitioned_collectives(
        lambda options: lowered.compile(compiler_options=options), tmp_path)
    shapes = " ".join(shape for _, shape in collectives)
    # The word-embedding table's gradient (the tied decoder's part) is among them...
    hidden = bert.SIZES["tiny"][2]
    assert re.search(rf"f32\[{V // fsdp},{hidden}\]|f32\[{V},{hidden // fsdp}\]", shapes), (
        collectives)
    # ...and nothing is summed across devices in bf16.
    assert "bf16[" not in shapes, [c for c in collectives if "bf16[" in c[1]]


@pytest.fixture(scope="module")
def params():
    return nn.unbox(jax.jit(_init_params)(jax.random.key(0)))


def _grads(params, devices, dtype):
    mesh, rules = _mesh(devices), partitioning.DEFAULT_RULES
    batch_sharding = partitioning.batch_sharding(mesh, rules)
    loss_fn = _loss_fn(_model(dtype))
    grad = jax.grad(lambda p, b: loss_fn(p, b, None, False)["loss_sum"])
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        out = jax.jit(grad, in_shardings=(None, batch_sharding))(
            params, jax.device_put(_batch(), batch_sharding))
    return jax.device_get(out)


def _without_key_biases(grads):
    """(the gradient less the attention key biases, those biases). A key bias adds the same
    q.b to every logit of a query, which softmax ignores: its exact gradient is 0, so what
    either program computes for it is rounding noise, compared at the query bias's scale."""
    layers = grads["bert"]["encoder"]
    keys = {name: layer["self_attention"]["key"].pop("bias") for name, layer in layers.items()}
    return grads, keys


# float32: one device's sum in another order (measured 1.2e-6 on this CPU). bf16: each program
# also rounds its bf16 activations at its own places (XLA fuses the sharded program
# differently), which alone moves a bias's gradient (a sum over every token with cancellation)
# by 2.4e-2 of its scale here (4.8e-2 when the parts were reduced in bf16); 0.1 still catches a
# part missing from the sum (1/8 of the gradient gone) or a wrong transpose.
@pytest.mark.slow
@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 0.1)])
def test_gradient_on_8_devices_is_the_one_device_gradient(params, dtype, tol):
    one, keys_one = _without_key_biases(_grads(params, 1, dtype))
    eight, keys_eight = _without_key_biases(_grads(params, 8, dtype))
    assert {g.dtype for g in jax.tree.leaves(eight)} == {jnp.dtype(jnp.float32)}
    assert_close(eight, one, tol)
    query_bias = max(float(np.max(np.abs(layer["self_attention"]["query"]["bias"])))
                     for layer in one["bert"]["encoder"].values())
    assert_close(keys_eight, keys_one, tol, scale=query_bias)
