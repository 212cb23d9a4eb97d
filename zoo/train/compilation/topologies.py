"""TPU slices by the names users rent them by ('v5e-256', 'v4-32'), as compile-only devices.

libtpu (the `tpu` extra: pip install "jax[tpu]==<the locked jax>") describes any slice without
the hardware: `jax.experimental.topologies.get_topology_desc` returns devices that jax can
compile for but never run on, so the real TPU compiler checks a pod's program on a laptop
(MaxText's train_compile and axlearn's aot_compilation do the same). The names follow Cloud
TPU's accelerator types: v4 and v5p count TensorCores (two per chip, used as one 'megacore'
device, so v4-32 is 16 devices); v5e and v6e count chips (one TensorCore each). Several slices
of one type (Cloud TPU Multislice: their chips talk over ICI within a slice and over the
data-center network, DCN, between slices) are described together the same way, each device
carrying its `slice_index` (MaxText's compile_topology_num_slices).
"""

import dataclasses
import math
import os

from zoo.errors import ConfigError
from zoo.train.compilation import chips

INSTALL = 'pip install "jax[tpu]==<your jax version>"  (the tpu extra: pip install -e ".[tpu]")'

# chip name -> (cores per chip, torus dimensions, libtpu's chip config)
_FAMILIES = {"v4": (2, 3, "megacore"), "v5p": (2, 3, "megacore"),
             "v5e": (1, 2, "default"), "v6e": (1, 2, "default")}
# libtpu's names for the families
_TOPOLOGY_PREFIX = {"v4": "v4", "v5p": "v5", "v5e": "v5e", "v6e": "v6e"}


@dataclasses.dataclass(frozen=True)
class Slice:
    name: str  # 'v5e-16'
    chip: chips.Chip
    shape: tuple[int, ...]  # chips along each torus axis of one slice, e.g. (4, 4)
    num_slices: int = 1  # slices joined by the DCN (Multislice)

    @property
    def devices_per_slice(self) -> int:
        return math.prod(self.shape)

    @property
    def devices(self) -> int:  # all slices'
        return self.devices_per_slice * self.num_slices

    @property
    def label(self) -> str:  # 'v5e-16', or '2 x v5e-16' for two slices
        return self.name if self.num_slices == 1 else f"{self.num_slices} x {self.name}"

    @property
    def accelerator_type(self) -> str:  # Cloud TPU's name, which calls v5e 'v5litepod'
        return self.name.replace("v5e-", "v5litepod-")

    @property
    def topology_name(self) -> str:  # libtpu's form, e.g. 'v5e:4x4'
        return f"{_TOPOLOGY_PREFIX[self.chip.name]}:{'x'.join(map(str, self.shape))}"


