"""Compiles a job's train step for a TPU slice with the real TPU compiler, on this machine:

    python -m zoo.commands.compile --config=configs/bert_pretrain.py:size=base \\
        --workdir=/tmp/bert --topology=v5e-16

prints per device the memory the step needs against the chip's HBM, the FLOPs it runs, and
every collective of the partitioned program (kind, count, bytes, groups, loops, source op);
with --num_slices=N (Multislice: N slices joined by the data-center network, the mesh's data
axis across them) also each collective that crosses slices, the bytes each device sends over
the DCN and their time at its bandwidth. Exits 1 with one line naming the config keys to
change when the step does not fit. Needs libtpu (the tpu extra): pip install
"jax[tpu]==<your jax version>". The job's task is built as train.py builds it (its data
prepared in --workdir if not cached), so the vocabulary and batch are the run's own.
"""

import collections
import os

# Before jax loads: this machine compiles for the slice but runs nothing on a TPU, so jax's
# runtime backend stays the CPU even where libtpu is installed (a TPU VM included).
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import flags  # noqa: E402

from zoo import paths  # noqa: E402
from zoo.commands import cli, jobs  # noqa: E402
from zoo.train import recipe
from zoo.train.compilation import aot, topologies  # noqa: E402
from zoo.train.compilation.chips import GIB  # noqa: E402

_TOPOLOGY = flags.DEFINE_string(
    "topology", None, "the TPU slice, as Cloud TPU names it: v4-8 ... v4-4096, v5p-8 ..., "
    "v5e-1 ... v5e-256, v6e-1 ... v6e-256")
_HLO = flags.DEFINE_string("hlo", None, "also write the compiled per-device program here")
_NUM_SLICES = flags.DEFINE_integer(
    "num_slices", 1, "how many such slices the job spans (Multislice: joined by the data-center "
    "network; config.mesh.data spans them, data parallel across slices)")
flags.mark_flag_as_required("topology")



def _short(op_name: str) -> str:
    # 'jit(train_step)/transpose(jvp(BertForPreTraining))/bert/.../mlp/wi/dot_general' ->
    # 'bert/.../mlp/wi/dot_general': the module path a reader recognises.
    parts = [p for p in op_name.split("/") if not p.startswith(("jit(", "jvp(", "transpose("))
             and p not in ("while", "body", "closed_call", "cond")]
    text = "/".join(parts) or "(made by XLA)"
    return text if len(text) <= 60 else "..." + text[-57:]


def collective_table(found, dcn: bool = False) -> list[str]:
    """One line per (kind, dtype, group, loops, source op): count, runs per step, bytes (with
    `dcn`, also the bytes each device sends to other slices, and how many slices a group
    spans)."""
    groups = collections.defaultdict(list)
    for c in found:
        # (the TPU compiler's multislice program keeps no op name on the layer scan's loop)
        loops = " > ".join(f"{_short(loop.op_name) if loop.op_name else '(loop)'}"
                           f"x{loop.trip_count or '?'}" for loop in c.loops)
        key = (c.kind, c.dtype, c.group_size, c.slices, loops or "-", _short(c.op_name))
        groups[key].append(c)
    extra = f" {'DCN MiB':>9} {'slices':>6}" if dcn else ""
    lines = [f"    {'kind':<18} {'dtype':<5} {'count':>5} {'runs/step':>9} {'MiB/step':>9} "
             f"{'group':>5}{extra}  loops; op"]
    for (kind, dtype, size, slices, loops, op), members in sorted(
            groups.items(), key=lambda kv: -sum(c.bytes * (c.executions or 1) for c in kv[1])):
        runs = sum(c.executions or 1 for c in members)
        mib = sum(c.bytes * (c.executions or 1) for c in members) / 2**20
        sent = sum(c.dcn_bytes * (c.executions or 1) for c in members) / 2**20
        extra = f" {sent:>9.2f} {slices:>6}" if dcn else ""
        lines.append(f"    {kind:<18} {dtype:<5} {len(members):>5} {runs:>9} {mib:>9.2f} "
                     f"{size:>5}{extra}  {loops}; {op}")
    return lines


def report(step: aot.CompiledStep, config) -> str:
    chip, tpu_slice = step.slice.chip, step.slice
    slices = (f"{tpu_slice.num_slices} slices of {tpu_slice.devices_per_slice}, "
              if tpu_slice.num_slices > 1 else "")
    lines = [
        f"compiled {config.task} for {tpu_slice.label} ({tpu_slice.devices} x {chip.name}, "
        f"{slices}{chip.hbm_bytes / GIB:.1f} GiB HBM each) on mesh {step.mesh_shape} in "
        f"{step.compile_seconds:.0f} s",
        f"  per device: arguments {step.argument_bytes / GIB:.3f} GiB, outputs "
        f"{step.output_bytes / GIB:.3f} GiB ({step.alias_bytes / GIB:.3f} written over donated "
        f"arguments), temporaries {step.temp_bytes / GIB:.3f} GiB",
        f"  total {step.total_bytes / GIB:.3f} GiB of {chip.hbm_bytes / GIB:.1f} GiB HBM "
        f"({step.total_bytes / chip.hbm_bytes:.0%})",
        f"  FLOPs per device per step: {step.executed_flops:.3e} executed (matmuls, remat "
        f"included: HFU), {step.model_flops:.3e} the model's (MFU); at 50% MFU "
        f"{step.compute_seconds() * 1e3:.1f} ms",
        f"  collectives: {step.collective_bytes / 2**20:.1f} MiB sent per device per step "
        f"(ring), {step.communication_seconds() * 1e3:.1f} ms at {chip.ici_bytes_per_s / 1e9:.0f}"
        f" GB/s ICI",
    ]
    lines += collective_table(step.collectives)
    if tpu_slice.num_slices > 1:
        crossing = step.cross_slice
        lines.append(
            f"  across slices: {len(crossing)} collectives, {step.dcn_bytes / 2**20:.1f} MiB sent "
            f"per device per step, {step.dcn_seconds() * 1e3:.1f} ms at "
            f"{chip.dcn_bytes_per_s / 1e9:.2f} GB/s DCN per chip")
        lines += collective_table(crossing, dcn=True) if crossing else []
    return "\n".join(lines)


def main(config, workdir):
    tpu_slice = topologies.parse(_TOPOLOGY.value, _NUM_SLICES.value)
    config = recipe.resolve(config)
    jobs.configure_storage(config)
    task = jobs.make_task(config, workdir)
    step = aot.compile_train_step(task, config, tpu_slice)
    print(report(step, config), flush=True)
    if _HLO.value:
        paths.write_atomic(_HLO.value, step.hlo)
    if not step.fits:
        raise aot.DoesNotFitError(
            f"the train step needs {step.total_bytes / GIB:.2f} GiB per device, more than the "
            f"{step.hbm_bytes / GIB:.1f} GiB HBM of a {step.slice.chip.name} chip; change "
            f"{aot.memory_advice(config)}")


if __name__ == "__main__":
    cli.run(main)
