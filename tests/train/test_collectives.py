"""A communication audit: what each standard layout's compiled train step sends between
devices, held to what first principles say it must send.

The compiled program is read, not our own model of it: XLA:CPU on 8 fake devices runs the same
SPMD partitioner as the TPU compiler, so a collective the partitioner inserts shows up here
(what XLA:CPU cannot show: the TPU compiler's own rewrites after partitioning, e.g. its fused
reduce-scatter, async collectives, combined all-reduces; those are checked against the real
TPU compiler where libtpu is installed, below). Expectations, for a BERT of L layers, hidden H,
P parameters, a global batch of B x T tokens:

* data parallel: every gradient reduced once per step: P elements all-reduced (or
  reduce-scattered and gathered), nothing else of size.
* FSDP: each layer's FSDP-sharded weights (P_f elements) gathered for the forward and at most
  once more for the backward; the gradients reduced once (P elements).
* tensor parallel (Megatron, Shoeybi et al. 2019): per layer four all-reduces of a [B, T, H]
  activation: after the attention output and the MLP output projections (forward), before the
  q/k/v and the MLP input projections (their input gradients, backward).
* no collective inside an attention loop (blockwise attention's block loops), on any layout.
"""

import collections

import jax
import numpy as np
import pytest

from benchmarks import step as bench_step
from tests.libtpu import needs_libtpu
from zoo.train import aot, collectives, partitioning, program

LAYERS, HIDDEN, HEADS, MLP, VOCAB, SEQ, BATCH = 2, 128, 8, 512, 256, 64, 16


def _config(layout, backend="einsum"):
    config = bench_step.job_config("bert", "tiny", SEQ, BATCH, "float32")
    config.model.update(num_layers=LAYERS, hidden_size=HIDDEN, num_heads=HEADS,
                        intermediate_size=MLP, dropout_rate=0.0, attention_dropout_rate=0.0,
                        backend=backend, attention_block=16)
    config.data.vocab_size = VOCAB
    config.mesh.update(data=layout[0], fsdp=layout[1], tensor=layout[2])
    return config


def _compile(layout, devices, backend="einsum"):
    """The job's train step compiled on `devices`: (collectives, P, P_f)."""
    config = _config(layout, backend)
    task = bench_step.make_task("bert", config, VOCAB)
    mesh = partitioning.make_mesh(*layout, devices=devices)
    train_step, (state, batch) = program.abstract_train_step(task, config, mesh)
    with aot._not_cached(), program.lowering_context(config, mesh):
        text = train_step.lower(state, batch).compile().as_text()
    leaves = jax.tree.leaves(state.params)
    params = sum(x.size for x in leaves)
    fsdp_sharded = sum(x.size for x in leaves if "fsdp" in jax.tree.leaves(tuple(x.sharding.spec)))
    return collectives.collectives(text), params, fsdp_sharded


def _elements(found, kinds, where=lambda c: True) -> float:
    """Array elements the `kinds` collectives move per step (each as often as it runs)."""
    itemsize = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "pred": 1}
    return sum(c.bytes / itemsize[c.dtype] * (c.executions or 1)
               for c in found if c.kind in kinds and where(c))


def _per_layer_activation_reductions(found) -> float:
    return _elements(found, ("all-reduce",), lambda c: "encoder/layer_" in c.op_name)


MEGATRON = 4 * LAYERS * BATCH * SEQ * HIDDEN
GRADIENTS = ("all-reduce", "reduce-scatter")


def _check_data(found, params, _):
    assert _elements(found, GRADIENTS) == pytest.approx(params, rel=0.1)
    assert _elements(found, ("all-gather", "all-to-all", "collective-permute")) < 0.01 * params


def _check_fsdp(found, params, fsdp_sharded):
    gathered = _elements(found, ("all-gather",))
    assert 0.9 * fsdp_sharded <= gathered <= 2.2 * fsdp_sharded, (gathered, fsdp_sharded)
    assert _elements(found, GRADIENTS) == pytest.approx(params, rel=0.1)


def _check_tensor(found, params, _):
    assert _per_layer_activation_reductions(found) == pytest.approx(MEGATRON, rel=0.1), (
        collections.Counter(c.op_name.split("/")[-3] for c in found
                            if "encoder/layer_0" in c.op_name))


CHECKS = {(8, 1, 1): _check_data, (1, 8, 1): _check_fsdp, (1, 1, 8): _check_tensor}


@pytest.fixture(scope="module", params=list(CHECKS), ids=["data", "fsdp", "tensor"])
def cpu_program(request):
    return request.param, _compile(request.param, jax.devices()[:8])


def test_each_layout_sends_what_first_principles_say(cpu_program):
    layout, compiled = cpu_program
    CHECKS[layout](*compiled)


def test_no_collective_runs_inside_an_attention_loop():
    found, _, _ = _compile((4, 1, 2), jax.devices()[:8], backend="blockwise")
    inside = [c for c in found if c.inside("attention")]
    assert not inside, [(c.kind, c.dtype, c.executions, c.op_name) for c in inside[:3]]


def test_the_tensor_check_fails_on_separate_qkv_projections(monkeypatch):
    """The audit can fail: q, k and v projected by three einsums (zoo before it fused them)
    leave three partial input gradients, which the partitioner all-reduces separately."""
    from zoo.nn import attention, precision

    def separate(projections, x, dtype):
        return [precision.param_einsum("btm,mhd->bthd", x, k, dtype) + b.astype(dtype)
                for k, b in projections]

    monkeypatch.setattr(attention, "_fused_qkv", separate)
    found, params, _ = _compile((1, 1, 8), jax.devices()[:8])
    with pytest.raises(AssertionError):
        _check_tensor(found, params, None)
    assert _per_layer_activation_reductions(found) > 1.2 * MEGATRON


