"""benchmarks.quality's NNLM pair: zoo's NNLM job (configs/nnlm.py, Bengio et al. 2003) beside a
PyTorch NNLM of the same shape, word level on Brown (issue 37).

    python -m benchmarks.quality_nnlm --corpus DIR            # full: two seeds, ~12 min alone
    python -m benchmarks.quality_nnlm --quick                 # fixture corpus, one seed, < 1 min

The examples are built once per split from quality_data.load_brown's id stream (the vocabulary and
splits of the LSTM/GRU pairs): every token t >= n-1 of a split is one example, target t with the
context of the n-1 tokens before it in the same split (so no context crosses a split; the first
n-1 tokens of a split are contexts only). They are laid out as rows of `per_row` consecutive
examples, which is zoo's NNLM task's own layout (an LM batch [B, T]: position p predicts the token
after p from tokens p, p-1, ..., p-n+2 of the row): a row is n-2 leading context tokens then one
input per example, and its targets are -1 ("no example") at the n-2 leading positions and in the
padding after a split's last example. Both sides receive the same (inputs, targets) rows in the
same seeded order (train_in_turns); zoo reads them as its task's batch (weights = targets >= 0),
the peer as a PyTorch user would: contexts = inputs.unfold(1, n-1, 1) -> [B, per_row, n-1], one
prediction per context, cross_entropy(ignore_index=-1). Zoo's model also computes logits at the
n-2 leading positions (weight 0): (n-2) / per_row more of the output layer than the peer.

The peer: nn.Embedding C -> concatenation of the n-1 context vectors x -> tanh(H x) -> U (with
bias), plus the direct connections W x (no bias), as zoo.models.nnlm; initialised from zoo's
families so the comparison is of the training: C ~ N(0, 0.02^2) (zoo.nn.embeddings), H, U and W
lecun-normal (truncated normal, variance 1 / fan-in, fan-in n-1 times m for H and W), biases
zero. zoo's extra `start` vector (the window slot before a row's start) only feeds the leading
positions, which carry no example, so it never moves the loss.

The recipe is configs/nnlm.py:size=tiny's (widths 32 / 64, n-1 = 4, direct connections; AdamW
lr 3e-3, warm-up 40, b2 0.99, eps 1e-8, decay 0.1 on matrices, cosine to 0, clip 1.0) with the
step budget and batch of `Recipe`. Metrics: validation and test perplexity = exp(mean NLL over
every example of the split), and curves of a strided part of validation.
"""

import os

# Before torch loads OpenMP (see benchmarks/quality.py): passive waiting between parallel regions.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import cli, machine, peers, quality_data, quality_report, quality_sides  # noqa: E402
from configs import nnlm as nnlm_job  # noqa: E402
from zoo.errors import ConfigError  # noqa: E402
from zoo.tasks import nnlm as nnlm_task  # noqa: E402
from zoo.tasks.base import Task  # noqa: E402

PAIR = "nnlm-word-brown"


# Sized for a 2-core CPU shared with other jobs: the 24k-word output layer (U and the direct
# connections W: (h + (n-1) m) V = 192 x 24,418 weights) is nearly all the work, 6 FLOPs per
# weight per example trained, 2 per example evaluated; the final evaluation of every example of
# both splits (242k) costs as much as ~300 training steps, so the budget is 300 steps of 256
# examples (4 rows of 64: zoo's 3 leading positions per row are 5% more output layer), ~8% of
# an epoch.
@dataclasses.dataclass(frozen=True)
class Recipe:
    steps: int = 300
    rows: int = 4  # rows per batch
    per_row: int = 64  # consecutive examples per row: rows x per_row = 256 examples a step
    eval_every: int = 100
    curve_stride: int = 32  # the curve's validation part: every 32nd row
    eval_rows: int = 16  # rows per evaluation call (one compiled shape, padded)


FULL = Recipe()
QUICK = Recipe(steps=150, rows=8, per_row=16, eval_every=50, curve_stride=1)


# ---- the examples ------------------------------------------------------------------------------