def _torus_shape(chips_count: int, dims: int) -> tuple[int, ...]:
    """The slice shape Cloud TPU gives `chips_count` chips: 2D slices as square as powers of
    two allow (v5e-32 is 4x8); 3D slices grow from 2x2x1 one axis at a time, smallest first
    (v4-32 = 16 chips = 2x2x4, v4-128 = 64 chips = 4x4x4), as the v4 / v5p pages list them."""
    if chips_count < 1 or chips_count & (chips_count - 1):
        raise ValueError(chips_count)
    if dims == 2:
        if chips_count <= 2:  # v5e-1 (1x1), v5e-2 (1x2... not offered) handled by the caller
            return (1, chips_count)
        a = 2 ** (int(math.log2(chips_count)) // 2)
        return (a, chips_count // a)
    if chips_count < 4:
        raise ValueError(chips_count)
    shape = [2, 2, 1]
    while math.prod(shape) < chips_count:
        # double the smallest axis, the last of equals first (2x2x1 -> 2x2x2 -> 2x2x4 -> 2x4x4)
        smallest = min(shape)
        axis = max(i for i, size in enumerate(shape) if size == smallest)
        shape[axis] *= 2
        shape.sort()
    return tuple(shape)


def parse(name: str, num_slices: int = 1) -> Slice:
    """'v5e-256' (and a number of such slices) -> Slice; a ConfigError naming the accepted
    forms for anything else."""
    if isinstance(num_slices, bool) or not isinstance(num_slices, int) or num_slices < 1:
        raise ConfigError(f"--num_slices={num_slices!r}: give the number of {name} slices the "
                          "job spans, 1 or more (2 for two slices joined by the DCN)")
    family, _, count = name.partition("-")
    if family not in _FAMILIES or not count.isdigit():
        raise ConfigError(
            f"--topology={name!r} is not a TPU slice name; give a Cloud TPU accelerator type: "
            "v4-8 ... v4-4096 and v5p-8 ... (TensorCores, 2 per chip), v5e-1 ... v5e-256 and "
            "v6e-1 ... v6e-256 (chips)")
    cores_per_chip, dims, _ = _FAMILIES[family]
    cores = int(count)
    chips_count = cores // cores_per_chip
    try:
        if cores % cores_per_chip:
            raise ValueError(cores)
        shape = _torus_shape(chips_count, dims)
    except ValueError:
        smallest = "8" if dims == 3 else "1"
        raise ConfigError(
            f"--topology={name!r}: {family} slices come in powers of two from {family}-"
            f"{smallest} ({'TensorCores, 2 per chip' if cores_per_chip == 2 else 'chips'}); "
            f"e.g. {family}-{8 if dims == 3 else 16}") from None
    if dims == 2 and chips_count > 256:
        raise ConfigError(f"--topology={name!r}: a {family} pod has 256 chips; use {family}-256 "
                          f"or fewer, and --num_slices={chips_count // 256} for more chips")
    return Slice(name, chips.by_name(family), shape, num_slices)


def compile_only_devices(tpu_slice: Slice) -> list:
    """The slice's devices (every slice's, slice by slice), for compiling only (libtpu, no TPU
    needed).

    Raises:
      ConfigError: libtpu is not installed (with the one install line).
    """
    try:
        import libtpu  # noqa: F401  (present only with the tpu extra)
    except ImportError:
        raise ConfigError(f"compiling for {tpu_slice.name} needs libtpu, which is not "
                          f"installed; install it with: {INSTALL}") from None
    # Compile-only use of libtpu: no metadata server to ask (this is not a TPU VM), one
    # worker (itself) and the slice's accelerator type, which libtpu would otherwise warn it
    # cannot find; and several processes (pytest workers) may hold libtpu at once, which its
    # lock file forbids. A TPU VM's own settings are kept.
    for name, value in (("TPU_SKIP_MDS_QUERY", "1"), ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"),
                        ("TPU_WORKER_HOSTNAMES", "localhost"), ("TPU_WORKER_ID", "0"),
                        ("TPU_ACCELERATOR_TYPE", tpu_slice.accelerator_type)):
        os.environ.setdefault(name, value)
    from jax.experimental import topologies

    _, dims, chip_config = _FAMILIES[tpu_slice.chip.name]
    # Hosts of 2x2(x1) chips; a slice of fewer chips is one host of all of them.
    per_host = (2, 2, 1) if tpu_slice.devices_per_slice >= 4 else (*tpu_slice.shape, 1)
    kwargs = {"chip_config_name": chip_config, "chips_per_host_bounds": per_host}
    if tpu_slice.num_slices > 1:  # devices of slice i carry slice_index i
        kwargs["num_slices"] = tpu_slice.num_slices
    description = topologies.get_topology_desc(
        topology_name=tpu_slice.topology_name, platform="tpu", **kwargs)
    devices = list(description.devices)
    if len(devices) != tpu_slice.devices:
        raise RuntimeError(f"libtpu described {len(devices)} devices for {tpu_slice.label} "
                           f"({tpu_slice.topology_name}), expected {tpu_slice.devices}")
    return devices
