"""The one training loop every task uses: sharded init, jitted steps, eval, checkpoints, logs.

The loop is handed its task by the command layer (zoo.commands.jobs looks config.task up in
the task registry): the tasks import this package, so nothing here imports them.
"""

import contextlib
import dataclasses
import json
import signal
import sys
from collections.abc import Callable, Sized
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import optax
from jax.experimental import multihost_utils

from zoo import contract, paths
from zoo.checkpoints.checkpoint import Checkpointer
from zoo.errors import ConfigError, UserError
from zoo.train import (dropout_rng, goodput, init_from, layer_scan, optim, partitioning, program,
                       recipe, step)
from zoo.train import metrics as metrics_lib
from zoo.train.compilation import compile_cache, dry_run, flops
from zoo.train.hosts import watchdog as watchdog_lib
from zoo.train.state import TrainState

NONFINITE_POLICIES = ("skip", "stop")

# Builds the job's task from (config, workdir): a Task subclass (the core in tasks/base.py, the
# opt-in parts in zoo.contract) as the task registry returns it, or any callable returning
# such a task.
TaskFactory = Callable[[ml_collections.ConfigDict, str], Any]


class LossSpikeError(UserError, FloatingPointError):
    """The loss-spike guard skipped config.train.loss_spike.max_in_a_row steps in a row (the
    message gives the intact checkpoint and the config keys to change)."""


class NonFiniteLossError(UserError, FloatingPointError):
    """A NaN/Inf loss or gradient under config.train.nonfinite='stop' (the message gives the
    intact checkpoint and what to change)."""


def _rules(config: ml_collections.ConfigDict) -> tuple:
    return partitioning.rules_from_config(config.mesh.rules)


def _to_global(batch, sharding):
    # Each process holds only its rows; this assembles the global array without a copy of the
    # other processes' data (single-process: just a device_put with the batch sharding).
    try:
        return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)
    except ValueError:  # jax's IndivisibleError names neither the batch size nor the mesh keys
        for x in jax.tree.leaves(batch):
            partitioning.check_batch(x.shape[0] * jax.process_count(), sharding)
        raise


def evaluate_split(task, eval_step, params, batch_sharding, predict_step=None
                   ) -> contract.Scored:
    """One pass over the eval split: its metrics (the task's summary of the eval loss and, for a
    Predicting task given its `predict_step`, the scored predictions) and the files the scoring
    made, not yet written: the caller writes them where it decides (contract.write_outputs)."""
    history, outputs = [], []
    batches = task.eval_batches(jax.process_index(), jax.process_count())
    progress = metrics_lib.EvalProgress(len(batches) if isinstance(batches, Sized) else None)
    for batch in batches:
        batch = _to_global(batch, batch_sharding)
        history.append(eval_step(params, batch))
        if predict_step is not None:
            # Every process gets the whole batch's outputs (post-processing is host-side).
            outputs.append(multihost_utils.process_allgather(predict_step(params, batch),
                                                             tiled=True))
        progress.update()
    summary = task.summarize(metrics_lib.sum_metrics(history))
    if not outputs:
        return contract.Scored(summary)
    scored = task.score_predictions(
        {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]})
    if not isinstance(scored, contract.Scored):  # metrics alone: a task with no files
        scored = contract.Scored(dict(scored))
    return contract.Scored({**summary, **scored.metrics}, scored.files)


def evaluate(task, eval_step, params, batch_sharding, predict_step=None) -> dict[str, float]:
    """evaluate_split's metrics alone (nothing is written)."""
    return evaluate_split(task, eval_step, params, batch_sharding, predict_step).metrics


def evaluate_and_write(task, eval_step, params, batch_sharding, predict_step,
                       workdir: str) -> dict[str, float]:
    """evaluate_split, then its files written in their own step to <workdir>/predictions;
    returns the metrics."""
    scored = evaluate_split(task, eval_step, params, batch_sharding, predict_step)
    contract.write_outputs(scored.files, contract.predictions_directory(workdir))
    return scored.metrics


