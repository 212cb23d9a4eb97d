"""The real train steps of BERT-base and GPT-2 124M (bf16 compute) lower for GPUs and TPUs on
this CPU, on a mesh of 8 abstract devices, with every attention backend that can lower without
the hardware: shapes only, no parameter is allocated. The lowered programs are read
(tests/stablehlo.py) for what each backend must leave in them: blockwise attention's nested
block loops and no [q, k] buffer; the Pallas kernels inside shard_map on per-device shapes."""

import jax
import pytest
from jax.sharding import PartitionSpec

from benchmarks import step as bench_step
from tests import stablehlo
from zoo.errors import ConfigError
from zoo.nn import attention_kernels
from zoo.train.compilation import export

# Each backend, the platforms it targets, and its kernel's custom call (None: plain StableHLO).
BACKENDS = {
    "einsum": (("cuda", "tpu"), None),
    "blockwise": (("cuda", "tpu"), None),
    "pallas_gpu": (("cuda",), "__gpu$xla.gpu.triton"),
    "splash": (("tpu",), "tpu_custom_call"),
}
# GPT-2's vocabulary (50,257) does not split over a tensor axis; data x fsdp does.
MODELS = {"bert": ("base", (2, 2, 2)), "gpt": ("124M", (4, 2, 1))}
VOCAB = {"bert": 30522, "gpt": 50257}
BATCH, SEQ, HEADS, HEAD_DIM = 16, 128, 12, 64  # both models' attention at these shapes
# Blockwise attention's block in these exports: a quarter of the sequence, so a [q, k] buffer
# in its program can only come from a fall-back (a block of the whole sequence is one).
BLOCK = 32


def _task(model: str, backend: str, batch: int = BATCH, seq_len: int = SEQ):
    size, _ = MODELS[model]
    config = bench_step.job_config(model, size, seq_len, batch, "bfloat16")
    config.model.backend = backend
    if backend == "blockwise":
        config.model.attention_block = BLOCK
    if backend in ("cudnn", "pallas_gpu", "splash"):
        config.model.attention_dropout_rate = 0.0  # the kernels have none (and refuse it)
    return bench_step.make_task(model, config, bench_step.SIZES[model][size].vocab_size), config


def _export(model: str, backend: str) -> jax.export.Exported:
    task, config = _task(model, backend)
    return export.export_train_step(task, config, BACKENDS[backend][0],
                                    export.abstract_mesh(*MODELS[model][1]))


@pytest.fixture(scope="module")
def exported():
    """(model, backend) -> its exported train step, each lowered once for the module."""
    cache = {}

    def get(model: str, backend: str) -> jax.export.Exported:
        if (model, backend) not in cache:
            cache[model, backend] = _export(model, backend)
        return cache[model, backend]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("model", list(MODELS))
def test_train_step_lowers_for_the_hardware(model, backend, exported):
    platforms, kernel = BACKENDS[backend]
    program = exported(model, backend)
    assert program.platforms == platforms
    assert program.nr_devices == 8
    shapes = {tuple(a.shape) for a in program.in_avals}
    assert (BATCH, SEQ) in shapes  # the batch
    assert (VOCAB[model], 768) in shapes  # the token embedding, full size
    text = program.mlir_module()
    assert "bf16" in text  # the compute dtype reached the program
    if kernel:
        assert stablehlo.Program(text).custom_calls(kernel)


def test_cudnn_cannot_lower_without_cudnn():
    """jax asks the installed cuDNN for its version while tracing: without a GPU build of
    jaxlib the cudnn backend cannot be lowered here (docs/guides/dry-run-and-compile.md says
    so). If a later jax lowers it, this test fails and that page needs updating."""
    task, config = _task("bert", "cudnn")
    with pytest.raises(RuntimeError, match="cuDNN"):
        export.export_train_step(task, config, ("cuda",), export.abstract_mesh(2, 2, 2))


def test_a_parameter_that_does_not_divide_the_mesh_is_named():
    task, config = _task("gpt", "einsum")
    with pytest.raises(ConfigError, match=r"wte.*50257.*config.mesh.tensor=2"):
        export.export_train_step(task, config, ("tpu",), export.abstract_mesh(2, 2, 2))


# ---- blockwise attention: the form an einsum fall-back lacks ---------------------------------

LAYERS = 12  # both models'


