"""Evaluation of a trained workdir: restore the latest checkpoint, run the task's eval split."""

import json

import flax.linen as nn
import jax
import ml_collections

from zoo import contract, paths
from zoo.checkpoints import checkpoint
from zoo.errors import ConfigError, MissingFileError
from zoo.train import loop


def run(config: ml_collections.ConfigDict, workdir: str, task_factory: loop.TaskFactory,
        devices=None) -> dict[str, float]:
    """Evaluates the latest checkpoint in `workdir` of the task task_factory(config, workdir)
    makes, on a mesh over `devices` (default all); writes <workdir>/eval.json and the
    evaluation's files (<workdir>/predictions/...)."""
    paths.check_remote(workdir, "--workdir")
    directory = paths.as_path(workdir)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"--workdir={workdir} is a file, not a directory; give the workdir of "
                          "a trained run")
    checkpointer = checkpoint.existing(workdir)  # an empty or mistyped workdir stays untouched
    if checkpointer is None:
        raise MissingFileError(
            f"no checkpoint under {paths.join(workdir, 'checkpoints')}; "
            f"train first with `python train.py --config=... --workdir={workdir}`"
        )
    setup = loop.build(config, workdir, task_factory, devices)
    state = checkpointer.restore(setup.state)
    checkpointer.close()
    eval_step = loop.make_eval_step(setup)
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
        contract.prepare(setup.task, state.params)
        scored = loop.evaluate_split(setup.task, eval_step, state.params, setup.batch_sharding,
                                     loop.make_predict_step(setup))
    # The evaluation's files in a step of their own, where a training run's evaluation puts them.
    contract.write_outputs(scored.files, contract.predictions_directory(workdir))
    result = {"step": int(state.step), **scored.metrics, **contract.baselines(setup.task)}
    if jax.process_index() == 0:
        paths.write_atomic(paths.join(workdir, "eval.json"), json.dumps(result, indent=2))
        print(" | ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in result.items()), flush=True)
    with jax.set_mesh(setup.mesh), nn.logical_axis_rules(setup.rules):
        loop.print_samples(setup.task, state.params)
    return result