def examples(stream: np.ndarray, context: int) -> tuple[np.ndarray, np.ndarray]:
    """Every example of one split: contexts [N, context] (oldest first) and targets [N], where
    target k is stream[k + context] and its context stream[k : k + context]."""
    n = len(stream) - context
    if n < 1:
        raise ConfigError(f"a split of {len(stream)} tokens holds no {context + 1}-gram")
    index = np.arange(n)[:, None] + np.arange(context)[None, :]
    return stream[index], stream[context:]


def example_rows(stream: np.ndarray, context: int, per_row: int, pad: bool
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The examples of one split as rows: inputs and targets, each [R, context - 1 + per_row].

    Row r holds examples r * per_row .. r * per_row + per_row - 1 (of `examples`): its inputs
    are stream[r * per_row + p] for p < context - 1 + per_row, its target at position p is the
    next token, stream[r * per_row + p + 1], for p >= context - 1 and -1 before (those positions
    only complete the first example's context). pad: the last, partial row is kept with -1
    targets after the split's last example (evaluation: every example once); else dropped.
    """
    n = len(stream) - context  # examples
    if n < 1:
        raise ConfigError(f"a split of {len(stream)} tokens holds no {context + 1}-gram")
    rows = -(-n // per_row) if pad else n // per_row
    if rows == 0:
        raise ConfigError(f"a split of {len(stream)} tokens cannot fill one row of {per_row} "
                          f"{context + 1}-grams")
    width = context - 1 + per_row
    start = np.arange(rows)[:, None] * per_row + np.arange(width)[None, :]  # (R, T)
    padded = np.concatenate([stream, np.zeros(width + per_row, stream.dtype)])
    x = padded[start].astype(np.int32)
    y = padded[start + 1].astype(np.int32)
    y[:, :context - 1] = -1
    y[start + 1 >= len(stream)] = -1  # past the split's end (pad only; inputs there are 0)
    return x, y


def row_order(num_rows: int, steps: int, rows: int, seed: int) -> np.ndarray:
    """[steps, rows]: the train rows of each step, epoch after epoch a fresh seeded
    permutation (no row repeats within an epoch)."""
    rng = np.random.default_rng(seed)
    need = steps * rows
    epochs = -(-need // num_rows)
    return np.concatenate([rng.permutation(num_rows) for _ in range(epochs)])[:need].reshape(
        steps, rows)


# ---- zoo's side ---------------------------------------------------------------------------------

def job_config(recipe: Recipe, vocab_size: int, seed: int) -> ml_collections.ConfigDict:
    """The job configs/nnlm.py:size=tiny with the recipe's batch and steps and a row of
    context - 1 + per_row positions; its vocabulary is quality_data's (count >= 2)."""
    config = nnlm_job.get_config("size=tiny")
    config.data.update(seq_len=config.model.context - 1 + recipe.per_row,
                       batch_size=recipe.rows, eval_batch_size=recipe.eval_rows,
                       vocab_size=vocab_size)
    config.train.update(steps=recipe.steps, seed=seed)  # optim.total_steps follows train.steps
    return config


def nnlm_batch(x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Rows of `example_rows` as the NNLM task's batch: one segment per row, weight 1 where a
    row position has a target (targets -1 -> id 0, weight 0)."""
    batch = quality_sides.lm_batch(x, np.maximum(y, 0))
    batch["weights"] = (y >= 0).astype(np.float32)
    return batch


class RowsNNLM(nnlm_task.NNLMTask):
    """The NNLM task's model, loss and eval over a vocabulary of `vocab_size` ids, its corpus
    replaced by the rows fed here (as quality_rnn.WindowLM does for the RNN LM)."""

    def __init__(self, config: ml_collections.ConfigDict, vocab_size: int):
        Task.__init__(self, config, workdir="")
        self.tokenizer = type("Vocabulary", (), {"vocab_size": vocab_size})()
        self.model_config, self.model = self.build_model()

    def init_batch(self):
        shape = (self.config.data.batch_size, self.config.data.seq_len)
        return nnlm_batch(np.zeros(shape, np.int32), np.zeros(shape, np.int32))


class ZooRows(quality_sides.ZooSide):
    """quality_sides.ZooSide on `example_rows` rows (weights from the -1 targets); evaluation in
    calls of exactly `eval_rows` rows, the last padded, so one program serves every call."""

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        batch = jax.device_put(nnlm_batch(x, y), self.setup.batch_sharding)
        self.state, metrics = self.train_step(self.state, batch)
        return float(metrics["loss_sum"] / metrics["weight_sum"])

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> float:
        nll = weight = 0.0
        for start in range(0, len(x), self.eval_rows):
            xs, ys = x[start:start + self.eval_rows], y[start:start + self.eval_rows]
            short = self.eval_rows - len(xs)
            if short:
                xs = np.concatenate([xs, np.zeros((short, xs.shape[1]), xs.dtype)])
                ys = np.concatenate([ys, np.full((short, ys.shape[1]), -1, ys.dtype)])
            sums = jax.device_get(self.eval_step(
                self.state.params, jax.device_put(nnlm_batch(xs, ys), self.setup.batch_sharding)))
            nll, weight = nll + float(sums["nll_sum"]), weight + float(sums["weight_sum"])
        return nll / weight


# ---- the peer -----------------------------------------------------------------------------------

def torch_nnlm(cfg, seed: int):
    """The PyTorch NNLM equal in shape and init family to zoo's NNLM of `cfg` (NNLMConfig):
    module(contexts [..., n-1] long, oldest first) -> logits [..., V]."""
    import torch

    torch.manual_seed(seed)
    x_dim = cfg.context * cfg.embed_dim

    def lecun_normal_(weight):
        # flax lecun_normal: truncated (+-2 sd) normal rescaled so the variance is 1 / fan-in.
        std = (1.0 / weight.shape[1]) ** 0.5 / 0.87962566103423978
        torch.nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)

    class NNLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.C = torch.nn.Embedding(cfg.vocab_size, cfg.embed_dim)
            if cfg.hidden_dim:
                self.H = torch.nn.Linear(x_dim, cfg.hidden_dim)
                self.U = torch.nn.Linear(cfg.hidden_dim, cfg.vocab_size)
            if cfg.direct:  # the output bias is U's; W has one only without a hidden layer
                self.W = torch.nn.Linear(x_dim, cfg.vocab_size, bias=not cfg.hidden_dim)
            with torch.no_grad():
                torch.nn.init.normal_(self.C.weight, std=0.02)
                for layer in (getattr(self, n, None) for n in ("H", "U", "W")):
                    if layer is not None:
                        lecun_normal_(layer.weight)
                        if layer.bias is not None:
                            layer.bias.zero_()

        def forward(self, contexts):
            x = self.C(contexts).flatten(-2)  # (..., n-1, m) -> (..., (n-1) m)
            logits = 0.0
            if cfg.hidden_dim:
                logits = self.U(torch.tanh(self.H(x)))  # (..., V)
            if cfg.direct:
                logits = logits + self.W(x)
            return logits

    return NNLM()


class TorchRows(quality_sides.TorchSide):
    """quality_sides.TorchSide on `example_rows` rows: the rows' contexts (unfold) through the
    NNLM, cross-entropy over the examples (targets -1 ignored)."""

    def __init__(self, module, context: int, optim: ml_collections.ConfigDict, eval_rows: int):
        super().__init__(module, module, optim, eval_rows)
        self.context = context

    def _nll(self, x: np.ndarray, y: np.ndarray, reduction: str):
        torch = self.torch
        contexts = torch.from_numpy(x).long().unfold(1, self.context, 1)  # (B, per_row, n-1)
        targets = torch.from_numpy(y[:, self.context - 1:]).long()  # (B, per_row)
        logits = self.module(contexts)  # (B, per_row, V)
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1,
            reduction=reduction)

    def _loss(self, x: np.ndarray, y: np.ndarray):
        return self._nll(x, y, "mean")

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> float:
        self.module.eval()
        total = 0.0
        with self.torch.no_grad():
            for start in range(0, len(x), self.eval_rows):
                rows = slice(start, start + self.eval_rows)
                total += float(self._nll(x[rows], y[rows], "sum"))
        return total / int((y >= 0).sum())


# ---- one seed -----------------------------------------------------------------------------------

def run(words: quality_data.WordCorpus, recipe: Recipe, seed: int, log=print,
        progress=lambda record: None) -> dict[str, Any]:
    """One seed of the NNLM pair, both sides trained in turns on the same rows; a record in
    benchmarks.quality_report's format. `progress(record)`: the record so far, after every
    curve point."""
    config = job_config(recipe, words.vocab_size, seed)
    context = config.model.context
    record = {"pair": PAIR, "seed": seed, "recipe": dataclasses.asdict(recipe),
              "model": {k: config.model[k] for k in ("size", "context", "direct")},
              "vocab_size": words.vocab_size,
              "tokens": {k: int(len(v)) for k, v in words.splits.items()},
              "examples": {k: int(len(v) - context) for k, v in words.splits.items()},
              "metric": "validation"}
    task = RowsNNLM(config, words.vocab_size)
    x, y = example_rows(words.splits["train"], context, recipe.per_row, pad=False)
    order = row_order(len(x), recipe.steps, recipe.rows, seed)
    final_sets = {s: example_rows(words.splits[s], context, recipe.per_row, pad=True)
                  for s in ("validation", "test")}
    val_x, val_y = final_sets["validation"]
    eval_sets = {"validation_part": (val_x[::recipe.curve_stride], val_y[::recipe.curve_stride])}
    zoo = ZooRows(config, task, eval_rows=recipe.eval_rows)
    module = torch_nnlm(task.model_config, seed)
    peer = TorchRows(module, context, config.optim, eval_rows=recipe.eval_rows)
    try:
        result = quality_sides.train_in_turns(
            [zoo, peer], ((x[k], y[k]) for k in order), recipe.steps, recipe.eval_every,
            eval_sets, final_sets, log,
            on_eval=lambda out, step: progress(dict(record, sides=out, steps_done=step)))
        params = {"zoo": zoo.num_params(),
                  "peer": sum(p.numel() for p in module.parameters() if p.requires_grad)}
    finally:
        zoo.close()
    return dict(record, train_rows=int(len(x)), params=params, sides=result,
                steps_done=recipe.steps)


# ---- the command --------------------------------------------------------------------------------

NOTES = [
    "zoo runs its job's own code: configs/nnlm.py:size=tiny's task (zoo.tasks.nnlm) and loss, "
    "zoo.train.optim.make_optimizer(config.optim) and zoo.train.loop's jitted train step.",
    "Both sides see every example as (the n-1 = 4 tokens before it, the token): rows of "
    "consecutive examples, the peer's contexts by unfold; zoo's model also computes the output "
    "layer at the 3 leading positions of each row (weight 0), 3 / per_row more than the peer.",
    "The peer's AdamW groups: decay on every parameter with dim >= 2 (C, H, U, W), zoo's "
    "decay_mask by name (which also decays zoo's 1-D `start` vector: it never has a gradient "
    "here, and never reaches a weighted logit).",
    "Parameters: zoo's count includes `start` (embed_dim more than the peer's).",
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default="", help="corpus directory (holding brown/)")
    parser.add_argument("--quick", action="store_true",
                        help="reduced recipe, one seed, a fixture corpus unless --corpus")
    parser.add_argument("--seeds", default="", help="comma-separated; default 0,1 (quick: 0)")
    parser.add_argument("--out", default="", help="results directory; default "
                        "benchmarks/results/<machine> (quick: a new temporary directory)")
    return parser.parse_args(argv)


def perplexity_lines(summaries: list[dict[str, Any]]) -> list[str]:
    """Both splits' perplexity ratios per seed and their mean, judged on the 3% goal."""
    lines = ["", "## Perplexity zoo / peer", "", "| seed | validation | test | step time |",
             "|---:|---:|---:|---:|"]
    ratios = {"validation": [], "test": []}
    for s in summaries:
        for split in ratios:
            ratios[split].append(s["zoo"]["perplexity"][split] / s["peer"]["perplexity"][split])
        lines.append(f"| {s['seed']} | {ratios['validation'][-1]:.3f} | {ratios['test'][-1]:.3f} "
                     f"| {s['step_ratio']:.2f} |")
    means = {k: sum(v) / len(v) for k, v in ratios.items()}
    lines += [f"| mean | {means['validation']:.3f} | {means['test']:.3f} | "
              f"{sum(s['step_ratio'] for s in summaries) / len(summaries):.2f} |", ""]
    met = max(abs(m - 1.0) for m in means.values()) <= quality_report.PERPLEXITY_GAP
    lines += [f"Perplexity goal (within {quality_report.PERPLEXITY_GAP:.0%} of the peer on both "
              f"splits, mean over seeds): {'met' if met else 'NOT met'}.", ""]
    return lines


def write(directory: str, header: dict[str, Any], records: list[dict[str, Any]]) -> list[str]:
    """quality_nnlm.jsonl (header + records with their summaries, quality.jsonl's format),
    quality_nnlm.md and quality_nnlm-word-brown.png."""
    summaries = [quality_report.summarize(r) for r in records]
    jsonl = os.path.join(directory, "quality_nnlm.jsonl")
    machine.write_jsonl(jsonl, [dict(header, record="header")]
                        + [dict(r, summary=s) for r, s in zip(records, summaries)])
    md = os.path.join(directory, "quality_nnlm.md")
    with open(md, "w") as f:
        f.write(quality_report.markdown(header, summaries) + "\n".join(perplexity_lines(summaries)))
    return [jsonl, md, quality_report.plot(directory, PAIR, records)]


def run_command(args) -> list[str]:
    seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1")).split(",")]
    reason = peers.unavailable_reason(jax.devices()[0].platform)
    if reason:
        raise ConfigError(f"benchmarks.quality_nnlm needs its PyTorch peer: {reason}")
    corpus_dir = args.corpus
    if args.quick and not corpus_dir:
        corpus_dir = quality_data.write_fixture_corpus(tempfile.mkdtemp(prefix="quality_corpus_"))
    if not corpus_dir:
        raise ConfigError("--corpus DIR is required (or --quick for a fixture corpus); make DIR "
                          "with `python -m zoo.commands.corpus fetch brown --out DIR`")
    if not os.path.isdir(os.path.join(corpus_dir, "brown")):
        raise ConfigError(f"--corpus {corpus_dir}: {os.path.join(corpus_dir, 'brown')} is not a "
                          "directory; make it with `python -m zoo.commands.corpus fetch brown "
                          "--out DIR` and pass DIR (or `--quick` for a fixture corpus)")
    words = quality_data.load_brown(corpus_dir)
    out = args.out or (tempfile.mkdtemp(prefix="quality_nnlm_") if args.quick else "")
    directory = machine.results_dir(out or None)
    torch_info = peers.setup_torch("cpu")
    started, start = datetime.datetime.now(datetime.timezone.utc), time.perf_counter()
    header = dict(machine=machine.machine_name(), zoo_commit=machine.zoo_commit(),
                  jax=jax.__version__, torch=torch_info["torch"],
                  transformers=torch_info["transformers"], threads=torch_info["torch_threads"],
                  mode="quick" if args.quick else "full", corpus=corpus_dir,
                  started=started.strftime("%Y-%m-%d %H:%M UTC"), seeds=seeds, notes=NOTES)
    log = lambda line: print(line, flush=True)  # noqa: E731
    partial = os.path.join(directory, "quality_nnlm_partial.json")

    def progress(record):
        with open(partial, "w") as f:
            json.dump(record, f)

    records = []
    recipe = QUICK if args.quick else FULL
    for seed in seeds:
        log(f"{PAIR} seed {seed}: {words.vocab_size:,} words, "
            + ", ".join(f"{k} {len(v):,}" for k, v in words.splits.items()))
        records.append(run(words, recipe, seed, log, progress))
    header["wall_s"] = time.perf_counter() - start
    paths = write(directory, header, records)
    if os.path.exists(partial):
        os.remove(partial)
    for s in map(quality_report.summarize, records):
        log(f"{s['pair']} seed {s['seed']}: perplexity zoo/peer validation "
            f"{s['perplexity_ratio']:.3f}, test "
            f"{s['zoo']['perplexity']['test'] / s['peer']['perplexity']['test']:.3f}; "
            f"step zoo/peer {s['step_ratio']:.2f}")
    log("wrote " + ", ".join(paths))
    return paths


def main(argv=None) -> int:
    return cli.exit_status(lambda: run_command(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