def _blockwise_missing(text: str, model: str) -> list[str]:
    """What a program lacks of blockwise attention's form at these shapes (empty: nothing): no
    [..., q, k] tensor anywhere (einsum's logits and weights, and the layer scan's stacked copies
    of them kept for the backward pass); the [b, h, block, block] score tile of one device's
    batch rows and heads (blockwise attention runs per device under shard_map on a mesh, issue
    28); the block loops inside the layer scan (forward: query blocks > key blocks; backward:
    key blocks > query blocks), three loops deep where the layer scan alone is one."""
    shapes = {shape for shape, _ in stablehlo.tensor_shapes(text)}
    missing = []
    full = sorted(shape for shape in shapes if shape[-2:] == (SEQ, SEQ))
    if full:
        missing.append(f"[..., q, k] buffers: {full}")
    data, fsdp, tensor = MODELS[model][1]
    tile = (BATCH // (data * fsdp), HEADS // tensor, BLOCK, BLOCK)
    if tile not in shapes:
        missing.append(f"no per-device [b, h, block, block] score tile {tile}")
    depth = stablehlo.Program(text).loop_depth()
    if depth < 3:
        missing.append(f"loops nest {depth} deep, not 3 (layer scan > blocks > blocks)")
    return missing


@pytest.mark.parametrize("model", list(MODELS))
def test_blockwise_attention_is_in_the_program(model, exported):
    assert _blockwise_missing(exported(model, "blockwise").mlir_module(), model) == []


@pytest.mark.parametrize("model", list(MODELS))
def test_the_blockwise_check_catches_an_einsum_fallback(model, exported):
    """The same step with einsum attention (what a silent fall-back lowers to) fails all three
    checks, though its layer scan is a while loop too."""
    missing = _blockwise_missing(exported(model, "einsum").mlir_module(), model)
    assert len(missing) == 3, missing
    assert str((BATCH, HEADS, SEQ, SEQ)) in missing[0]  # the logits / weights
    assert str((LAYERS, BATCH, HEADS, SEQ, SEQ)) in missing[0]  # every layer's, for backward
    assert "loops nest 1 deep" in missing[2]


# ---- the Pallas kernels: inside shard_map, on each device's share ----------------------------


def _per_device_qkv(model: str) -> set[tuple[int, ...]]:
    """q / k / v on one device: pallas_gpu's [b, l, h, d] and Splash's [b, h, l, d], the batch
    split over data x fsdp and the heads over tensor."""
    data, fsdp, tensor = MODELS[model][1]
    b, h = BATCH // (data * fsdp), HEADS // tensor
    return {(b, SEQ, h, HEAD_DIM), (b, h, SEQ, HEAD_DIM)}


@pytest.mark.parametrize("backend", ["pallas_gpu", "splash"])
@pytest.mark.parametrize("model", list(MODELS))
def test_kernels_run_inside_shard_map_on_each_devices_share(model, backend, exported):
    program = stablehlo.Program(exported(model, backend).mlir_module())
    target = BACKENDS[backend][1]
    assert len(program.custom_calls(target)) >= 2  # forward and backward
    assert stablehlo.misplaced_kernels(program, target, _per_device_qkv(model), HEAD_DIM) == []


def _unsharded(kernel, backend, *args):
    """_per_shard without shard_map: the kernel on the global arrays."""
    return kernel(*args)


def _replicated(kernel, backend, *args):
    """_per_shard with every operand replicated: inside shard_map, but each device computes
    every row and head."""
    mesh = jax.sharding.get_abstract_mesh()
    return jax.shard_map(kernel, mesh=mesh, in_specs=PartitionSpec(), out_specs=PartitionSpec(),
                         check_vma=False)(*args)


@pytest.mark.parametrize("backend, wiring, found", [
    ("pallas_gpu", _unsharded, ("outside shard_map", "not per device")),
    ("pallas_gpu", _replicated, ("not per device",)),
    ("splash", _replicated, ("not per device",)),
], ids=["pallas_gpu-unsharded", "pallas_gpu-replicated", "splash-replicated"])
def test_the_kernel_check_catches_a_kernel_off_its_shard(backend, wiring, found, monkeypatch):
    """BERT-base's step on the same 2 x 2 x 2 mesh, with the kernels wired wrong."""
    monkeypatch.setattr(attention_kernels, "_per_shard", wiring)
    program = stablehlo.Program(_export("bert", backend).mlir_module())
    problems = stablehlo.misplaced_kernels(program, BACKENDS[backend][1],
                                           _per_device_qkv("bert"), HEAD_DIM)
    for what in ("outside shard_map", "not per device"):
        assert any(what in p for p in problems) == (what in found), problems
    named = " ".join(problems)  # the operands' global shape, [b, l, h, d] or [b, h, l, d]
    assert any(str(shape) in named
               for shape in ((BATCH, SEQ, HEADS, HEAD_DIM), (BATCH, HEADS, SEQ, HEAD_DIM)))


def test_splash_refuses_to_lower_outside_shard_map(monkeypatch):
    """jax itself stops a Mosaic kernel that is not per shard on a mesh (hence no 'unsharded'
    Splash case above); Triton kernels it lets through."""
    monkeypatch.setattr(attention_kernels, "_per_shard", _unsharded)
    with pytest.raises(NotImplementedError, match="wrap the call in a shard_map"):
        _export("bert", "splash")
