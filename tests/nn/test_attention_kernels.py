"""The Pallas kernels (GPU flash attention, TPU Splash attention) run in interpret mode on this
CPU against the float64 reference, with zoo's mask descriptions translated into their mask
forms; on a mesh they run per shard; what a kernel cannot express is a clear error."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from tests import stablehlo
from tests.nn.attention_reference import attention_and_gradients
from tests.numerics import assert_close
from zoo.errors import ConfigError
from zoo.nn import attention_kernels as kernels
from zoo.nn.attention import MultiHeadAttention
from zoo.nn.masks import MaskSpec
from zoo.train import partitioning
from zoo.train.compilation import export


def _case(batch, q_len, k_len, heads=2, dim=16, seed=0):
    rng = np.random.default_rng(seed)
    shape = lambda n: (batch, n, heads, dim)  # noqa: E731
    q, d_out = (rng.normal(size=shape(q_len)).astype(np.float32) for _ in range(2))
    k, v = (rng.normal(size=shape(k_len)).astype(np.float32) for _ in range(2))
    return q, k, v, d_out


def _check(fn, spec, q, k, v, d_out, tol=2e-5):
    out, vjp = jax.vjp(fn, q, k, v)
    grads = vjp(jnp.asarray(d_out))
    keep = np.asarray(spec.dense(q.shape[1], k.shape[1]))
    want = attention_and_gradients(q, k, v, keep, None, d_out)
    for name, got, ref in zip(("out", "dq", "dk", "dv"), (out,) + grads, want):
        assert_close(got, ref, tol, err_msg=name)


# Interpret mode runs the kernel's grid step by step in Python: lengths of 2 x 2 blocks keep it
# to seconds while every block boundary is still crossed.
PACKED = np.array([[1] * 25 + [2] * 30 + [0] * 9, [1] * 64], np.int32)


@pytest.mark.parametrize("spec", [
    MaskSpec.self_attention(PACKED, causal=True, packed=True),
    MaskSpec.self_attention(PACKED != 0),
], ids=["packed_causal", "padding"])
def test_pallas_gpu_flash_attention_in_interpret_mode(spec):
    q, k, v, d_out = _case(2, 64, 64)
    fn = lambda q, k, v: kernels.pallas_gpu_attention(q, k, v, spec=spec, block_q=32,  # noqa
                                                      block_k=32, interpret=True)
    _check(fn, spec, q, k, v, d_out)


SPLASH_SEGMENTS = np.array([[1] * 100 + [2] * 120 + [0] * 36], np.int32)


@pytest.mark.parametrize("spec", [
    MaskSpec.self_attention(SPLASH_SEGMENTS, causal=True, packed=True),
    MaskSpec.self_attention(SPLASH_SEGMENTS != 0, window=(40, 17)),
], ids=["packed_causal", "window_both_sides"])
@pytest.mark.slow
def test_splash_attention_in_interpret_mode(spec):
    q, k, v, d_out = _case(1, 256, 256)
    fn = lambda q, k, v: kernels.splash_attention(q, k, v, spec=spec, block_q=128,  # noqa
                                                  block_k=128, interpret=True)
    _check(fn, spec, q, k, v, d_out)


def test_splash_cross_attention_over_a_padded_source():
    q, k, v, d_out = _case(2, 128, 256, seed=1)
    spec = MaskSpec.key_padding(np.arange(256)[None, :] < np.array([[256], [150]]))
    fn = lambda q, k, v: kernels.splash_attention(q, k, v, spec=spec, block_q=128,  # noqa
                                                  block_k=128, interpret=True)
    _check(fn, spec, q, k, v, d_out)


def test_kernels_run_per_shard_on_a_mesh_and_equal_one_device():
    """Under a mesh of 8 devices the kernel runs under shard_map on each device's batch rows
    and heads (XLA cannot partition a Pallas call); the result equals the unsharded call."""
    mesh = jax.make_mesh((4, 1, 2), partitioning.MESH_AXES,
                         axis_types=(jax.sharding.AxisType.Auto,) * 3)
    q, k, v, _ = _case(4, 64, 64, heads=2, seed=2)
    segments = np.tile(PACKED, (2, 1))
    spec = MaskSpec.self_attention(segments, causal=True, packed=True)
    fn = lambda q, k, v, spec: kernels.pallas_gpu_attention(  # noqa: E731
        q, k, v, spec=spec, block_q=32, block_k=32, interpret=True)
    single = fn(q, k, v, spec)
    qkv = NamedSharding(mesh, P(("data", "fsdp"), None, "tensor", None))
    placed = [jax.device_put(x, qkv) for x in (q, k, v)]
    sharded_spec = jax.tree.map(
        lambda x: jax.device_put(x, NamedSharding(mesh, P(("data", "fsdp"), None))), spec)
    with jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.DEFAULT_RULES):
        sharded = jax.jit(fn)(*placed, sharded_spec)
    assert_close(sharded, single, 1e-6)


# Each Pallas kernel, the platform it lowers for and its custom call in the lowered program.
LOWERED = {"pallas_gpu": ("cuda", "__gpu$xla.gpu.triton"), "splash": ("tpu", "tpu_custom_call")}


def _lowered_gradient(backend: str, mesh_shape) -> stablehlo.Program:
    """The gradient of a packed causal attention (batch 8, 128 tokens, 4 heads of 64) through
    the real kernel, lowered for its hardware with q / k / v split over an abstract mesh as
    MultiHeadAttention's activations are."""
    platform, _ = LOWERED[backend]
    attend = {"pallas_gpu": kernels.pallas_gpu_attention,
              "splash": kernels.splash_attention}[backend]

    def loss(q, k, v, segments):
        spec = MaskSpec.self_attention(segments, causal=True, packed=True)
        return jnp.sum(attend(q, k, v, spec=spec).astype(jnp.float32))

    mesh = export.abstract_mesh(*mesh_shape)
    qkv = NamedSharding(mesh, P(("data", "fsdp"), None, "tensor", None))
    rows = NamedSharding(mesh, P(("data", "fsdp"), None))
    args = [jax.ShapeDtypeStruct((8, 128, 4, 64), jnp.bfloat16, sharding=qkv)] * 3
    args.append(jax.ShapeDtypeStruct((8, 128), jnp.int32, sharding=rows))
    with jax.sharding.use_abstract_mesh(mesh), nn.logical_axis_rules(partitioning.DEFAULT_RULES):
        exported = jax.export.export(
            jax.jit(jax.grad(loss, argnums=(0, 1, 2))), platforms=(platform,),
            disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(LOWERED["pallas_gpu"][1])],
        )(*args)
    return stablehlo.Program(exported.mlir_module())


