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


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices=None) -> jax.sharding.Mesh:
    """A (data, fsdp, tensor) mesh; one of the sizes may be -1 to take the remaining devices."""
    devices = jax.devices() if devices is None else devices
    sizes = [data, fsdp, tensor]
    n = len(devices)
    if sizes.count(-1) > 1:
        raise ValueError(f"mesh: at most one of data/fsdp/tensor may be -1, got {sizes}")
    if -1 in sizes:
        known = int(np.prod([s for s in sizes if s != -1]))
        if known <= 0 or n % known:
            raise ValueError(f"mesh: {n} devices cannot be split as data/fsdp/tensor = {sizes}")
        sizes[sizes.index(-1)] = n // known
    if int(np.prod(sizes)) != n:
        raise ValueError(
            f"mesh: data*fsdp*tensor = {sizes} uses {int(np.prod(sizes))} devices but {n} are "
            "present; set config.mesh.data/fsdp/tensor so their product is the device count "
            "(or use -1 for one of them)"
        )
    # Auto axis types: Linen's logical constraints rely on the sharding-in-types 'Auto' mode.
    return jax.make_mesh(
        tuple(sizes),
        MESH_AXES,
        axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES),
        devices=devices,
    )


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
        variables = jax.jit(init_fn, out_shardings=shardings)(*args)
    return nn.unbox(variables), nn.unbox(shardings)


def batch_sharding(mesh: jax.sharding.Mesh, rules: Sequence = DEFAULT_RULES):
    """Sharding of a batch's leading axis: over whatever mesh axes `act_batch` names."""
    spec = nn.logical_to_mesh_axes(("act_batch",), tuple(rules))
    return jax.sharding.NamedSharding(mesh, spec)