@dataclasses.dataclass
class Setup:
    """What both training and evaluation build from a config: task, mesh and sharded state."""

    task: Any  # a Task (tasks/base.py), made by the TaskFactory build() was given
    mesh: jax.sharding.Mesh
    rules: tuple
    optimizer: optax.GradientTransformation
    state: TrainState
    state_sharding: TrainState
    batch_sharding: jax.sharding.NamedSharding


def build(config: ml_collections.ConfigDict, workdir: str, task_factory: TaskFactory,
          devices=None) -> Setup:
    """Task (task_factory(config, workdir)), mesh (over `devices`, default all) and a freshly
    initialised state, each parameter created on its own shard (a fine-tuning config's recipe
    settled first: recipe.resolve)."""
    config = recipe.resolve(config)
    paths.check_remote(workdir, "--workdir")
    directory = paths.as_path(workdir)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"--workdir={workdir} is a file, not a directory; give a directory (a "
                          "new one starts a run, the workdir of a run resumes it)")
    try:
        directory.mkdir(parents=True, exist_ok=True)  # nothing to make in a bucket
    except OSError as e:  # e.g. read-only, or no permission on a parent
        raise ConfigError(f"--workdir={workdir} cannot be created ({e}); give a directory this "
                          "user can write") from e
    # Before the first compile (the sharded init below): a restart loads its programs from disk.
    compile_cache.enable(config.train, workdir)
    # The mesh first: a mesh (or rules table) that does not fit is refused before any data work.
    mesh = partitioning.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor,
                                  devices=devices)
    rules = _rules(config)
    config = layer_scan.resolve(config, dropout_rng.mesh_platforms(mesh))
    task = task_factory(config, workdir)
    optimizer = program.make_optimizer(task, config)
    state, state_sharding = partitioning.sharded_init(
        program.init_state_fn(task, optimizer), mesh, rules, jax.random.key(config.train.seed)
    )
    return Setup(task, mesh, rules, optimizer, state, state_sharding,
                 partitioning.batch_sharding(mesh, rules))


def make_train_step(setup: Setup, config: ml_collections.ConfigDict):
    return program.jit_train_step(setup.task, setup.optimizer, config, setup.state_sharding,
                                  setup.batch_sharding, dropout_rng.mesh_platforms(setup.mesh))


def make_eval_step(setup: Setup):
    return jax.jit(
        step.make_eval_step(setup.task.loss_fn),
        in_shardings=(setup.state_sharding.params, setup.batch_sharding),
    )


def make_predict_step(setup: Setup):
    """The jitted predict step of a Predicting task (zoo.contract); None for any other."""
    if not isinstance(setup.task, contract.Predicting):
        return None
    return jax.jit(setup.task.predict,
                   in_shardings=(setup.state_sharding.params, setup.batch_sharding))


class _Preemption:
    """SIGTERM (a TPU/GPU scheduler's preemption notice) asks the loop to finish the current
    step, checkpoint and return; a second SIGTERM is left to the default handler.

    With several processes the notice reaches one host, or each at a different step, yet all
    must save the same step together: JAX's preemption sync manager (started by
    jax.distributed.initialize, which catches SIGTERM itself) propagates the notice and agrees
    on the step, so no Python handler is installed then."""

    def __init__(self):
        self._requested = False
        self._previous = None
        self._multihost = jax.process_count() > 1

    def __enter__(self):
        if self._multihost:
            return self
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread: no handler, the run is simply not preemptible
            self._previous = None
        return self

    def _handle(self, signum, frame):
        self._requested = True
        signal.signal(signal.SIGTERM, self._previous or signal.SIG_DFL)

    def reached(self, step: int) -> bool:
        """Whether to save and stop after `step` (called once per step, on every process)."""
        if self._multihost:
            return multihost_utils.reached_preemption_sync_point(step)
        return self._requested

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def _profile_window(spec: str) -> tuple[int, int] | None:
    if not spec:
        return None
    try:
        start, stop = (int(x) for x in spec.split(":"))
    except ValueError:
        raise ConfigError(
            f"config.train.profile_steps={spec!r} must be 'START:STOP' (e.g. '10:15')"
        ) from None
    if not 0 <= start < stop:
        raise ConfigError(f"config.train.profile_steps={spec!r} needs 0 <= START < STOP")
    return start, stop


