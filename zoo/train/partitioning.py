"""One way to shard: a (data, fsdp, tensor) mesh and logical-axis rules that map names to it.

Modules only ever name *logical* axes (`embed`, `heads`, `act_batch`, ...). The rules below say
which mesh axis each name is split over, so a single CPU, 8 fake CPU devices and a TPU pod run
the same model code; only the mesh shape and (optionally) the rules in the config change.
"""

from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils

from zoo.errors import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")

# Parameter axes: `embed` is split by FSDP (ZeRO-3 style: each device holds a slice of every
# matrix and all-gathers it for the matmul); `mlp`, `heads`, `vocab` and the RNN hidden units are
# split by tensor parallelism (Megatron style). Activation axes: the batch is split over every
# data-like axis; heads/mlp activations follow their tensor-parallel weights.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("act_batch", ("data", "fsdp")),
    ("act_len", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv", None),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
    ("act_rnn_hidden", "tensor"),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("layers", None),
    ("norm", None),
    ("position", None),
    ("rnn_in", None),
    ("rnn_hidden", "tensor"),
)


def rules_from_config(rules, key: str = "config.mesh.rules") -> tuple[tuple[str, Any], ...]:
    """A rules table as written in a config (lists or tuples of [logical_axis, mesh_axes]) as
    the tuple of pairs flax takes; a malformed entry, or one naming a mesh axis other than
    data / fsdp / tensor, is a ConfigError naming `key` (jax would reject it only when building
    a sharding, as "Resource axis: model of P('tensor', 'model') is not found in mesh", naming
    neither the rule nor the config key)."""
    def bad(detail: str) -> ConfigError:
        return ConfigError(
            f"{key}: {detail}; each entry is [logical_axis, mesh_axes] where mesh_axes is None, "
            f"one of {', '.join(MESH_AXES)}, or a list of them (e.g. ['mlp', 'fsdp'] or "
            "['act_batch', ['data', 'fsdp']])")

    if isinstance(rules, str) or not isinstance(rules, Sequence):
        raise bad(f"must be a list of rules, got {type(rules).__name__} {rules!r}")
    table = []
    for i, entry in enumerate(rules):
        if isinstance(entry, str) or not isinstance(entry, Sequence) or len(entry) != 2:
            raise bad(f"entry {i} is {entry!r}, not a [logical_axis, mesh_axes] pair")
        name, axes = entry
        if not isinstance(name, str) or not name:
            raise bad(f"entry {i} {list(entry)!r} names the logical axis {name!r}, not a string")
        names = () if axes is None else (axes,) if isinstance(axes, str) else axes
        if not isinstance(names, Sequence) or not all(isinstance(a, str) for a in names):
            raise bad(f"entry {i} {list(entry)!r} maps {name!r} to {axes!r}, not mesh axis "
                      "names")
        unknown = [a for a in names if a not in MESH_AXES]
        if unknown:
            raise bad(f"entry {i} {list(entry)!r} maps {name!r} to the mesh axis "
                      f"{unknown[0]!r}, which the mesh does not have")
        if len(set(names)) != len(names):
            raise bad(f"entry {i} {list(entry)!r} names a mesh axis twice")
        # flax wants None, one name, or a tuple (a config may hold a list)
        table.append((name, axes if axes is None or isinstance(axes, str) else tuple(axes)))
    return tuple(table)


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices=None) -> jax.sharding.Mesh:
    """A (data, fsdp, tensor) mesh; one of the sizes may be -1 to take the remaining devices.

    Devices of several slices (TPU Multislice: each device's `slice_index`) make a hybrid mesh:
    the data axis spans the slices (data parallelism across slices, the only traffic the slow
    data-center network then carries is the gradient reduction) and within each slice the mesh
    is laid on its torus as for one slice; see device_grid.
    """
    devices = jax.devices() if devices is None else devices
    sizes = [data, fsdp, tensor]
    n = len(devices)
    if sizes.count(-1) > 1:
        raise ConfigError(f"mesh: at most one of data/fsdp/tensor may be -1, got {sizes}")
    if -1 in sizes:
        known = int(np.prod([s for s in sizes if s != -1]))
        if known <= 0 or n % known:
            raise ConfigError(f"mesh: {n} devices cannot be split as data/fsdp/tensor = {sizes}; "
                              "set config.mesh.data/fsdp/tensor to sizes whose product is the "
                              f"device count ({n}), one of them -1 for the rest")
        sizes[sizes.index(-1)] = n // known
    if int(np.prod(sizes)) != n:
        raise ConfigError(
            f"mesh: data*fsdp*tensor = {sizes} uses {int(np.prod(sizes))} devices but {n} are "
            "present; set config.mesh.data/fsdp/tensor so their product is the device count "
            "(or use -1 for one of them)"
        )
    # Auto axis types: Linen's logical constraints rely on the sharding-in-types 'Auto' mode.
    axis_types = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    if num_slices(devices) > 1:
        return jax.sharding.Mesh(device_grid(sizes, devices), MESH_AXES, axis_types=axis_types)
    try:
        return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=axis_types, devices=devices)
    except NotImplementedError:
        # On a TPU torus jax.make_mesh gives each mesh axis whole physical axes and refuses a
        # shape that needs one split (data=2, fsdp=2, tensor=4 on v4-32's 2x2x4 chips: it
        # assigns axes in order and is left with 4 for a 2). Splitting a physical axis is
        # allowed, only its rings are shorter.
        grid = mesh_utils.create_device_mesh(tuple(sizes), devices,
                                             allow_split_physical_axes=True)
        return jax.sharding.Mesh(grid, MESH_AXES, axis_types=axis_types)


