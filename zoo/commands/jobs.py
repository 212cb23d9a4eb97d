"""Where a config becomes a run: config.task is looked up in zoo.tasks' registry here, and only
here, and handed down to the loop as a task factory (zoo.train and zoo.tasks never import each
other: they meet at zoo.contract), with the reader of pretrained directories (zoo.convert.hf).
train.py, eval.py, the pipeline and the commands that read a trained workdir all go through
these functions.
"""

import ml_collections

from zoo import paths, tasks
from zoo.commands import evaluate as evaluation
from zoo.data import corpora
from zoo.train import loop
from zoo.train.compilation import dry_run as dry_run_lib


def make_task(config: ml_collections.ConfigDict, workdir: str):
    """The task config.task names, built for `workdir` (a loop.TaskFactory). The loop calls it
    where it builds the task, so an unknown config.task is reported at the same point as ever:
    a ConfigError listing the tasks. A job on a real corpus that is not fetched stops first,
    with the fetch command (zoo.data.corpora.check_fetched)."""
    factory = tasks.get(config.task)
    corpora.check_fetched(config.get("data"))
    return factory(config, workdir)


def load_pretrained_params(path: str):
    """config.train.init_from's reader of a Hugging Face or google-research/bert directory
    (zoo.convert.hf, imported only when a run names one: it brings the torch / safetensors
    readers)."""
    from zoo.convert import hf

    return hf.pretrained_params(path)


def configure_storage(config: ml_collections.ConfigDict) -> None:
    """The job's bounds on gs:// requests (config.train.storage: zoo.paths.configure), set
    before the job's first request."""
    train_config = config.get("train")
    paths.configure(train_config.get("storage") if train_config is not None else None)


def train(config: ml_collections.ConfigDict, workdir: str, devices=None) -> dict[str, float]:
    """Trains (or resumes) the job in `workdir` on `devices` (default all): zoo.train.loop.run.
    Returns the last eval summary."""
    configure_storage(config)
    return loop.run(config, workdir, make_task, devices, load_pretrained_params)


def evaluate(config: ml_collections.ConfigDict, workdir: str, devices=None
             ) -> dict[str, float]:
    """Evaluates the latest checkpoint in `workdir` (zoo.commands.evaluate.run)."""
    configure_storage(config)
    return evaluation.run(config, workdir, make_task, devices)


def build(config: ml_collections.ConfigDict, workdir: str, devices=None) -> loop.Setup:
    """The job's task, mesh and freshly initialised sharded state (zoo.train.loop.build), e.g.
    as the restore target of a trained workdir's checkpoint."""
    configure_storage(config)
    return loop.build(config, workdir, make_task, devices)


def dry_run(config: ml_collections.ConfigDict, workdir: str, devices=None) -> dict[str, float]:
    """The job's mesh, per-device memory and FLOPs from shapes alone
    (zoo.train.compilation.dry_run)."""
    configure_storage(config)
    return dry_run_lib.report(config, workdir, make_task, devices)
