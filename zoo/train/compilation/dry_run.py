"""A dry run: the mesh, per-device memory and FLOPs of a job, from shapes alone.

Nothing is compiled or allocated: the state is traced with jax.eval_shape, each leaf's bytes
are divided by the number of devices its logical sharding splits it over, and activations and
FLOPs come from the model family's analytic counts (each zoo/models/<family>.py has
flops_per_token and activation_bytes; the task passes them its data shapes).
"""

import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from zoo import contract
from zoo.train import partitioning, program


def _bytes_per_device(abstract_tree, shardings, mesh) -> float:
    total = 0.0
    for leaf, sharding in zip(jax.tree.leaves(abstract_tree), jax.tree.leaves(shardings)):
        split = 1
        for axes in sharding.spec:
            for axis in (axes if isinstance(axes, tuple) else (axes,)):
                if axis is not None:
                    split *= mesh.shape[axis]
        total += leaf.size * np.dtype(leaf.dtype).itemsize / split
    return total


def report(config: ml_collections.ConfigDict, workdir: str,
           task_factory: Callable[[ml_collections.ConfigDict, str], Any],
           devices=None) -> dict[str, float]:
    """Prints and returns the dry-run figures for `config` on `devices` (default: all), for the
    task task_factory(config, workdir) makes (loop.TaskFactory: the command layer's lookup)."""
    task = task_factory(config, workdir)
    mesh = partitioning.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor,
                                  devices=devices)
    rules = partitioning.rules_from_config(config.mesh.rules)
    init_state = program.init_state_fn(task, program.make_optimizer(task, config))
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        # The key is made inside the trace: even jax.random.key(0) would compile eagerly.
        boxed = jax.eval_shape(lambda: init_state(jax.random.key(0)))
        shardings = nn.unbox(partitioning.logical_sharding(boxed, mesh, rules))
    state = nn.unbox(boxed)
    data_parallel = mesh.shape["data"] * mesh.shape["fsdp"]
    per_device_batch = math.ceil(
        config.data.batch_size / data_parallel / config.train.grad_accum_steps)
    figures = {
        "devices": float(mesh.size),
        "params": float(sum(x.size for x in jax.tree.leaves(state.params))),
        "param_bytes_per_device": _bytes_per_device(state.params, shardings.params, mesh),
        "optimizer_bytes_per_device": _bytes_per_device(state.opt_state, shardings.opt_state,
                                                        mesh),
        "activation_bytes_per_device": contract.activation_bytes(task, per_device_batch,
                                                                 mesh.shape["tensor"]),
        "flops_per_step": contract.flops_per_token(task) * task.tokens_per_batch(),
    }
    # During the update the gradients and the optimizer's update (each param-sized) are live
    # beside the params.
    figures["total_bytes_per_device"] = (3 * figures["param_bytes_per_device"]
                                         + figures["optimizer_bytes_per_device"]
                                         + figures["activation_bytes_per_device"])
    if jax.process_index() == 0:
        gib = 2.0**30
        print(f"dry run: {config.task} on mesh {dict(mesh.shape)} ({mesh.size} devices)")
        print(f"  parameters          {figures['params']:,.0f}")
        print(f"  per device: params  {figures['param_bytes_per_device'] / gib:.3f} GiB, "
              f"grads {figures['param_bytes_per_device'] / gib:.3f} GiB, update "
              f"{figures['param_bytes_per_device'] / gib:.3f} GiB, optimizer "
              f"{figures['optimizer_bytes_per_device'] / gib:.3f} GiB, activations "
              f"{figures['activation_bytes_per_device'] / gib:.3f} GiB "
              f"(micro-batch {per_device_batch} rows)")
        print(f"  total per device    {figures['total_bytes_per_device'] / gib:.3f} GiB")
        print(f"  FLOPs per step      {figures['flops_per_step']:.3e}", flush=True)
    return figures
