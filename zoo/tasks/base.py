"""The contract between a task and the one training loop (zoo.train.loop)."""

import abc
from collections.abc import Iterable, Iterator

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from zoo import paths
from zoo.data.pipelines import batching

Batch = dict[str, np.ndarray]
# Moved to zoo.paths (zoo.data's synthetic caches use it, and zoo.data never imports zoo.tasks);
# still importable from here for tasks written against it.
write_once = paths.write_once


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
    axis over the mesh's data axes. `loss_fn` returns sums (see zoo.train.losses), never means.
    """

    model: nn.Module

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

    # Optional: tasks whose metrics need the model's outputs on the whole eval split (SQuAD
    # EM/F1) define predict; the loop gathers its outputs and passes them to score_predictions.
    predict = None

    def score_predictions(self, outputs: dict[str, np.ndarray]) -> dict[str, float]:
        """Metrics from the concatenated `predict` outputs of every eval batch (in order)."""
        return {}

    def pretrained_subtree(self) -> str | None:
        """The params subtree config.train.init_from fills (None: all of them)."""
        return None

    def frozen_subtrees(self) -> tuple[str, ...]:
        """Top-level params subtrees the optimizer leaves unchanged (e.g. a frozen encoder)."""
        return ()

    def prepare(self, params) -> None:
        """Called with the run's params (initialised, restored or loaded) before the first step
        and before evaluation: the place for work that needs them once, such as extracting a
        frozen encoder's features. Runs inside the mesh and logical-axis-rules context."""

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

    def activation_bytes(self, per_device_batch: int, tensor_parallel: int) -> float:
        """Activation memory of one device's micro-batch for the backward pass (dry run): the
        model family's activation_bytes (zoo/models/<family>.py, beside flops_per_token) given
        this job's shapes; 0 = unknown."""
        return 0.0

    def flops_per_token(self) -> float:
        """Training FLOPs per token (forward + backward) for MFU; 0 = unknown, MFU not shown."""
        return 0.0

    def samples(self, params) -> list[str]:
        """Generated examples to show a person (e.g. sampled text); none by default."""
        return []

    def baselines(self) -> dict[str, float]:
        """Reference figures a trained model should beat (e.g. a unigram model's perplexity)."""
        return {}

    def summarize(self, sums: dict[str, float]) -> dict[str, float]:
        """Turns summed eval metrics into reported values (means, perplexity, ...)."""
        weight = max(sums.get("weight_sum", 0.0), 1.0)
        return {"loss": sums["loss_sum"] / weight}
