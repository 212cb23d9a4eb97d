"""The jobs benchmarks.step times, and what else lowers or compiles the same train step
(benchmarks.compile, grad_reduction, restart, blockwise_tpu_collectives; tests/train's export
and AOT checks): a job config at a benchmark size, and its task with a random batch of the
task's own keys, shapes and dtypes in place of a corpus, so the loss, optimizer, FLOPs and
sharded init are train.py's.
"""

import dataclasses
import types

import jax
import ml_collections
import numpy as np

from configs import bert_pretrain
from configs import gpt as gpt_job
from zoo.errors import ConfigError
from zoo.models import bert
from zoo.tasks import lm, mlm_nsp
from zoo.tasks.base import Task
from zoo.train import layer_scan, loop, partitioning, program


@dataclasses.dataclass(frozen=True)
class Size:
    """A benchmark size: the job config variant it starts from, the vocabulary, and any model
    fields changed from that variant's."""

    variant: str
    vocab_size: int
    model: tuple[tuple[str, int], ...] = ()


# Tiny sizes keep their job config's vocabulary; the others use the released tokenizers'
# (BERT's WordPiece 30,522, GPT-2's BPE 50,257), so "124M" is GPT-2 small's parameter count.
SIZES: dict[str, dict[str, Size]] = {
    "bert": {
        "tiny": Size("tiny", 2048),
        "small": Size("small", 30522),
        "base": Size("base", 30522),
        "large": Size("large", 30522),
    },
    "gpt": {
        "tiny": Size("tiny", 1024),
        # 4 x 256 over GPT-2's vocabulary: the output layer is most of the work, the shape the
        # HF Flax comparison of issue 28 was measured at (--sizes mini --seq-lens 128 --batch 8).
        "mini": Size("124M", 50257, (("num_layers", 4), ("num_heads", 4), ("embed_dim", 256),
                                     ("mlp_dim", 1024))),
        # GPT-2 has no size between tiny and 124M: BERT-small's shape (L4, A8, H512).
        "small": Size("124M", 50257, (("num_layers", 4), ("num_heads", 8), ("embed_dim", 512),
                                      ("mlp_dim", 2048))),
        "124M": Size("124M", 50257),
        "355M": Size("355M", 50257),
    },
}
def num_predictions(seq_len: int) -> int:
    """Masked positions per sequence at BERT's ratio (configs/bert_pretrain.py: 20 of 128,
    80 of 512)."""
    return max(1, round(seq_len * 5 / 32))


def job_config(model: str, size: str, seq_len: int, batch: int, dtype: str
               ) -> ml_collections.ConfigDict:
    """The job config train.py would run for `model` at `size`, with the benchmark's batch
    shape and compute dtype (the optimizer, dropout, layer scan and mesh stay the job's)."""
    if model not in SIZES:
        raise ConfigError(f"--models: unknown model {model!r}; choose from {list(SIZES)}")
    if size not in SIZES[model]:
        raise ConfigError(f"--sizes: {model} has no size {size!r}; it has {list(SIZES[model])}")
    spec = SIZES[model][size]
    if model == "bert":
        config = bert_pretrain.get_config(f"size={spec.variant}")
        config.data.max_predictions_per_seq = num_predictions(seq_len)
    else:
        config = gpt_job.get_config(f"size={spec.variant}")
    config.model.update(dict(spec.model, dtype=dtype))
    config.data.update(seq_len=seq_len, batch_size=batch, vocab_size=spec.vocab_size)
    return config


