"""The real train steps of BERT-base and GPT-2 124M (bf16 compute) lower for GPUs and TPUs on
this CPU, on a mesh of 8 abstract devices, with every attention backend that can lower without
the hardware: shapes only, no parameter is allocated."""

import pytest

from benchmarks import step as bench_step
from zoo.errors import ConfigError
from zoo.train import export

# Each backend, the platforms it targets, and what its kernel leaves in the lowered module.
BACKENDS = {
    "einsum": (("cuda", "tpu"), None),
    "blockwise": (("cuda", "tpu"), "stablehlo.while"),  # its block loops
    "pallas_gpu": (("cuda",), "__gpu$xla.gpu.triton"),
    "splash": (("tpu",), "tpu_custom_call"),
}
# GPT-2's vocabulary (50,257) does not split over a tensor axis; data x fsdp does.
MODELS = {"bert": ("base", (2, 2, 2)), "gpt": ("124M", (4, 2, 1))}
VOCAB = {"bert": 30522, "gpt": 50257}


def _task(model: str, backend: str, batch: int = 16, seq_len: int = 128):
    size, _ = MODELS[model]
    config = bench_step.job_config(model, size, seq_len, batch, "bfloat16")
    config.model.backend = backend
    if backend in ("cudnn", "pallas_gpu", "splash"):
        config.model.attention_dropout_rate = 0.0  # the kernels have none (and refuse it)
    return bench_step.make_task(model, config, bench_step.SIZES[model][size].vocab_size), config


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("model", list(MODELS))
def test_train_step_lowers_for_the_hardware(model, backend):
    platforms, marker = BACKENDS[backend]
    task, config = _task(model, backend)
    mesh = export.abstract_mesh(*MODELS[model][1])
    exported = export.export_train_step(task, config, platforms, mesh)
    assert exported.platforms == platforms
    assert exported.nr_devices == 8
    shapes = {tuple(a.shape) for a in exported.in_avals}
    assert (16, 128) in shapes  # the batch
    assert (VOCAB[model], 768) in shapes  # the token embedding, full size
    text = exported.mlir_module()
    assert "bf16" in text  # the compute dtype reached the program
    if marker:
        assert marker in text


def test_cudnn_cannot_lower_without_cudnn():
    """jax asks the installed cuDNN for its version while tracing: without a GPU build of
    jaxlib the cudnn backend cannot be lowered here (README: Running at scale says so). If a
    later jax lowers it, this test fails and the README needs updating."""
    task, config = _task("bert", "cudnn")
    with pytest.raises(RuntimeError, match="cuDNN"):
        export.export_train_step(task, config, ("cuda",), export.abstract_mesh(2, 2, 2))


def test_a_parameter_that_does_not_divide_the_mesh_is_named():
    task, config = _task("gpt", "einsum")
    with pytest.raises(ConfigError, match=r"wte.*50257.*config.mesh.tensor=2"):
        export.export_train_step(task, config, ("tpu",), export.abstract_mesh(2, 2, 2))
