"""The one training loop every task uses: sharded init, jitted steps, eval, logging."""

import dataclasses
import json
import os

import flax.linen as nn
import jax
import ml_collections
import optax

from zoo import tasks
from zoo.train import metrics as metrics_lib
from zoo.train import optim, partitioning, step
from zoo.train.checkpoint import Checkpointer
from zoo.train.state import TrainState


def _rules(config: ml_collections.ConfigDict) -> tuple:
    return tuple((name, tuple(axes) if isinstance(axes, list) else axes)
                 for name, axes in config.mesh.rules)


def _to_global(batch, sharding):
    # Each process holds only its rows; this assembles the global array without a copy of the
    # other processes' data (single-process: just a device_put with the batch sharding).
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)


def evaluate(task, eval_step, params, batch_sharding) -> dict[str, float]:
    history = [
        eval_step(params, _to_global(b, batch_sharding))
        for b in task.eval_batches(jax.process_index(), jax.process_count())
    ]
    return task.summarize(metrics_lib.sum_metrics(history))


@dataclasses.dataclass
class Setup:
    """What both training and evaluation build from a config: task, mesh and sharded state."""

    task: tasks.Task
    mesh: jax.sharding.Mesh
    rules: tuple
    optimizer: optax.GradientTransformation
    state: TrainState
    state_sharding: TrainState
    batch_sharding: jax.sharding.NamedSharding


def build(config: ml_collections.ConfigDict, workdir: str) -> Setup:
    """Task, mesh and a freshly initialised state, each parameter created on its own shard."""
    os.makedirs(workdir, exist_ok=True)
    task = tasks.get(config.task)(config, workdir)
    mesh = partitioning.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
    rules = _rules(config)
    optimizer = optim.make_optimizer(config.optim)

    def init_state(rng):
        params_rng, state_rng = jax.random.split(rng)
        return TrainState.create(task.init_params(params_rng), optimizer, state_rng)

    state, state_sharding = partitioning.sharded_init(
        init_state, mesh, rules, jax.random.key(config.train.seed)
    )
    return Setup(task, mesh, rules, optimizer, state, state_sharding,
                 partitioning.batch_sharding(mesh, rules))


def make_eval_step(setup: Setup):
    return jax.jit(
        step.make_eval_step(setup.task.loss_fn),
        in_shardings=(setup.state_sharding.params, setup.batch_sharding),
    )


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
    """Trains `config.task` for config.train.steps (resuming from the latest checkpoint in
    `workdir` if there is one); returns the final eval summary."""
    setup = build(config, workdir)
    task, mesh, rules = setup.task, setup.mesh, setup.rules
    state, state_sharding, batch_sharding = setup.state, setup.state_sharding, setup.batch_sharding
    schedule = optim.make_schedule(config.optim)
    num_params = sum(x.size for x in jax.tree.leaves(state.params))
    train_step = jax.jit(
        step.make_train_step(task.loss_fn, setup.optimizer),
        in_shardings=(state_sharding, batch_sharding),
        out_shardings=(state_sharding, None),
        donate_argnums=0,  # the old state's buffers are reused for the new one
    )
    eval_step = make_eval_step(setup)

    batches = task.train_batches(jax.process_index(), jax.process_count())
    checkpointer = Checkpointer(workdir, max_to_keep=config.train.keep_checkpoints)
    if checkpointer.latest_step() is not None:
        state = checkpointer.restore(state, batches)
    writer = metrics_lib.MetricsWriter(workdir, tensorboard=config.train.tensorboard)
    total = config.train.steps
    progress = metrics_lib.Progress(total, start_step=int(state.step))
    baselines = task.baselines()
    if jax.process_index() == 0:
        print(f"{config.task}: {num_params:,} parameters on mesh {dict(mesh.shape)}, "
              f"starting at step {int(state.step)}", flush=True)
        for name, value in baselines.items():
            print(f"baseline {name}: {value:.4g}", flush=True)

    history = []
    summary = {}
    start = int(state.step)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        for i in range(start, total):
            state, step_metrics = train_step(state, _to_global(next(batches), batch_sharding))
            history.append(step_metrics)
            done = i + 1
            if done % config.train.log_every == 0 or done == total:
                sums = metrics_lib.sum_metrics(history)
                grad_norm = sums.pop("grad_norm") / len(history)
                report = task.summarize(sums)
                report.update(grad_norm=grad_norm, lr=float(schedule(done)))
                report.update(progress.update(done, report, tokens=sums["weight_sum"]))
                writer.write(done, "train", report)
                history = []
            if done % config.train.eval_every == 0 or done == total:
                summary = evaluate(task, eval_step, state.params, batch_sharding)
                writer.write(done, "eval", summary)
                if jax.process_index() == 0:
                    shown = ", ".join(f"{k} {v:.4g}" for k, v in summary.items())
                    print(f"eval at step {done}: {shown}", flush=True)
            if done % config.train.checkpoint_every == 0 or done == total:
                checkpointer.save(done, state, batches)
        if start >= total:  # resumed a finished run: report its final eval again
            summary = evaluate(task, eval_step, state.params, batch_sharding)
    checkpointer.close()
    writer.close()
    if jax.process_index() == 0:
        with open(os.path.join(workdir, "summary.json"), "w") as f:
            json.dump({"step": total, **summary, **baselines}, f, indent=2)
    return summary
