"""Which generator draws dropout's masks (config.train.dropout_rng), per platform.

`threefry` draws each mask with JAX's counter-based Threefry-2x32: 20 rounds of 32-bit adds,
rotates and xors per pair of words, which XLA writes out as ordinary elementwise integer ops over
every masked value. `rbg` / `unsafe_rbg` draw them with XLA's RngBitGenerator, one op that TPUs
and GPUs run in hardware or one kernel (MaxText draws its dropout bits this way). `auto` is rbg
for a step on one GPU or TPU and threefry everywhere else: on a CPU the generators cost the
same, and across devices XLA does not partition RngBitGenerator (MaxText asks libtpu for that
with --xla_tpu_spmd_rng_bit_generator_unsafe): the TPU compiler has every device draw the whole
batch's bits, for a data-sharded [64, 128, 256] mask a u32[64, 128, 256] on each of 8 chips,
which took BERT-large phase 2 on v5e-256 from 7.99 to 12.43 GiB a chip. Threefry's bits are
partitioned: each device draws only its shard's. The figures behind the choice, from this CPU
and from the TPU compiler's programs: benchmarks/results/cpu-2c-x86-64/step_overhead.md and
compile_readiness.md.

rbg's masks are other bits than threefry's and are not promised to be the same across shardings
or XLA versions; their keep rate and independence are (tests/train/test_dropout_rng.py). The
state's key stays a threefry key whatever the generator, so a checkpoint resumes under any
setting, and a resumed run draws the masks it would have drawn.
"""

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from zoo.errors import ConfigError

CHOICES = ("auto", "threefry", "rbg", "unsafe_rbg")


def generator(name: str, platforms: Sequence[str], devices: int) -> str:
    """The generator config.train.dropout_rng=`name` means for a program run on `platforms`
    (none named: as on an accelerator) partitioned over `devices` devices.

    Raises:
      ConfigError: an unknown name.
    """
    if name not in CHOICES:
        raise ConfigError(f"config.train.dropout_rng={name!r}: choose one of {', '.join(CHOICES)}")
    if name != "auto":
        return name
    on_cpu = bool(platforms) and all(p == "cpu" for p in platforms)
    return "rbg" if devices == 1 and not on_cpu else "threefry"


def mesh_platforms(mesh) -> tuple[str, ...]:
    """The platforms of a concrete mesh's devices (an abstract mesh has none to ask)."""
    return tuple(sorted({d.platform for d in mesh.devices.flat}))


def step_key(base: jax.Array, step: jax.Array, name: str) -> jax.Array:
    """One step's key: `base` with the step folded in, as a key of generator `name` (whose 4
    words are drawn from the threefry key)."""
    key = jax.random.fold_in(base, step)
    if name == "threefry":
        return key
    return jax.random.wrap_key_data(jax.random.bits(key, (4,), jnp.uint32), impl=name)
