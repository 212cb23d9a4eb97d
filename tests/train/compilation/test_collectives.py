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
* across two slices (Multislice, data parallel across them): only the gradient reduction
  crosses, P elements; each device sends over the DCN its share of it (the hierarchical
  all-reduce: a 1/m piece, m devices per slice); nothing of the forward or backward does.
"""

import collections
import typing

import jax
import numpy as np
import pytest

from benchmarks import step as bench_step
from tests.libtpu import needs_libtpu
from zoo.train import partitioning, program
from zoo.train.compilation import aot, collectives

LAYERS, HIDDEN, HEADS, MLP, VOCAB, SEQ, BATCH = 2, 128, 8, 512, 256, 64, 16


def _config(layout, backend="einsum", dtype="float32", batch=BATCH):
    config = bench_step.job_config("bert", "tiny", SEQ, batch, dtype)
    config.model.update(num_layers=LAYERS, hidden_size=HIDDEN, num_heads=HEADS,
                        intermediate_size=MLP, dropout_rate=0.0, attention_dropout_rate=0.0,
                        backend=backend, attention_block=16)
    config.data.vocab_size = VOCAB
    config.mesh.update(data=layout[0], fsdp=layout[1], tensor=layout[2])
    return config


class Compiled(typing.NamedTuple):
    found: list  # the collectives
    params: int  # P
    fsdp_sharded: int  # P_f
    text: str  # the compiled program


def _compile(layout, devices, backend="einsum") -> Compiled:
    """The job's train step compiled on `devices`."""
    config = _config(layout, backend)
    task = bench_step.make_task("bert", config, VOCAB)
    mesh = partitioning.make_mesh(*layout, devices=devices)
    train_step, (state, batch) = program.abstract_train_step(task, config, mesh)
    with aot._not_cached(), program.lowering_context(config, mesh):
        text = train_step.lower(state, batch).compile().as_text()
    leaves = jax.tree.leaves(state.params)
    params = sum(x.size for x in leaves)
    fsdp_sharded = sum(x.size for x in leaves if "fsdp" in jax.tree.leaves(tuple(x.sharding.spec)))
    return Compiled(collectives.collectives(text), params, fsdp_sharded, text)


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


@pytest.mark.slow
def test_each_layout_sends_what_first_principles_say(cpu_program):
    layout, compiled = cpu_program
    CHECKS[layout](*compiled[:3])


def test_no_collective_runs_inside_an_attention_loop():
    found = _compile((4, 1, 2), jax.devices()[:8], backend="blockwise").found
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
    found, params, _, _ = _compile((1, 1, 8), jax.devices()[:8])
    with pytest.raises(AssertionError):
        _check_tensor(found, params, None)
    assert _per_layer_activation_reductions(found) > 1.2 * MEGATRON


@needs_libtpu
@pytest.mark.parametrize("layout", list(CHECKS), ids=["data", "fsdp", "tensor"])
def test_the_tpu_compiler_sends_what_first_principles_say(layout):
    from zoo.train.compilation import topologies

    devices = topologies.compile_only_devices(topologies.parse("v5e-8"))
    found, params, fsdp_sharded, _ = _compile(layout, devices)
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


