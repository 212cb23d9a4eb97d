"""The opt-in parts of the task contract, and how the loop asks a task for them.

A task's required core (zoo.tasks.base.Task: the model, init_batch, loss_fn, the train and eval
batches, with init_params, model_inputs, summarize and tokens_per_batch defaulted) is all the
loop needs to train and evaluate. Everything else is a part a task declares by also inheriting
it, `class SquadTask(Task, Predicting, FineTuning, Measured)`, and the loop asks for a part with
isinstance, never by calling a do-nothing default on every task:

  Predicting   predict, score_predictions   metrics from the model's outputs on the whole eval
                                            split (SQuAD EM/F1, BLEU), and the files they make
  FineTuning   pretrained_subtree,          a run that starts from a pretrained subtree, may
               frozen_subtrees, prepare     freeze subtrees and extract features once
  Sampling     samples                      generated examples shown to a person
  Baselines    baselines                    reference figures a trained model should beat
  Measured     flops_per_token,             the analytic cost figures (MFU, the dry run)
               activation_bytes

This package sits below both sides of the contract: zoo.tasks implements it and zoo.train (the
loop, the dry run, the commands) asks through it, and neither imports the other. zoo.tasks.base
re-exports the parts beside Task; the losses every task shares are zoo.contract.losses.
"""

import abc
import dataclasses
from collections.abc import Mapping

import jax
import numpy as np

from zoo import paths


@dataclasses.dataclass(frozen=True)
class Scored:
    """What Predicting.score_predictions returns: the metrics, and the files the evaluation
    writes (a name under the predictions directory -> its text) in its own, explicit step
    (write_outputs), into a directory the caller chooses."""

    metrics: dict[str, float]
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)


class Predicting(abc.ABC):
    """Metrics that need the model's outputs on the whole eval split: the loop runs `predict` on
    every eval batch (jitted, sharded like the eval step), gathers the outputs on every process
    and hands them, concatenated in order, to `score_predictions`."""

    @abc.abstractmethod
    def predict(self, params, batch) -> dict[str, jax.Array]:
        """Per-batch outputs (leading axis the batch), e.g. span logits or decoded tokens."""

    @abc.abstractmethod
    def score_predictions(self, outputs: dict[str, np.ndarray]) -> Scored:
        """Metrics (and the files to write) from the concatenated `predict` outputs of every
        eval batch; eval padding rows come after the real ones. Must not write files itself."""


class FineTuning(abc.ABC):
    """A run that starts from a pretrained model's params (config.train.init_from) under a new
    head, possibly leaving some of them frozen."""

    @abc.abstractmethod
    def pretrained_subtree(self) -> str | None:
        """The params subtree config.train.init_from fills (None: all of them)."""

    def frozen_subtrees(self) -> tuple[str, ...]:
        """Top-level params subtrees the optimizer leaves unchanged (e.g. a frozen encoder)."""
        return ()

    def prepare(self, params) -> None:
        """Called with the run's params (initialised, restored or loaded) before the first step
        and before evaluation: the place for work that needs them once, such as extracting a
        frozen encoder's features. Runs inside the mesh and logical-axis-rules context."""


class Sampling(abc.ABC):
    @abc.abstractmethod
    def samples(self, params) -> list[str]:
        """Generated examples to show a person after training (e.g. sampled text)."""


class Baselines(abc.ABC):
    @abc.abstractmethod
    def baselines(self) -> dict[str, float]:
        """Reference figures a trained model should beat (e.g. a unigram model's perplexity)."""


class Measured(abc.ABC):
    """The analytic cost of a step, from the model family (zoo/models/<family>.py has
    flops_per_token and activation_bytes; the task passes them its data shapes)."""

    @abc.abstractmethod
    def flops_per_token(self) -> float:
        """Training FLOPs per token (forward + backward), tokens as tokens_per_batch counts them;
        0 = unknown (no MFU shown)."""

    def activation_bytes(self, per_device_batch: int, tensor_parallel: int) -> float:
        """Activation memory of one device's micro-batch for the backward pass; 0 = unknown."""
        return 0.0


PARTS = (Predicting, FineTuning, Sampling, Baselines, Measured)


def undeclared_parts(cls: type) -> dict[type, list[str]]:
    """The parts whose members `cls` defines without inheriting the part (a task written against
    the contract before it was split): part -> the members found."""
    found = {}
    for part in PARTS:
        if issubclass(cls, part):
            continue
        members = [name for name in part.__dict__ if not name.startswith("_")
                   and any(name in vars(k) for k in cls.__mro__ if k is not object)]
        if members:
            found[part] = members
    return found


# ---- how the loop, the dry run and the commands ask (a task without the part gets the default)

def flops_per_token(task) -> float:
    """The task's Measured.flops_per_token; 0 (unknown: no MFU) for a task without it."""
    return task.flops_per_token() if isinstance(task, Measured) else 0.0


def activation_bytes(task, per_device_batch: int, tensor_parallel: int) -> float:
    """The task's Measured.activation_bytes; 0 (unknown) for a task without it."""
    if not isinstance(task, Measured):
        return 0.0
    return task.activation_bytes(per_device_batch, tensor_parallel)


def pretrained_subtree(task) -> str | None:
    """The subtree config.train.init_from fills: FineTuning's, else None (all params)."""
    return task.pretrained_subtree() if isinstance(task, FineTuning) else None


def frozen_subtrees(task) -> tuple[str, ...]:
    """The subtrees the optimizer leaves unchanged: FineTuning's, else none."""
    return tuple(task.frozen_subtrees()) if isinstance(task, FineTuning) else ()


def prepare(task, params) -> None:
    """Runs FineTuning.prepare(params) for a task that has it."""
    if isinstance(task, FineTuning):
        task.prepare(params)


def baselines(task) -> dict[str, float]:
    """The task's reference figures (Baselines), else none."""
    return task.baselines() if isinstance(task, Baselines) else {}


def samples(task, params) -> list[str]:
    """The task's generated examples (Sampling), else none."""
    return task.samples(params) if isinstance(task, Sampling) else []


# ---- the evaluation's files: written in a step of their own --------------------------------

def predictions_directory(workdir: str) -> str:
    """Where an evaluation of the run in `workdir` writes its files: <workdir>/predictions."""
    return paths.join(workdir, "predictions")


def write_outputs(files: Mapping[str, str], directory: str) -> list[str]:
    """Writes each of an evaluation's `files` (name -> text; Scored.files) under `directory`,
    atomically (readers see the old file or the whole new one, local or gs://), on process 0
    only. Returns the paths written (none on other processes)."""
    if jax.process_index() != 0:
        return []
    written = []
    for name, text in files.items():
        written.append(paths.join(directory, name))
        paths.write_atomic(written[-1], text)
    return written