def random_batch(model: str, config: ml_collections.ConfigDict, vocab_size: int,
                 seed: int = 0) -> dict[str, np.ndarray]:
    """A batch with the task's keys, shapes and dtypes: full-length rows of random tokens
    (MLM: P distinct masked positions per row and NSP labels; LM: next-token targets)."""
    rng = np.random.default_rng(seed)
    b, t = config.data.batch_size, config.data.seq_len
    tokens = rng.integers(0, vocab_size, (b, t + 1), dtype=np.int32)
    if model == "gpt":
        return {
            "inputs": tokens[:, :-1], "targets": tokens[:, 1:],
            "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(),
            "segment_ids": np.ones((b, t), np.int32), "weights": np.ones((b, t), np.float32),
        }
    p = config.data.max_predictions_per_seq
    # Never position 0 ([CLS]), as the pretraining data's masking.
    positions = np.sort(np.stack([rng.choice(np.arange(1, t), p, replace=False)
                                  for _ in range(b)]), axis=1).astype(np.int32)
    return {
        "input_ids": tokens[:, :t],
        "token_type_ids": (np.arange(t) >= t // 2).astype(np.int32)[None].repeat(b, 0),
        "attention_mask": np.ones((b, t), np.int32),
        "masked_lm_positions": positions,
        "masked_lm_ids": rng.integers(0, vocab_size, (b, p), dtype=np.int32),
        "masked_lm_weights": np.ones((b, p), np.float32),
        "next_sentence_labels": rng.integers(0, 2, (b,), dtype=np.int32),
        "example_weight": np.ones((b,), np.float32),
    }


class _RandomPretraining(mlm_nsp.PretrainingTask):
    """BERT pretraining's model, loss and FLOPs, on a random batch instead of a corpus."""

    def __init__(self, config: ml_collections.ConfigDict, vocab_size: int):
        Task.__init__(self, config, workdir="")
        # As PretrainingTask.__init__ builds it, the tokenizer's vocabulary given.
        model_kw = {k: v for k, v in config.model.to_dict().items() if k != "size"}
        self.model_config = bert.config_for_size(
            config.model.size, vocab_size=vocab_size,
            max_position_embeddings=max(config.data.seq_len,
                                        model_kw.pop("max_position_embeddings")),
            **model_kw)
        self.model = bert.BertForPreTraining(self.model_config)
        self.batch = random_batch("bert", config, vocab_size)

    def init_batch(self):
        return self.batch


class _RandomLM(lm.LanguageModelTask):
    """The LM task's model, loss and FLOPs, on a random batch instead of a corpus."""

    def __init__(self, config: ml_collections.ConfigDict, vocab_size: int):
        Task.__init__(self, config, workdir="")
        self.tokenizer = types.SimpleNamespace(vocab_size=vocab_size)  # all build_model reads
        self.model_config, self.model = self.build_model()
        self.batch = random_batch("gpt", config, vocab_size)

    def init_batch(self):
        return self.batch


def make_task(model: str, config: ml_collections.ConfigDict, vocab_size: int,
              platforms: tuple[str, ...] | None = None) -> Task:
    """The job's task on random batches. `platforms`: what its step will run on, settling
    config.model.scan_unroll for them as zoo.train.loop.build does (zoo.train.layer_scan: the
    benchmarks that time a step here pass this machine's); None leaves 'auto' unsettled (one
    layer per iteration), as the compile command and export build a step for other hardware."""
    if platforms is not None:
        config = layer_scan.resolve(config, platforms)
    return (_RandomPretraining if model == "bert" else _RandomLM)(config, vocab_size)


def here() -> tuple[str, ...]:
    """The platform of the device a benchmark's one-device step runs on."""
    return (jax.devices()[0].platform,)


def build(config: ml_collections.ConfigDict, task: Task) -> loop.Setup:
    """zoo.train.loop.build for a task made here: the job's optimizer and a sharded TrainState
    on a one-device mesh."""
    mesh = partitioning.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor,
                                  devices=jax.devices()[:1])
    rules = partitioning.rules_from_config(config.mesh.rules)
    optimizer = program.make_optimizer(task, config)
    state, state_sharding = partitioning.sharded_init(
        program.init_state_fn(task, optimizer), mesh, rules, jax.random.key(config.train.seed))
    return loop.Setup(task, mesh, rules, optimizer, state, state_sharding,
                      partitioning.batch_sharding(mesh, rules))
