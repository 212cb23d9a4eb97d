"""What each accelerator chip offers a train step: dense bf16 peak, HBM, interconnect.

One row per chip, each figure with its source, so MFU (zoo.train.metrics), the compile command
(zoo.commands.compile) and the pod-readiness benchmark read the same numbers. Peaks are dense
bf16 matmul FLOP/s per chip (not the 2x "with sparsity" figures). `ici_bytes_per_s` is the
one-direction inter-chip bandwidth of one chip over all its links: half the bidirectional
figure the Cloud TPU pages give. A ring collective over a torus axis sends its bytes in one
direction around the ring, so wire bytes / this figure is a lower bound on the time.
`dcn_bytes_per_s` is a chip's share of its host's data-center network bandwidth (one
direction), what crosses between the slices of a Multislice job: tens of times less than ICI.
"""

import dataclasses

GIB = 2.0**30


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str  # the name users know ('v5e')
    device_kind: str  # jax's Device.device_kind for it
    peak_flops: float  # dense bf16 FLOP/s per chip
    hbm_bytes: float
    ici_bytes_per_s: float  # one direction, all links of the chip (0: not an ICI chip)
    source: str
    dcn_bytes_per_s: float = 0.0  # the chip's share of its host's DCN, one direction


CHIPS = (
    # https://cloud.google.com/tpu/docs/v4: 275 TFLOP/s bf16, 32 GiB HBM2. The page gives no
    # per-chip ICI figure; How To Scale Your Model (jax-ml.github.io/scaling-book/tpus) gives
    # 4.5e10 B/s one way per link and 6 links (3D torus). DCN: no v4 figure on Cloud TPU's
    # pages; the scaling book's "typically around 2.5e10 bytes / second per host", over a v4
    # host's 4 chips.
    Chip("v4", "TPU v4", 275e12, 32 * GIB, 6 * 4.5e10,
         "cloud.google.com/tpu/docs/v4; ICI, DCN: jax-ml.github.io/scaling-book/tpus",
         dcn_bytes_per_s=2.5e10 / 4),
    # https://cloud.google.com/tpu/docs/v5e: 197 TFLOP/s bf16, "16 GB" HBM2 (GiB: the TPU
    # compiler offers 15.75 GiB of it to a program), 400 GBps bidirectional ICI per chip;
    # DCN "2 x 100 Gbps NIC" per host of 8 chips (the page's 6.4 Tbps per 256-chip pod).
    Chip("v5e", "TPU v5 lite", 197e12, 16 * GIB, 400e9 / 2, "cloud.google.com/tpu/docs/v5e",
         dcn_bytes_per_s=2 * 100e9 / 8 / 8),
    # https://cloud.google.com/tpu/docs/v5p: 459 TFLOP/s bf16, 95 GiB HBM, 1200 GBps
    # bidirectional ICI per chip, "Data center network (DCN) bandwidth per chip: 50 Gbps".
    Chip("v5p", "TPU v5", 459e12, 95 * GIB, 1200e9 / 2, "cloud.google.com/tpu/docs/v5p",
         dcn_bytes_per_s=50e9 / 8),
    # https://cloud.google.com/tpu/docs/v6e: 918 TFLOP/s bf16, "32 GB" HBM (GiB, as v5e's),
    # 800 GBps bidirectional ICI per chip; DCN "4 x 200 Gbps NIC" per host of 8 chips (the
    # page's 25.6 Tbps per 256-chip pod).
    Chip("v6e", "TPU v6 lite", 918e12, 32 * GIB, 800e9 / 2, "cloud.google.com/tpu/docs/v6e",
         dcn_bytes_per_s=4 * 200e9 / 8 / 8),
    # NVIDIA H100 / H200 SXM datasheets: 989 TFLOP/s dense bf16 (1,979 is with 2:4 sparsity);
    # 80 GB HBM3 / 141 GB HBM3e. A100 SXM: 312 TFLOP/s dense bf16. No ICI (NVLink instead).
    Chip("H100", "NVIDIA H100", 989e12, 80e9, 0.0, "nvidia.com H100 datasheet (dense)"),
    Chip("H200", "NVIDIA H200", 989e12, 141e9, 0.0, "nvidia.com H200 datasheet (dense)"),
    Chip("A100", "NVIDIA A100", 312e12, 80e9, 0.0, "nvidia.com A100 datasheet (dense)"),
)


def by_name(name: str) -> Chip:
    for chip in CHIPS:
        if chip.name == name:
            return chip
    raise KeyError(name)


def for_device_kind(kind: str) -> Chip | None:
    """The chip a jax device reports as `kind` (e.g. 'TPU v5 lite', 'NVIDIA H100 80GB HBM3');
    None where unknown (CPUs). 'TPU v5' (v5p) must not match 'TPU v5 lite' (v5e), so TPU
    kinds match whole; GPU kinds start with the chip's name and carry memory and form."""
    for chip in CHIPS:
        if chip.device_kind.startswith("TPU"):
            if kind == chip.device_kind:
                return chip
        elif kind.startswith(chip.device_kind) or chip.name in kind.split():
            return chip
    return None