# The 8 devices as two slices of 4 in the order make_mesh lays a hybrid mesh (the data axis
# outermost, each slice's devices contiguous): positions 0-3 one slice, 4-7 the other.
TWO_SLICES = [i // 4 for i in range(8)]


def test_across_two_slices_each_layout_sends_what_first_principles_say(cpu_program):
    """Data parallel across the slices sends the gradients across and nothing else; FSDP or
    tensor parallelism across them (which make_mesh refuses) would send the weights or the
    activations, and the audit sees them."""
    layout, compiled = cpu_program
    found = collectives.collectives(compiled.text, slice_of=TWO_SLICES)
    crossing = [c for c in found if c.crosses_slices]
    if layout == (8, 1, 1):
        assert {c.kind for c in crossing} == {"all-reduce"}
        assert _elements(crossing, GRADIENTS) == pytest.approx(compiled.params, rel=0.1)
        # Each device sends 2 (s-1)/s of a quarter of the f32 gradients: P x 4 / 4 bytes.
        assert collectives.dcn_bytes_per_execution(found) == pytest.approx(
            compiled.params, rel=0.1)
    elif layout == (1, 8, 1):
        assert _elements(crossing, ("all-gather",)) >= 0.9 * compiled.fsdp_sharded
    else:
        assert _per_layer_activation_reductions(crossing) == pytest.approx(MEGATRON, rel=0.1)


# Replica groups in each form XLA prints, on two slices of 4 (TWO_SLICES).
_GROUPS_TEXT = """\
HloModule m, num_partitions=8

ENTRY %main (a: f32[8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  %in = f32[8]{0} all-reduce(%a), channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add
  %across = f32[8]{0} all-reduce(%a), channel_id=2, replica_groups={{0,4},{1,5},{2,6},{3,7}}, to_apply=%add
  %iota.in = f32[8]{0} all-reduce(%a), channel_id=3, replica_groups=[2,4]<=[8], to_apply=%add
  %iota.across = f32[8]{0} all-reduce(%a), channel_id=4, replica_groups=[4,2]<=[2,4]T(1,0), to_apply=%add
  %mesh.in = f32[8]{0} all-reduce(%a), channel_id=5, replica_groups=mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_0'}, use_global_device_ids=true, to_apply=%add
  %mesh.across = f32[8]{0} all-reduce(%a), channel_id=6, replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0'}, use_global_device_ids=true, to_apply=%add
  %permute.across = f32[8]{0} collective-permute(%a), channel_id=7, source_target_pairs={{0,1},{3,4}}
  ROOT %permute.in = f32[8]{0} collective-permute(%a), channel_id=8, source_target_pairs={{0,1},{5,6}}
}
"""


def test_replica_groups_in_every_form_are_attributed_to_slices():
    found = {c.name: c for c in collectives.collectives(_GROUPS_TEXT, slice_of=TWO_SLICES)}
    assert {name: c.slices for name, c in found.items()} == {
        "in": 1, "across": 2, "iota.in": 1, "iota.across": 2, "mesh.in": 1, "mesh.across": 2,
        "permute.across": 2, "permute.in": 1}
    assert [found[n].group_size for n in ("mesh.in", "mesh.across")] == [4, 2]
    # 2 (s-1)/s of the 32-byte array over the m = group / s devices of a slice in a group (1)
    assert found["across"].dcn_bytes == 32
    assert found["in"].dcn_bytes == 0
    # A program of one slice's devices (the TPU compiler's, below): its groups are that
    # slice's, whatever they say.
    one_slice = _GROUPS_TEXT.replace("num_partitions=8", "num_partitions=4")
    assert not any(c.crosses_slices for c in collectives.collectives(one_slice, TWO_SLICES))


# The TPU compiler's program for one slice of 2 x v5e-4, trimmed: a gradient reduce-scattered
# within the slice, its quarter sent to the other slice (an all-reduce over the DCN); a
# weight's piece gathered across slices; an all-to-all over both slices' 8 devices.
_DCN_TEXT = """\
HloModule jit_train_step, is_scheduled=true, num_partitions=4

ENTRY %main (g: f32[256,128], w: f32[16,128]) -> f32[64,128] {
  %g = f32[256,128]{1,0} parameter(0)
  %w = f32[16,128]{1,0:T(8,128)} parameter(1)
  %reduce-scatter.19 = f32[64,128]{1,0:T(8,128)} reduce-scatter(%g), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true, to_apply=%add, metadata={op_name="jit(train_step)/transpose(jvp(BertForPreTraining))/bert/encoder/layer_0/mlp/wi/dot_general"}
  %bitcast.9 = f32[8,8,128]{2,1,0:T(8,128)} bitcast(%reduce-scatter.19)
  %after-all.4 = token[] after-all()
  %send.4 = (f32[8,8,128]{2,1,0:T(8,128)}, u32[], token[]) send(%bitcast.9, %after-all.4), channel_id=11, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_host_transfer_rendezvous="all-reduce.47_0",_xla_megascale_reduce_operation="SUM",_xla_megascale_target="{1,2}x{0:3}",_xla_megascale_transfer_type="ALL_REDUCE"}, backend_config={"aggregated_send_recv_config":{"status":"AGGREGATE_STATUS_DEFER"}}
  %send-done.4 = token[] send-done(%send.4), channel_id=11, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime"}
  %recv.4 = (f32[8,8,128]{2,1,0:T(8,128)}, u32[], token[]) recv(%after-all.4), channel_id=10, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_host_transfer_rendezvous="all-reduce.47_0",_xla_megascale_reduce_operation="SUM",_xla_megascale_target="{1,2}x{0:3}",_xla_megascale_transfer_type="ALL_REDUCE"}
  %send.14 = (f32[16,128]{1,0:T(8,128)}, u32[], token[]) send(%w, %after-all.4), channel_id=9, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_host_transfer_rendezvous="all-gather.142_0",_xla_megascale_target="{1,2}x{0:3}",_xla_megascale_transfer_type="ALL_GATHER"}
  %send.2 = (f32[8,4,64,16]{2,3,1,0:T(8,128)}, u32[], token[]) send(%g, %after-all.4), channel_id=27, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_host_transfer_rendezvous="all-to-all_0",_xla_megascale_target={{100000,100001,100003,100002,200000,200001,200003,200002}},_xla_megascale_transfer_type="ALL_TO_ALL"}
  ROOT %out = f32[64,128]{1,0} get-tuple-element(%recv.4), index=0
}
"""


def test_the_tpu_compilers_cross_slice_sends_are_read():
    found = {c.name: c for c in collectives.collectives(_DCN_TEXT, slice_of=TWO_SLICES)}
    assert set(found) == {"reduce-scatter.19", "send.4", "send.14", "send.2"}
    scatter, reduce, gather, exchange = (found[n] for n in (
        "reduce-scatter.19", "send.4", "send.14", "send.2"))
    assert not scatter.crosses_slices and not scatter.dcn_transfer
    assert (reduce.kind, reduce.dtype, reduce.bytes, reduce.group_size, reduce.slices) == (
        "all-reduce", "f32", 64 * 128 * 4, 2, 2)
    assert reduce.dcn_transfer and reduce.dcn_bytes == 64 * 128 * 4  # 2 (2-1)/2 of it
    assert reduce.op_name.endswith("layer_0/mlp/wi/dot_general")  # from the reduce-scatter
    # A gather's send holds its own piece: the array is both slices' pieces, half sent.
    assert (gather.kind, gather.bytes, gather.dcn_bytes) == ("all-gather", 2 * 16 * 128 * 4,
                                                             16 * 128 * 4)
    assert (exchange.kind, exchange.group_size, exchange.slices) == ("all-to-all", 8, 2)
    # The DCN's bytes are not ICI's.
    assert collectives.wire_bytes_per_execution(list(found.values())) == scatter.wire_bytes
    assert collectives.dcn_bytes_per_execution(list(found.values())) == pytest.approx(
        reduce.dcn_bytes + gather.dcn_bytes + exchange.dcn_bytes)


@needs_libtpu
def test_two_tpu_slices_send_each_other_only_the_gradients():
    """BERT (bf16 compute, f32 parameters) data parallel on 2 x v5e-4, beside one v5e-4 with
    the same rows per device: the same per-device memory and FLOPs; across slices only the
    TPU compiler's DCN transfers, each an all-reduce of f32 (a gradient or the loss sums: an
    activation would be bf16) outside any loop; every gradient element leaves each slice at
    least once (the slice's 4 devices send >= P bytes, f32) and no device sends more than
    the whole gradient (the compiler sends some small gradients whole from every device
    instead of a quarter: ~0.4 P per device here)."""
    from zoo.commands import compile as compile_command
    from zoo.train.compilation import topologies

    steps = {}
    for count in (1, 2):
        config = _config((-1, 1, 1), dtype="bfloat16", batch=8 * count)
        task = bench_step.make_task("bert", config, VOCAB)
        steps[count] = aot.compile_train_step(task, config, topologies.parse("v5e-4", count))
    one, two = steps[1], steps[2]
    assert two.mesh_shape == {"data": 8, "fsdp": 1, "tensor": 1}
    assert two.executed_flops == one.executed_flops
    assert two.total_bytes == pytest.approx(one.total_bytes, rel=0.1)
    assert one.cross_slice == [] and one.dcn_bytes == 0

    crossing = two.cross_slice
    assert crossing and all(c.dcn_transfer for c in crossing)
    assert {(c.kind, c.dtype) for c in crossing} == {("all-reduce", "f32")}
    assert not [c for c in crossing if c.loops]
    _, (state, _) = program.abstract_train_step(
        task, config, partitioning.make_mesh(1, 1, 1, devices=jax.devices()[:1]))
    gradient = 4 * sum(x.size for x in jax.tree.leaves(state.params))
    sent = collectives.bytes_per_execution(crossing)
    assert gradient <= 4 * sent and sent <= gradient, (sent, gradient)

    text = compile_command.report(two, config)
    assert "for 2 x v5e-4 (8 x v5e, 2 slices of 4" in text
    assert f"across slices: {len(crossing)} collectives" in text and "GB/s DCN" in text