def run(config: ml_collections.ConfigDict, workdir: str, task_factory: TaskFactory,
        devices=None, load_pretrained: init_from.PretrainedLoader | None = None
        ) -> dict[str, float]:
    """Trains the task task_factory(config, workdir) makes for config.train.steps, resuming from
    the latest checkpoint in `workdir` if there is one. Returns the last eval summary.
    `load_pretrained` reads a pretrained directory config.train.init_from names
    (zoo.train.init_from)."""
    config = recipe.resolve(config)
    train_cfg = config.train
    if train_cfg.nonfinite not in NONFINITE_POLICIES:
        raise ConfigError(f"config.train.nonfinite must be one of {NONFINITE_POLICIES}, "
                          f"got {train_cfg.nonfinite!r}")
    profile = _profile_window(train_cfg.profile_steps)
    watchdog_lib.validate(train_cfg.get("watchdog"))  # before any compile: a typo fails at once
    if train_cfg.dry_run:
        return dry_run.report(config, workdir, task_factory, devices)
    account = goodput.Goodput(workdir)
    # The hang watchdog watches from here: the phases before the loop by limit_s alone; then
    # each step as the wait for the step before it to finish (the host stays one step ahead of
    # the device, as the late reads below), each eval and each save.
    watchdog = watchdog_lib.Watchdog(train_cfg.get("watchdog"))
    with watchdog.closed_on_error():
        with watchdog.phase("setup"):  # the model's init, the data and the checkpoints opened
            setup = build(config, workdir, task_factory, devices)
            task, batch_sharding = setup.task, setup.batch_sharding
            train_step, eval_step = make_train_step(setup, config), make_eval_step(setup)
            predict_step = make_predict_step(setup)
            schedule = optim.make_schedule(config.optim)

            batches = task.train_batches(jax.process_index(), jax.process_count())
            checkpointer = Checkpointer(workdir, max_to_keep=train_cfg.keep_checkpoints)
            # Beside the last N: the single checkpoint with the best eval metric so far.
            best = (Checkpointer(workdir, max_to_keep=1, subdir="checkpoints_best",
                                 best_metric=train_cfg.best_metric, best_mode=train_cfg.best_mode)
                    if train_cfg.best_metric else None)
        state = setup.state
        agreed = checkpointer.agreed_steps()
        if agreed:  # every process restores, or none
            with watchdog.phase("restore"), account.timed("restore"):
                state = checkpointer.restore(state, batches, quarantine=True, agreed=agreed)
            account.resumed(int(state.step))
        elif train_cfg.init_from:
            with watchdog.phase("init_from"), account.timed("restore"):
                state = init_from.init_params(train_cfg.init_from, state,
                                              contract.pretrained_subtree(task), load_pretrained)
        with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
            contract.prepare(task, state.params)
        start, total = int(state.step), train_cfg.steps
        writer = metrics_lib.MetricsWriter(workdir, tensorboard=train_cfg.tensorboard)
        peak = metrics_lib.peak_flops(setup.mesh.devices.flat, train_cfg.peak_flops)
        progress = metrics_lib.Progress(
            total, start_step=start, flops_per_token=contract.flops_per_token(task),
            peak_flops=peak,
            executed_flops_per_token=_executed_flops_per_token(setup, train_step) if peak else 0.0,
        )
        with watchdog.phase("baselines"):
            # Only process 0 prints them and writes summary.json: the others do not read the
            # whole validation split for them (mlm_nsp's baselines read every row).
            baselines = contract.baselines(task) if jax.process_index() == 0 else {}
        if jax.process_index() == 0:
            num_params = sum(x.size for x in jax.tree.leaves(state.params))
            print(f"{config.task}: {num_params:,} parameters on mesh {dict(setup.mesh.shape)}, "
                  f"starting at step {start} of {total}", flush=True)
            for name, value in baselines.items():
                print(f"baseline {name}: {value:.4g}", flush=True)

    history, summary, saved = [], {}, start
    # Whether a step's metrics can stop the run (and so must be read): see _stop_if_told.
    stops = train_cfg.nonfinite == "stop" or bool(train_cfg.loss_spike.factor)
    unread = []
    previous_metrics = None
    account.loop_started()
    try:
        with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules), \
                _Preemption() as preemption:
            for done in range(start + 1, total + 1):
                if profile and done == profile[0] + 1:
                    jax.profiler.start_trace(paths.join(workdir, "profile"))
                with watchdog.phase("step", done):
                    with account.timed("data_wait"):
                        batch = _to_global(next(batches), batch_sharding)
                    with account.timed("compile") if done == start + 1 else _NOTHING:
                        state, step_metrics = train_step(state, batch)
                    if watchdog.active:
                        jax.block_until_ready(previous_metrics)
                previous_metrics = step_metrics
                history.append(step_metrics)
                if profile and done == profile[1]:
                    jax.block_until_ready(state)
                    jax.profiler.stop_trace()
                preempted = preemption.reached(done)
                # The stop flags are read one step late: the step before has finished by now,
                # so the host does not wait for the step it just dispatched and stays a step
                # ahead of the device (as MaxText reads its loss). Before anything that writes
                # (a log, an eval, a checkpoint) the current step's flags are read too.
                for late in unread:
                    _stop_if_told(*late, train_cfg, checkpointer, state.loss_stats.mean)
                unread = [(done, step_metrics)] if stops else []
                if unread and (done % train_cfg.log_every == 0 or done == total
                               or done % train_cfg.eval_every == 0
                               or done % train_cfg.checkpoint_every == 0
                               or preempted):
                    _stop_if_told(*unread.pop(), train_cfg, checkpointer,
                                  state.loss_stats.mean)
                if done % train_cfg.log_every == 0 or done == total:
                    report = _train_report(task, history, schedule, done)
                    report.update(progress.update(done, report, tokens=report.pop("tokens")))
                    writer.write(done, "train", report)
                    account.write(done)
                    history = []
                if done % train_cfg.eval_every == 0 or done == total:
                    with watchdog.phase("eval", done), account.timed("eval"):
                        summary = evaluate_and_write(task, eval_step, state.params,
                                                     batch_sharding, predict_step, workdir)
                    writer.write(done, "eval", summary)
                    _print_eval(done, summary)
                    _maybe_save_best(best, done, state, summary)
                if done % train_cfg.checkpoint_every == 0 or done == total or preempted:
                    with watchdog.phase("save", done), account.timed("checkpoint"):
                        checkpointer.save(done, state, batches)
                    account.checkpointed(done)
                    saved = done
                if preempted:
                    if jax.process_index() == 0:
                        print(f"SIGTERM: saved step {done} to {checkpointer.directory}; "
                              "exiting (rerun the same command to resume)", flush=True)
                    return summary
            with account.timed("eval"):
                if start >= total:  # resumed a finished run: report its final eval again
                    summary = evaluate_and_write(task, eval_step, state.params, batch_sharding,
                                                 predict_step, workdir)
                print_samples(task, state.params)
    finally:
        # Waits for async saves: a checkpoint the log announced is on disk before we return.
        try:
            with watchdog.phase("final save", saved), account.timed("checkpoint"):
                checkpointer.close()  # the final save's phase: judged by limit_s alone
        finally:
            watchdog.close()
        if best is not None:
            best.close()
        report = None
        try:
            if saved == total and sys.exc_info()[0] is None:
                report = _goodput_report(account, writer, total)
        finally:
            writer.close()
    if jax.process_index() == 0 and saved == total:
        # The eval's entries are equal bit for bit across a resume; "goodput" is the whole run's
        # wall-time account (every restart's), which a resume changes by design.
        paths.write_atomic(paths.join(workdir, "summary.json"), json.dumps(
            {"step": total, **summary, **baselines, "goodput": report}, indent=2))
    return summary