@needs_libtpu
@pytest.mark.parametrize("layout", list(CHECKS), ids=["data", "fsdp", "tensor"])
def test_the_tpu_compiler_sends_what_first_principles_say(layout):
    from zoo.train import topologies

    devices = topologies.compile_only_devices(topologies.parse("v5e-8"))
    found, params, fsdp_sharded = _compile(layout, devices)
    if layout == (1, 8, 1):
        # The TPU compiler reduce-scatters FSDP-sharded gradients (half an all-reduce's bytes),
        # though it folds some small ones (embeddings) into a combined all-reduce; and it
        # gathers weights more often than twice (per use, measured), so only the floor holds.
        assert _elements(found, ("reduce-scatter",)) >= 0.5 * fsdp_sharded
        assert _elements(found, GRADIENTS) == pytest.approx(params, rel=0.1)
        assert _elements(found, ("all-gather",)) >= 0.9 * fsdp_sharded
    else:
        CHECKS[layout](found, params, fsdp_sharded)
    assert not [c for c in found if c.inside("attention")]
    # Every loop's trip count is read (the TPU compiler prints none; see collectives.py).
    assert all(loop.trip_count for c in found for loop in c.loops)


def test_trip_counts_and_bytes_of_a_loop_of_collectives():
    """A psum inside a 5-step scan: one all-reduce in the program, run 5 times per call."""
    mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=jax.devices()[:8])

    def per_device(x):
        def body(carry, _):
            return jax.lax.psum(carry, "d") * 0.5, None
        return jax.lax.scan(body, x, None, length=5)[0]

    spec = jax.sharding.PartitionSpec("d")
    f = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=spec, out_specs=spec,
                              check_vma=False))
    text = f.lower(jax.ShapeDtypeStruct((8 * 3, 16), np.float32)).compile().as_text()
    [reduce] = [c for c in collectives.collectives(text) if c.kind == "all-reduce"]
    assert reduce.shapes == ((3, 16),) and reduce.bytes == 3 * 16 * 4
    assert reduce.group_size == 8 and reduce.executions == 5
    assert reduce.wire_bytes == pytest.approx(2 * 7 / 8 * 3 * 16 * 4)
    assert collectives.bytes_per_execution([reduce]) == 5 * 3 * 16 * 4


# The TPU compiler's text for a scan's loop (no known_trip_count; a `counter < 12` condition)
# around its fused reduce-scatter, trimmed from a real compile of zoo's BERT for v5e-8.
_TPU_TEXT = """\
%all-reduce-scatter.1 (input_0: f32[256,128]) -> f32[32,128] {
  %input_0 = f32[256,128]{1,0} parameter(0)
  %all-reduce.9 = f32[256,128]{1,0:T(8,128)} all-reduce(%input_0), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add, metadata={op_name="jit(train_step)/transpose(jvp(BertForPreTraining))/bert/encoder/while/body/closed_call/layers/mlp/wi/dot_general"}
  ROOT %slice = f32[32,128]{1,0} slice(%all-reduce.9), slice={[0:32], [0:128]}
}

%body (p: (s32[], f32[256,128])) -> (s32[], f32[256,128]) {
  %p = (s32[], f32[256,128]) parameter(0)
  %g = f32[256,128]{1,0} get-tuple-element(%p), index=1
  %fusion.7 = f32[32,128]{1,0} fusion(%g), kind=kCustom, calls=%all-reduce-scatter.1
  ROOT %t = (s32[], f32[256,128]) tuple(%i, %g)
}

%cond (p.1: (s32[], f32[256,128])) -> pred[] {
  %constant.5 = s32[]{:T(128)} constant(12)
  %p.1 = (s32[], f32[256,128]) parameter(0)
  %i.1 = s32[]{:T(128)} get-tuple-element(%p.1), index=0
  ROOT %lt = pred[]{:T(512)} compare(%i.1, %constant.5), direction=LT
}

ENTRY %main (a: f32[256,128]) -> f32[256,128] {
  %a = f32[256,128]{1,0} parameter(0)
  %while.1 = (s32[], f32[256,128]) while(%init), condition=%cond, body=%body, metadata={op_name="jit(train_step)/jvp(BertForPreTraining)/bert/encoder/while"}
  ROOT %out = f32[256,128]{1,0} get-tuple-element(%while.1), index=1
}
"""


def test_loops_the_compiler_made_are_not_the_programs():
    windowed = collectives.Loop(
        "jit(train_step)/jvp(BertForPreTraining)/bert/encoder/while/body/closed_call/layers/"
        "self_attention/btm,mjhd->btjhd/dot_general", 8)
    layers = collectives.Loop("jit(train_step)/jvp(BertForPreTraining)/bert/encoder/while", 12)
    assert windowed.made_by_compiler and not layers.made_by_compiler
    permute = collectives.Collective("collective-permute", "bf16", ((48, 64),), 6144, 2, "",
                                     "", (layers, windowed), "cp")
    assert permute.executions == 96 and not permute.inside("attention")


def test_the_tpu_compilers_loops_and_fused_reduce_scatter_are_read():
    [scatter] = collectives.collectives(_TPU_TEXT)
    assert scatter.kind == "reduce-scatter" and scatter.executions == 12
    assert scatter.bytes == 256 * 128 * 4  # the whole gradient, reduced once
    assert scatter.wire_bytes == pytest.approx(7 / 8 * 256 * 128 * 4)
    assert scatter.inside("encoder") and not scatter.inside("attention")