def num_slices(devices) -> int:
    """How many slices `devices` come from (TPU Multislice devices carry `slice_index`; any
    other device is one slice)."""
    return len({getattr(d, "slice_index", 0) for d in devices})


def device_grid(sizes, devices) -> np.ndarray:
    """The (data, fsdp, tensor) array of `devices` for a mesh over several slices.

    The data axis is split into slices x data-within-a-slice (the DCN part outermost, so the
    devices of one slice are contiguous along it); fsdp and tensor stay inside a slice, where
    ICI carries their every-layer traffic (an FSDP or tensor axis across slices would send
    activations or weights over the DCN in every layer: a few GB/s per chip against ICI's hundreds,
    zoo.train.compilation.chips). jax's create_hybrid_device_mesh lays each slice's part on its
    torus.

    Raises:
      ConfigError: config.mesh.data is not a multiple of the number of slices.
    """
    slices = num_slices(devices)
    data, fsdp, tensor = sizes
    if data % slices:
        per_slice = len(devices) // slices
        raise ConfigError(
            f"mesh: data={data}, fsdp={fsdp}, tensor={tensor} over {slices} slices: the data "
            f"axis spans the slices (data parallel across them), so it must be a multiple of "
            f"{slices}, and fsdp and tensor stay within a slice (not offered across slices); "
            f"set config.mesh.data=-1 (or a multiple of {slices}) with config.mesh.fsdp x "
            f"config.mesh.tensor dividing the {per_slice} devices of one slice")
    ici, dcn = (data // slices, fsdp, tensor), (slices, 1, 1)
    try:
        return mesh_utils.create_hybrid_device_mesh(ici, dcn, devices)
    except NotImplementedError:
        # as in make_mesh: a shape that splits a physical torus axis of the slice
        return mesh_utils.create_hybrid_device_mesh(ici, dcn, devices,
                                                    allow_split_physical_axes=True)


def logical_sharding(tree, mesh: jax.sharding.Mesh, rules: Sequence = DEFAULT_RULES):
    """NamedShardings for a pytree of (possibly abstract) values boxed in nn.LogicallyPartitioned."""
    specs = nn.get_partition_spec(tree)
    return nn.logical_to_mesh_sharding(specs, mesh, tuple(rules))


def sharded_init(
    init_fn: Callable, mesh: jax.sharding.Mesh, rules: Sequence, *args
) -> tuple[Any, Any]:
    """Runs `init_fn(*args)` so every leaf is created directly on its shard.

    eval_shape gives the boxed abstract tree, the rules turn its logical names into shardings,
    and jit with out_shardings materialises each parameter only where it lives — a model too big
    for one device never exists whole anywhere.

    Returns (variables with boxes removed, their shardings).
    """
    rules = tuple(rules)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        abstract = jax.eval_shape(init_fn, *args)
        shardings = logical_sharding(abstract, mesh, rules)
    # Unboxed outside the mesh: inside it, unboxing applies each box's sharding constraint.
    check_divisible(nn.unbox(abstract), nn.unbox(shardings), mesh)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        variables = jax.jit(init_fn, out_shardings=shardings)(*args)
    return nn.unbox(variables), nn.unbox(shardings)


def _ways(mesh: jax.sharding.Mesh, axes) -> tuple[tuple[str, ...], int]:
    """The mesh axes one entry of a PartitionSpec names, and how many shards they make."""
    names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    return names, int(np.prod([mesh.shape[a] for a in names]))


def check_divisible(abstract, shardings, mesh: jax.sharding.Mesh) -> None:
    """ConfigError naming the first array whose dimension the mesh cannot split evenly (jax
    would report it from deep inside jit, without saying which parameter or config key)."""
    for (path, leaf), sharding in zip(jax.tree_util.tree_leaves_with_path(abstract),
                                      jax.tree.leaves(shardings)):
        for dim, (size, axes) in enumerate(zip(leaf.shape, sharding.spec)):
            names, ways = _ways(mesh, axes)
            if size % ways:
                keys = " x ".join(f"config.mesh.{a}={mesh.shape[a]}" for a in names)
                raise ConfigError(
                    f"mesh: {jax.tree_util.keystr(path)} of shape {tuple(leaf.shape)} cannot be "
                    f"split {ways} ways ({keys}): its dimension {dim} has {size} entries. Choose "
                    "mesh sizes that divide the model's widths (tensor splits heads, MLP width "
                    "and vocabulary; fsdp the embedding width), or map that logical axis to None "
                    "in config.mesh.rules")


def check_batch(rows: int, sharding: jax.sharding.NamedSharding) -> None:
    """ConfigError unless a global batch of `rows` rows splits evenly over `sharding`."""
    names, ways = _ways(sharding.mesh, sharding.spec[0] if sharding.spec else None)
    if rows % ways:
        keys = " x ".join(f"config.mesh.{a}={sharding.mesh.shape[a]}" for a in names)
        raise ConfigError(
            f"mesh: a batch of {rows} rows cannot be split over the {ways} devices that share "
            f"each batch ({keys}); make config.data.batch_size (and eval_batch_size) a multiple "
            f"of {ways}, or change config.mesh")


def batch_sharding(mesh: jax.sharding.Mesh, rules: Sequence = DEFAULT_RULES):
    """Sharding of a batch's leading axis: over whatever mesh axes `act_batch` names."""
    spec = nn.logical_to_mesh_axes(("act_batch",), tuple(rules))
    return jax.sharding.NamedSharding(mesh, spec)