_NOTHING = contextlib.nullcontext()


def _goodput_report(account: goodput.Goodput, writer, step: int) -> dict:
    """The whole run's account: goodput.json, TensorBoard's goodput/*, one line (process 0);
    returned for summary.json's "goodput" entry."""
    report = account.account()
    account.write(step, report)  # the very account summary.json gets
    writer.scalars(step, "goodput", {"goodput": report["goodput"],
                                     **{f"{b}_s": s for b, s in report["lost_s"].items()}})
    if jax.process_index() == 0:
        print(goodput.Goodput.line(report), flush=True)
    return report


def _executed_flops_per_token(setup: Setup, train_step) -> float:
    """The matmul FLOPs one step runs per token (HFU's numerator), from its jaxpr: one trace,
    done only where a peak is known (an accelerator, or config.train.peak_flops)."""
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
        executed = flops.executed_flops(train_step, setup.state, setup.task.init_batch())
    return executed / setup.task.tokens_per_batch()


def _stop_if_told(done: int, step_metrics, train_cfg, checkpointer: Checkpointer,
                  running_mean) -> None:
    """Raises when step `done`'s metrics say the run must stop: a NaN/Inf under
    config.train.nonfinite='stop', or max_in_a_row loss spikes in a row."""
    if train_cfg.nonfinite == "stop" and float(step_metrics["nonfinite"]):
        raise NonFiniteLossError(
            f"step {done}: the loss or gradients are NaN/Inf, so training stopped "
            f"(config.train.nonfinite='stop'); the update was not applied and the "
            f"last checkpoint, step {checkpointer.latest_step()}, is intact in "
            f"{checkpointer.directory}. Lower config.optim.learning_rate, check the "
            "data, or set config.train.nonfinite='skip' to skip such batches."
        )
    spikes_stop = train_cfg.loss_spike.max_in_a_row if train_cfg.loss_spike.factor else 0
    if spikes_stop and float(step_metrics["spikes_in_a_row"]) >= spikes_stop:
        raise LossSpikeError(
            f"step {done}: the loss exceeded {train_cfg.loss_spike.factor} x its "
            f"running mean {float(running_mean):.4g} for {spikes_stop} steps "
            "in a row (their updates were skipped), so training stopped: the loss "
            "has moved, not spiked (divergence, or data unlike the earlier batches)."
            f" The last checkpoint, step {checkpointer.latest_step()}, is intact in "
            f"{checkpointer.directory}. Lower config.optim.learning_rate and resume, "
            "or raise config.train.loss_spike.factor / max_in_a_row."
        )