@pytest.mark.parametrize("backend", list(LOWERED))
def test_kernels_lower_inside_shard_map_on_each_devices_share(backend):
    """On a 2 x 2 x 2 mesh every kernel call (forward and backward) sits in shard_map with one
    device's batch rows (8 / 4) and heads (4 / 2): what the values test above cannot see."""
    program = _lowered_gradient(backend, (2, 2, 2))
    target = LOWERED[backend][1]
    assert len(program.custom_calls(target)) >= 2
    per_device = {(2, 128, 2, 64), (2, 2, 128, 64)}  # [b, l, h, d] (Triton), [b, h, l, d] (Splash)
    assert stablehlo.misplaced_kernels(program, target, per_device, head_dim=64) == []


@pytest.mark.parametrize("backend", list(LOWERED))
def test_the_shard_map_check_sees_a_kernel_called_directly(backend):
    """On one device _per_shard calls the kernel without shard_map (nothing to split): the
    check reports each call as outside shard_map, its shapes being the whole arrays'."""
    program = _lowered_gradient(backend, (1, 1, 1))
    target = LOWERED[backend][1]
    problems = stablehlo.misplaced_kernels(program, target, {(8, 128, 4, 64), (8, 4, 128, 64)},
                                           head_dim=64)
    assert len(problems) == len(program.custom_calls(target)) >= 2, problems
    assert all("outside shard_map" in p for p in problems), problems


def test_what_a_kernel_cannot_express_is_a_clear_error():
    q, k, v, _ = _case(1, 128, 128)
    with pytest.raises(ConfigError, match="pallas_gpu.*local window"):
        kernels.pallas_gpu_attention(q, k, v, spec=MaskSpec.self_attention(window=4))
    with pytest.raises(ConfigError, match="splash.*additive bias"):
        kernels.splash_attention(q, k, v, bias=np.zeros((1, 1, 128, 128), np.float32))
    with pytest.raises(ConfigError, match="pallas_gpu.*self-attention only"):
        kernels.pallas_gpu_attention(q, k[:, :64], v[:, :64])
    with pytest.raises(ConfigError, match="divide the lengths"):
        kernels.splash_attention(q[:, :100], k[:, :100], v[:, :100], block_q=64, block_k=64)


def test_what_cudnn_refuses_is_a_clear_error_before_jax_sees_it():
    """On an H100 jax's cuDNN path raised NotImplementedError for float32 inputs and ValueError
    for a two-sided window, from inside the trace (benchmarks.attention_check, 2026-11-27)."""
    q, k, v, _ = _case(1, 128, 128)
    with pytest.raises(ConfigError, match="cudnn.*float16 / bfloat16 only.*float32"):
        kernels.cudnn_attention(q, k, v, spec=MaskSpec.self_attention(causal=True))
    bf16 = [jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)]
    with pytest.raises(ConfigError, match="cudnn.*causal .left-only. local window.*4 keys"):
        kernels.cudnn_attention(*bf16, spec=MaskSpec.self_attention(window=4))


@pytest.mark.parametrize("backend", ["cudnn", "pallas_gpu", "splash"])
def test_kernel_backends_refuse_attention_dropout_instead_of_falling_back(backend):
    x = np.ones((1, 8, 16), np.float32)
    layer = MultiHeadAttention(num_heads=2, dropout_rate=0.1, backend=backend)
    variables = MultiHeadAttention(num_heads=2).init(jax.random.key(0), x)
    with pytest.raises(ConfigError, match="no attention dropout"):
        layer.apply(variables, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
