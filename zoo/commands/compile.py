"""Compiles a job's train step for a TPU slice with the real TPU compiler, on this machine:

    python -m zoo.commands.compile --config=configs/bert_pretrain.py:size=base \\
        --workdir=/tmp/bert --topology=v5e-16

prints per device the memory the step needs against the chip's HBM, the FLOPs it runs, and
every collective of the partitioned program (kind, count, bytes, groups, loops, source op);
exits 1 with one line naming the config keys to change when the step does not fit. Needs
libtpu (the tpu extra): pip install "jax[tpu]==<your jax version>". The job's task is built
as train.py builds it (its data prepared in --workdir if not cached), so the vocabulary and
batch are the run's own.
"""

import collections
import os

# Before jax loads: this machine compiles for the slice but runs nothing on a TPU, so jax's
# runtime backend stays the CPU even where libtpu is installed (a TPU VM included).
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import flags  # noqa: E402

from zoo import paths  # noqa: E402
from zoo.commands import cli, jobs  # noqa: E402
from zoo.train import aot, recipe, topologies  # noqa: E402
from zoo.train.chips import GIB  # noqa: E402

_TOPOLOGY = flags.DEFINE_string(
    "topology", None, "the TPU slice, as Cloud TPU names it: v4-8 ... v4-4096, v5p-8 ..., "
    "v5e-1 ... v5e-256, v6e-1 ... v6e-256")
_HLO = flags.DEFINE_string("hlo", None, "also write the compiled per-device program here")
flags.mark_flag_as_required("topology")



def _short(op_name: str) -> str:
    # 'jit(train_step)/transpose(jvp(BertForPreTraining))/bert/.../mlp/wi/dot_general' ->
    # 'bert/.../mlp/wi/dot_general': the module path a reader recognises.
    parts = [p for p in op_name.split("/") if not p.startswith(("jit(", "jvp(", "transpose("))
             and p not in ("while", "body", "closed_call", "cond")]
    text = "/".join(parts) or "(made by XLA)"
    return text if len(text) <= 60 else "..." + text[-57:]


def collective_table(found) -> list[str]:
    """One line per (kind, dtype, group, loops, source op): count, runs per step, bytes."""
    groups = collections.defaultdict(list)
    for c in found:
        loops = " > ".join(f"{_short(loop.op_name)}x{loop.trip_count or '?'}" for loop in c.loops)
        groups[(c.kind, c.dtype, c.group_size, loops or "-", _short(c.op_name))].append(c)
    lines = [f"    {'kind':<18} {'dtype':<5} {'count':>5} {'runs/step':>9} {'MiB/step':>9} "
             f"{'group':>5}  loops; op"]
    for (kind, dtype, size, loops, op), members in sorted(
            groups.items(), key=lambda kv: -sum(c.bytes * (c.executions or 1) for c in kv[1])):
        runs = sum(c.executions or 1 for c in members)
        mib = sum(c.bytes * (c.executions or 1) for c in members) / 2**20
        lines.append(f"    {kind:<18} {dtype:<5} {len(members):>5} {runs:>9} {mib:>9.2f} "
                     f"{size:>5}  {loops}; {op}")
    return lines


def report(step: aot.CompiledStep, config) -> str:
    chip = step.slice.chip
    lines = [
        f"compiled {config.task} for {step.slice.name} ({step.slice.devices} x {chip.name}, "
        f"{chip.hbm_bytes / GIB:.1f} GiB HBM each) on mesh {step.mesh_shape} in "
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
    return "\n".join(lines + collective_table(step.collectives))


def main(config, workdir):
    tpu_slice = topologies.parse(_TOPOLOGY.value)
    config = recipe.resolve(config)
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