def print_samples(task, params) -> None:
    texts = contract.samples(task, params)
    if texts and jax.process_index() == 0:
        print("samples:", flush=True)
        for text in texts:
            print(f"  {text}", flush=True)


def _train_report(task, history, schedule, done) -> dict[str, float]:
    sums = metrics_lib.sum_metrics(history)
    # Mean over the steps with a finite gradient (spikes included: their norm is real).
    finite_steps = max(len(history) - sums["nonfinite"], 1.0)
    grad_norm = sums.pop("grad_norm") / finite_steps
    skipped, spikes = sums.pop("nonfinite"), sums.pop("loss_spike")
    sums.pop("spikes_in_a_row")
    report = task.summarize(sums)
    # Throughput counts every input token a step processed (the unit of flops_per_token).
    report.update(grad_norm=grad_norm, lr=float(schedule(done)), skipped_steps=skipped,
                  spike_skips=spikes, tokens=task.tokens_per_batch() * len(history))
    return report


def _print_eval(done, summary):
    if jax.process_index() == 0:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in summary.items())
        print(f"eval at step {done}: {shown}", flush=True)


def _maybe_save_best(best: Checkpointer | None, done, state, summary) -> None:
    if best is None:
        return
    if best.best_metric not in summary:
        raise ConfigError(f"config.train.best_metric={best.best_metric!r} is not an eval metric of "
                       f"this task; choose one of {sorted(summary)}")
    if best.is_better(float(summary[best.best_metric])):
        best.save(done, state, metrics=summary)
