"""A job's real train step compiled ahead of time for a TPU slice this machine does not have.

The step is zoo.train.program's (the one the loop runs), traced over abstract arrays on a mesh of
the slice's compile-only devices (zoo.train.compilation.topologies) and compiled by the TPU compiler
in libtpu: what comes back is what a pod would run. From it: per-device memory (XLA's own accounting
of arguments, outputs, donated buffers and temporaries), the collectives of the partitioned program
(zoo.train.compilation.collectives), and the matmul FLOPs the step executes
(zoo.train.compilation.flops) beside the model's own count. Over several slices the mesh's data axis
spans them (zoo.train.partitioning.make_mesh); what crosses slices is reported apart, at the DCN's
bandwidth.
"""

import contextlib
import dataclasses
import time

import jax
import ml_collections

from zoo import contract
from zoo.errors import ConfigError
from zoo.train import partitioning, program
from zoo.train.compilation import collectives as collectives_lib
from zoo.train.compilation import flops as flops_lib
from zoo.train.compilation import topologies


class DoesNotFitError(ConfigError):
    """The train step needs more HBM per device than the slice's chips have (the message
    gives the figure and the config keys that shrink it)."""


@dataclasses.dataclass
class CompiledStep:
    """What the TPU compiler says of one train step (bytes and FLOPs are per device)."""

    slice: topologies.Slice
    mesh_shape: dict[str, int]
    argument_bytes: float
    output_bytes: float
    alias_bytes: float  # outputs written into donated arguments (the new state)
    temp_bytes: float
    executed_flops: float  # matmul FLOPs the program runs, remat included (HFU's numerator)
    model_flops: float  # the task's flops_per_token x tokens / devices (MFU's numerator)
    collectives: list[collectives_lib.Collective]
    compile_seconds: float
    hlo: str  # the partitioned per-device program
    bytes_accessed: float = 0.0  # the compiler's cost analysis: HBM bytes read and written

    @property
    def total_bytes(self) -> float:
        """Peak HBM of the step: arguments, outputs not written over a donated argument, and
        the temporaries XLA's buffer assignment needs at once."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes

    @property
    def hbm_bytes(self) -> float:
        return self.slice.chip.hbm_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.hbm_bytes

    @property
    def collective_bytes(self) -> float:
        """Bytes each device sends over ICI per step with ring algorithms
        (Collective.wire_bytes)."""
        return collectives_lib.wire_bytes_per_execution(self.collectives)

    @property
    def cross_slice(self) -> list[collectives_lib.Collective]:
        """The collectives that cross slices (none on one slice)."""
        return [c for c in self.collectives if c.crosses_slices]

    @property
    def dcn_bytes(self) -> float:
        """Bytes each device sends to other slices per step (Collective.dcn_bytes)."""
        return collectives_lib.dcn_bytes_per_execution(self.collectives)

    def compute_seconds(self, mfu: float = 0.5) -> float:
        """The step's time at `mfu` of the chip's dense bf16 peak (the model's FLOPs)."""
        return self.model_flops / (mfu * self.slice.chip.peak_flops)

    def communication_seconds(self) -> float:
        """The collectives' bytes at the chip's one-direction ICI bandwidth: a lower bound,
        and the time that is exposed if nothing overlaps it with compute."""
        return self.collective_bytes / self.slice.chip.ici_bytes_per_s

    def dcn_seconds(self) -> float:
        """The cross-slice bytes at the chip's share of its host's DCN bandwidth: a lower
        bound, exposed unless overlapped with compute (the backward pass, for gradients)."""
        return self.dcn_bytes / self.slice.chip.dcn_bytes_per_s if self.dcn_bytes else 0.0


def compile_train_step(task, config: ml_collections.ConfigDict,
                       tpu_slice: topologies.Slice) -> CompiledStep:
    """Compiles `task`'s train step under `config` (its mesh sizes and rules) for `tpu_slice`
    (all its slices: the config's data axis spans them).

    Raises:
      DoesNotFitError: the TPU compiler found the step too big for the chips' HBM.
      ConfigError: libtpu is missing, or the mesh / a parameter / the batch does not fit the
        slice's devices (each naming the config key).
    """
    devices = topologies.compile_only_devices(tpu_slice)
    mesh = partitioning.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor,
                                  devices=devices)
    train_step, args = program.abstract_train_step(task, config, mesh)
    began = time.perf_counter()
    with _not_cached(), program.lowering_context(config, mesh):
        # One trace for both: the compiler's input and the jaxpr the FLOPs are counted from.
        traced = train_step.trace(*args)
        try:
            compiled = traced.lower().compile()
        except jax.errors.JaxRuntimeError as e:
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            # The TPU compiler refuses a program whose buffers exceed HBM, saying by how much.
            detail = str(e).split("RESOURCE_EXHAUSTED:", 1)[1].strip().splitlines()[0]
            raise DoesNotFitError(
                f"{config.task} does not fit {tpu_slice.label} on mesh {dict(mesh.shape)}: the "
                f"TPU compiler says: {detail} Change {memory_advice(config)}") from None
        executed = flops_lib.count_jaxpr(traced.jaxpr)
    seconds = time.perf_counter() - began
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis() or {}
    hlo = compiled.as_text()
    return CompiledStep(
        slice=tpu_slice, mesh_shape=dict(mesh.shape),
        argument_bytes=float(memory.argument_size_in_bytes),
        output_bytes=float(memory.output_size_in_bytes),
        alias_bytes=float(memory.alias_size_in_bytes),
        temp_bytes=float(memory.temp_size_in_bytes),
        executed_flops=executed / mesh.size,
        model_flops=contract.flops_per_token(task) * task.tokens_per_batch() / mesh.size,
        collectives=collectives_lib.collectives(
            hlo, slice_of=[getattr(d, "slice_index", 0) for d in mesh.devices.flat]),
        compile_seconds=seconds, hlo=hlo, bytes_accessed=float(cost.get("bytes accessed", 0.0)))


@contextlib.contextmanager
def _not_cached():
    """No persistent-cache entry for a compile-only program: jax writes one, then cannot read it
    back without a TPU client (a warning on every later compile of the same step)."""
    keys = ("jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes")
    before = [getattr(jax.config, key) for key in keys]
    jax.config.update(keys[0], 1e12)
    jax.config.update(keys[1], 2**62)
    try:
        yield
    finally:
        for key, value in zip(keys, before):
            jax.config.update(key, value)


def memory_advice(config: ml_collections.ConfigDict) -> str:
    """The config keys that shrink a step's memory, with their values in `config`."""
    model = config.model
    keys = [f"config.data.batch_size={config.data.batch_size} (or "
            f"config.train.grad_accum_steps={config.train.grad_accum_steps} to split it)"]
    if "remat" in model:
        keys.append(f"config.model.remat={model.remat!r} ('full' recomputes each layer)")
    keys.append(f"config.mesh.fsdp={config.mesh.fsdp} (shards params and optimizer state)")
    keys.append(f"config.data.seq_len={config.data.seq_len}")
    return "; ".join(keys)
