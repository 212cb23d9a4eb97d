"""The contract between a task and the one training loop (zoo.train.loop).

A task is the required core, `Task` (the model, init_batch, loss_fn, the train and eval batches;
init_params, model_inputs, summarize and tokens_per_batch have defaults), plus the opt-in parts
it inherits beside it (zoo.contract, re-exported here): Predicting (predict,
score_predictions -> Scored), FineTuning (pretrained_subtree, frozen_subtrees, prepare),
Sampling (samples), Baselines (baselines) and Measured (flops_per_token, activation_bytes).
"""

import abc
from collections.abc import Iterable, Iterator

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from zoo import paths
from zoo.contract import (Baselines, FineTuning, Measured, Predicting, Sampling, Scored,
                          undeclared_parts)
from zoo.data.pipelines import batching

__all__ = ["Baselines", "Batch", "FineTuning", "Measured", "Predicting", "Sampling", "Scored",
           "Task", "data_cache_dir"]

Batch = dict[str, np.ndarray]


def data_cache_dir(config: ml_collections.ConfigDict, workdir: str) -> str:
    """Where prepared data and trained tokenizers are cached: config.data.cache_dir (shared
    between runs, e.g. two pretraining phases and a fine-tuning run), else <workdir>/data."""
    cache_dir = config.data.get("cache_dir", "")
    if cache_dir:
        paths.check_remote(cache_dir, "config.data.cache_dir")
        return paths.join(cache_dir)
    return paths.join(workdir, "data")


class Task(abc.ABC):
    """A job kind: model + data + loss + metrics. The loop owns sharding, steps and logging.

    Batches are dicts of numpy arrays whose leading axis is the batch; the loop shards that
    axis over the mesh's data axes. `loss_fn` returns sums (see zoo.contract.losses), never means.
    Anything more is an opt-in part inherited beside Task (see the module docstring).
    """

    model: nn.Module

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # A task written before the contract was split defines e.g. `predict` without
        # inheriting Predicting: the loop would never call it, so say what to declare.
        missing = undeclared_parts(cls)
        if missing:
            found = "; ".join(f"{', '.join(members)} (part {part.__name__})"
                              for part, members in missing.items())
            parts = ", ".join(part.__name__ for part in missing)
            raise TypeError(
                f"task {cls.__module__}.{cls.__qualname__} defines {found} without declaring "
                f"the part, so the loop would never call them: inherit it beside Task, "
                f"`class {cls.__name__}(Task, {parts})` (from zoo.tasks.base), and have "
                "Predicting.score_predictions return Scored(metrics, files) rather than "
                "writing files")

    def __init__(self, config: ml_collections.ConfigDict, workdir: str):
        self.config = config
        self.workdir = workdir

    def data_cache_dir(self) -> str:
        return data_cache_dir(self.config, self.workdir)

    @abc.abstractmethod
    def init_batch(self) -> Batch:
        """A batch of the global shape, used only for shapes at init."""

    @abc.abstractmethod
    def loss_fn(self, params, batch: Batch, rng: jax.Array, train: bool) -> dict[str, jax.Array]:
        """Sums over the batch; must include 'loss_sum' and 'weight_sum'."""

    # Most tasks hold their examples in memory as `train_rows` / `eval_rows` (dicts of numpy
    # arrays with one leading example axis); the two methods below batch those. A task whose
    # data lives elsewhere (BERT's sharded on-disk cache) or batches otherwise (translation's
    # length buckets) overrides them.
    train_rows: Batch
    eval_rows: Batch

    def train_batches(self, process_index: int, process_count: int) -> Iterator[Batch]:
        """Endless process-local batches (this process's rows of each global batch): shuffled
        epochs of `train_rows`, resumable (zoo.data.pipelines.batching.train_iterator); built in
        config.data.num_workers grain processes where the job's config declares that key."""
        return batching.train_iterator(self.train_rows, self.config.data.batch_size,
                                       self.config.data.seed, process_index, process_count,
                                       num_workers=self.config.data.get("num_workers", 0))

    def eval_batches(self, process_index: int, process_count: int) -> Iterable[Batch]:
        """One pass over the held-out split, process-local, global shapes fixed: `eval_rows`
        padded to whole batches with zero-weight rows (zoo.data.pipelines.batching.eval_batches)."""
        return batching.eval_batches(self.eval_rows, self.config.data.eval_batch_size,
                                     process_index, process_count)

    def init_params(self, rng: jax.Array):
        batch = self.init_batch()
        return self.model.init({"params": rng, "dropout": rng}, **self.model_inputs(batch))[
            "params"
        ]

    def model_inputs(self, batch: Batch) -> dict:
        return {}

    def tokens_per_batch(self) -> int:
        """Tokens in one global batch (the unit of flops_per_token)."""
        return self.config.data.batch_size * self.config.data.seq_len

    def summarize(self, sums: dict[str, float]) -> dict[str, float]:
        """Turns summed eval metrics into reported values (means, perplexity, ...)."""
        weight = max(sums.get("weight_sum", 0.0), 1.0)
        return {"loss": sums["loss_sum"] / weight}
