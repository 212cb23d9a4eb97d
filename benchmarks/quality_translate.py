"""The translation pairs of issue 37: Spanish -> English Bible verses, zoo's translation jobs
beside a PyTorch model of the same shape, fed the same prepared batches.

    python -m benchmarks.quality_translate --corpus DIR             # full, ~95 min, 2-core CPU
    python -m benchmarks.quality_translate --quick                  # fixture corpus, ~2 min
    python -m benchmarks.quality_translate --corpus DIR --models transformer --seeds 0

Models (each a pair, two seeds by default):
  transformer   configs/translate.py:size=tiny,corpus=bible (zoo.models.encoder_decoder:
                post-norm, sinusoidal positions, one shared embedding = output projection,
                label smoothing 0.1, dropout 0.1) beside torch.nn.Transformer with the same
                settings: batch_first, norm_first as zoo's norm, LayerNorm eps 1e-6, the stacks'
                extra final LayerNorms removed for post-norm (nn.Transformer always adds them;
                zoo's post-norm stacks have none), attention-weight and feed-forward-inner
                dropout off (zoo's attention_dropout_rate and mlp_dropout_rate are 0; torch's
                layers use their one `dropout` for both), token embedding N(0, 1/d) x sqrt(d),
                the interleaved sin/cos table, logits = y E^T.
  rnn-additive  configs/rnn_translate.py:size=tiny,corpus=bible,attention=additive (Bahdanau;
  rnn-general   attention=general: Luong with input feeding) (zoo.models.seq2seq, LSTM) beside
                an nn.LSTM encoder (packed by source length, so the final states are those of the
                last real token, as zoo's) and an nn.LSTMCell decoder stack stepped in Python
                with the same attention maths.

Same init family on both sides, so the comparison is of the training: zoo's Transformer already
uses Glorot-uniform projection kernels (xavier_uniform, fan-in/out of each d x d projection) and
so does the peer, per projection (torch's default treats in_proj_weight (3d, d) as one matrix,
fan-out 3d: re-drawn per q/k/v slice here), with zero biases (torch's linear1/linear2 default to
uniform biases: zeroed). The RNN peer copies zoo.nn.recurrent_cells' families: embeddings
N(0, 0.02), input kernels lecun-normal per gate, recurrent kernels orthogonal per gate, biases 0
(the LSTM's forget gate 1; bias_hh frozen at 0, zoo's LSTM has one bias), attention kernels
lecun-normal, v N(0, 1/H), output layer lecun-normal with a zero bias.

Recipe: the job's optimizer (AdamW, betas, eps, clip, schedule of zoo.train.optim.make_schedule
read step by step on the peer's side, decay groups by zoo.train.optim.decay_mask's rule: none on
biases and LayerNorm scales; both configs have weight decay 0), with `Recipe`'s batch, steps and
warm-up: each job's schedule and peak learning rate (Transformer inverse-sqrt, 0.00625; RNN
cosine, 3e-3) with a warm-up of `Recipe.warmup` steps (configured: 400, longer than the whole
run, and 100). The data is zoo's own pipeline:
the job's task (joint BPE trained on the training verses, length buckets) yields the batches,
both sides get each batch as numpy in the same order, one step each in turns (the side going
first alternating). Validation loss: mean token NLL over the first `Recipe.eval_verses` verses of
validation.tsv (zoo's eval step; the peer the same sums). BLEU: sacrebleu corpus BLEU (zoo.eval.
bleu) of the first `Recipe.decode_verses` verses of test.tsv, beam 4, alpha 0.6 (config.eval):
zoo's own decoding (TranslationTask._decode: zoo.decoding.beam_search over the job's decoder)
and, for the peer, `beam_search` below: plain PyTorch over the peer's own model (the Transformer
re-runs its decoder over the prefix each step, no cache), with the same ranking: log P / L^alpha,
L the generated tokens with EOS, an EOS candidate kept if among the step's K best, stop once K
are finished and no live beam can beat them; both outputs cut at a * |x| + b tokens.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see benchmarks/quality.py

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import machine, peers, step_jobs  # noqa: E402
from zoo import errors  # noqa: E402
from zoo.data.readers import parallel  # noqa: E402
from zoo.errors import ConfigError  # noqa: E402
from zoo.eval import bleu  # noqa: E402
from zoo.train import loop  # noqa: E402

MODELS = ("transformer", "rnn-additive", "rnn-general")
_KEYS = ("source_ids", "target_input_ids", "target_ids", "target_weights")
FETCH = "python -m zoo.commands.corpus fetch bible --out DIR"


# Sized so that BLEU tells the sides apart: at 200 steps of 32 every model scored BLEU 0.04-1
# (the RNNs wrote "The the,,,,"), a budget at which any two implementations agree. 1,500 steps of
# 32 verse pairs (the tutorial's tiny Transformer ran 1,500 steps of 64 to BLEU 22.4) take the
# whole run (3 models x 2 sides x 2 seeds + decoding) to about 95 minutes of a 2-core CPU, where
# a step of either side at batch 32 measured 0.2-0.35 s; a 2,000-piece BPE (the job's is 8,000)
# cuts the softmax, most of a tiny model's work; BLEU over 200 test verses.
@dataclasses.dataclass(frozen=True)
class Recipe:
    steps: int = 1500
    batch: int = 32
    vocab_size: int = 2000
    warmup: int = 100  # both jobs' warm-up (configured: Transformer 400, RNN 100)
    eval_every: int = 250
    eval_verses: int = 256  # validation verses of the loss curve
    decode_verses: int = 200  # test verses translated for BLEU
    samples: int = 3


FULL = Recipe()
QUICK = Recipe(steps=50, batch=16, vocab_size=300, warmup=20, eval_every=25, eval_verses=48,
               decode_verses=16)


# ---- configs, tasks, data ---------------------------------------------------------------------

def job_config(model: str, corpus_dir: str, cache_dir: str, recipe: Recipe, seed: int
               ) -> ml_collections.ConfigDict:
    """The job's config (size tiny, corpus=bible read from corpus_dir) with the recipe's batch,
    vocabulary, steps and (Transformer) warm-up; `seed` seeds the init and the batch order."""
    from configs import rnn_translate, translate

    if model not in MODELS:
        raise ConfigError(f"--models: unknown {model!r}; choose from {MODELS}")
    if model == "transformer":
        config = translate.get_config(f"size=tiny,corpus=bible,corpus_dir={corpus_dir}")
    else:
        attention = model.split("-")[1]
        config = rnn_translate.get_config(
            f"size=tiny,corpus=bible,corpus_dir={corpus_dir},attention={attention}")
    # A shorter warm-up; the job's peak learning rate kept (Transformer d^-0.5 400^-0.5).
    config.optim.warmup_steps = recipe.warmup
    config.data.update(batch_size=recipe.batch, vocab_size=recipe.vocab_size,
                       cache_dir=cache_dir, seed=seed)
    config.train.update(steps=recipe.steps, seed=seed)  # optim.total_steps follows
    return config


def check_corpus(corpus_dir: str) -> None:
    for name in ("train.tsv", "validation.tsv", "test.tsv"):
        path = os.path.join(corpus_dir, "bible", name)
        if not os.path.isfile(path):
            raise ConfigError(f"--corpus: {path} is missing; fetch the corpus with `{FETCH}` "
                              "and pass --corpus DIR (or --quick for a fixture corpus)")


def make_task(config: ml_collections.ConfigDict):
    from zoo.tasks.rnn_translation import RNNTranslationTask
    from zoo.tasks.translation import TranslationTask

    cls = TranslationTask if config.task == "translate" else RNNTranslationTask
    return cls(config, workdir=config.data.cache_dir)


def rows_of(task, pairs: list[tuple[str, str]]) -> dict[str, np.ndarray]:
    data = task.config.data
    return parallel.encode_pairs(pairs, task.tokenizer, data.source_len, data.target_len)


def trim(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rows cut to the longest real source / target of the batch (eval batches: one pass)."""
    s = max(int((batch["source_ids"] != 0).sum(1).max()), 1)
    t = max(int(batch["target_weights"].sum(1).max()), 1)
    return {"source_ids": batch["source_ids"][:, :s],
            **{k: batch[k][:, :t] for k in _KEYS[1:]}}


def eval_batches(rows: dict[str, np.ndarray], size: int) -> list[dict[str, np.ndarray]]:
    return [trim({k: rows[k][i:i + size] for k in _KEYS}) for i in range(0, len(rows[_KEYS[0]]),
                                                                          size)]


# ---- zoo's side --------------------------------------------------------------------------------

class ZooSide:
    """The job's task, optimizer and zoo.train.loop's jitted train / eval steps (one device)."""

    name = "zoo"

    def __init__(self, config: ml_collections.ConfigDict, task):
        self.config, self.task = config, task
        self.setup = step_jobs.build(config, task)
        self.train_step = loop.make_train_step(self.setup, config)
        self.eval_step = loop.make_eval_step(self.setup)
        self.state = self.setup.state
        self._context = contextlib.ExitStack()
        self._context.enter_context(jax.set_mesh(self.setup.mesh))
        self._context.enter_context(nn.logical_axis_rules(self.setup.rules))
        # One jitted decoder per task, so a second seed on the same task compiles nothing.
        if "_jit_decode" not in task.__dict__:
            task._jit_decode = jax.jit(task._decode)
        self._decode = task._jit_decode

    def close(self):
        self._context.close()

    def num_params(self) -> int:
        return int(sum(np.prod(p.shape) for p in jax.tree.leaves(self.state.params)))

    def step(self, batch: dict[str, np.ndarray]) -> float:
        self.state, metrics = self.train_step(
            self.state, jax.device_put(batch, self.setup.batch_sharding))
        return float(metrics["loss_sum"] / metrics["weight_sum"])

    def evaluate(self, batches: list[dict[str, np.ndarray]]) -> float:
        nll = weight = 0.0
        for batch in batches:
            sums = jax.device_get(self.eval_step(
                self.state.params, jax.device_put(batch, self.setup.batch_sharding)))
            nll, weight = nll + float(sums["nll_sum"]), weight + float(sums["weight_sum"])
        return nll / weight

    def translate(self, source_ids: np.ndarray) -> np.ndarray:
        """Token rows (no BOS; EOS then pad) by the job's own decoding (config.eval: beam)."""
        return np.asarray(self._decode(self.state.params, jnp.asarray(source_ids)))

    def cross_attention(self, source_ids: np.ndarray, target_input_ids: np.ndarray) -> np.ndarray:
        return zoo_cross_attention(self.task.model, self.state.params, source_ids,
                                   target_input_ids)


def zoo_cross_attention(model, params, source_ids: np.ndarray, target_input_ids: np.ndarray
                        ) -> np.ndarray:
    """[T, S] cross-attention of one teacher-forced pair, sown by zoo's model (Transformer: the
    last layer's, averaged over heads; RNN: alpha)."""
    from zoo.models import encoder_decoder, seq2seq

    _, state = model.apply({"params": params}, jnp.asarray(source_ids[None]),
                           jnp.asarray(target_input_ids[None]), sow_weights=True,
                           mutable=["intermediates"])
    if isinstance(model, encoder_decoder.EncoderDecoder):
        maps = encoder_decoder.attention_weights(state["intermediates"])["cross"]
        return np.asarray(maps[-1, 0].mean(axis=0))  # (T, S)
    return np.asarray(seq2seq.attention_weights(state["intermediates"])[0])


# ---- the PyTorch peers (benchmarks.quality_translate_peers) --------------------------------------

from benchmarks.quality_translate_peers import (  # noqa: E402
    TorchSide, torch_seq2seq, torch_transformer)

def texts(task, tokens: np.ndarray, source_lengths: np.ndarray) -> list[str]:
    """Detokenized hypotheses cut at EOS and at a * |x| + b tokens (the task's own rule)."""
    return task._texts(tokens, source_lengths)


def run_pair(model: str, corpus_dir: str, cache_dir: str, recipe: Recipe, seed: int,
             log: Callable[[str], None] = print, task=None) -> dict[str, Any]:
    """One seed of one model's pair: both sides trained in turns on zoo's batches, then the
    validation loss, BLEU on the test verses, samples and one attention map each. `task`: the
    job's task made for another seed of the same model (its tokenizer, rows and compiled
    decoder reused; its config replaced by this seed's)."""
    config = job_config(model, corpus_dir, cache_dir, recipe, seed)
    if task is None:
        task = make_task(config)
    task.config = config  # the seed's init and batch order; data and model are the same
    test_pairs = parallel.read_parallel(os.path.join(corpus_dir, "bible", "test.tsv"))
    test_pairs = test_pairs[:recipe.decode_verses]
    test = rows_of(task, test_pairs)
    val = {k: v[:recipe.eval_verses] for k, v in task.eval_rows.items()}
    val_batches = eval_batches(val, 64)
    zoo = ZooSide(config, task)
    builder = torch_transformer if model == "transformer" else torch_seq2seq
    peer = TorchSide(builder(task.model_config, seed), config)
    peer.tokenizer = task.tokenizer
    sides = [zoo, peer]
    out = {s.name: {"train_loss": [], "step_s": [], "curve": []} for s in sides}

    def evaluate(step: int):
        for side in sides:
            start = time.perf_counter()
            loss = side.evaluate(val_batches)
            out[side.name]["curve"].append((step, loss))
            log(f"  {model} seed {seed} step {step:4d} {side.name:4s} val loss {loss:.4f} "
                f"({time.perf_counter() - start:.1f} s)")

    try:
        evaluate(0)
        batches = task.train_batches(0, 1)
        for i in range(recipe.steps):
            batch = {k: np.asarray(v) for k, v in next(batches).items() if k in _KEYS}
            for side in (sides if i % 2 == 0 else sides[::-1]):
                copy = {k: v.copy() for k, v in batch.items()}  # neither side can change it
                start = time.perf_counter()
                loss = side.step(copy)
                out[side.name]["step_s"].append(time.perf_counter() - start)
                out[side.name]["train_loss"].append(loss)
            if (i + 1) % recipe.eval_every == 0 or i + 1 == recipe.steps:
                evaluate(i + 1)
        references = [target for _, target in test_pairs]
        shown = 0  # the attention map's verse: the first test verse of 12-30 source tokens
        lengths = test["source_lengths"]
        fits = np.flatnonzero((lengths >= 12) & (lengths <= 30))
        shown = int(fits[0]) if len(fits) else 0
        for side in sides:
            start = time.perf_counter()
            tokens = np.concatenate([side.translate(test["source_ids"][i:i + 50])
                                     for i in range(0, len(references), 50)])
            hyps = texts(task, tokens, test["source_lengths"])
            score = bleu.corpus_bleu(hyps, [references])
            n = int(test["target_lengths"][shown])
            attention = side.cross_attention(test["source_ids"][shown, :lengths[shown]],
                                             test["target_input_ids"][shown, :n])
            out[side.name].update(
                bleu=score.score, bleu_signature=score.signature,
                decode_s=time.perf_counter() - start, samples=hyps[:recipe.samples],
                attention=np.asarray(attention, np.float32).round(4).tolist(),
                params=side.num_params(), final_val_loss=out[side.name]["curve"][-1][1])
            log(f"  {model} seed {seed} {side.name:4s} BLEU {score.score:.2f} "
                f"({time.perf_counter() - start:.1f} s)")
    finally:
        zoo.close()
    pieces = lambda ids: [task.tokenizer.decode([int(i)]) for i in ids]  # noqa: E731
    n = int(test["target_lengths"][shown])
    return {"task": task, "pair": f"{model}-bible-es-en", "model": model, "seed": seed,
            "recipe": dataclasses.asdict(recipe), "vocab_size": task.tokenizer.vocab_size,
            "train_pairs": int(len(task.train_rows["source_ids"])),
            "sources": [s for s, _ in test_pairs[:recipe.samples]],
            "references": references[:recipe.samples],
            "attention_verse": {"source": pieces(test["source_ids"][shown, :lengths[shown]]),
                                "target": pieces(test["target_ids"][shown, :n])},
            "sides": out}


# ---- fixture, report ---------------------------------------------------------------------------

_ES_EN = [("el hombre", "the man"), ("la mujer", "the woman"), ("el rey", "the king"),
          ("el pueblo", "the people"), ("el profeta", "the prophet"), ("la ciudad", "the city"),
          ("el siervo", "the servant"), ("el hijo", "the son")]
_VERBS = [("habló a", "spoke to"), ("vio a", "saw"), ("bendijo a", "blessed"),
          ("siguió a", "followed"), ("llamó a", "called")]
_TAILS = [("", ""), (" en la tierra", " in the land"), (" en el templo", " in the temple"),
          (" por la mañana", " in the morning")]


def write_fixture_corpus(corpus_dir: str, seed: int = 0) -> str:
    """bible/{train,validation,test}.tsv of short templated Spanish<TAB>English verses, the
    layout `python -m zoo.commands.corpus fetch bible` writes; returns corpus_dir."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(corpus_dir, "bible"), exist_ok=True)
    for split, count in (("train", 1200), ("validation", 60), ("test", 60)):
        lines = []
        for _ in range(count):
            (s1, e1), (v1, ve), (s2, e2), (t1, te) = (
                _ES_EN[rng.integers(len(_ES_EN))], _VERBS[rng.integers(len(_VERBS))],
                _ES_EN[rng.integers(len(_ES_EN))], _TAILS[rng.integers(len(_TAILS))])
            o2 = s2.replace("a el ", "al ")
            lines.append(f"{s1.capitalize()} {v1} {o2}{t1}.\t{e1.capitalize()} {ve} {e2}{te}.")
        with open(os.path.join(corpus_dir, "bible", f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return corpus_dir


from benchmarks.quality_translate_report import summarize, write_report  # noqa: E402

NOTES = [
    "Both sides: the job's own batches (its task's tokenizer, encoding and length-bucketed "
    "iterator, data.seed = the seed), as numpy, the same order, one step each in turns.",
    "Init family: Glorot-uniform per projection and N(0, 1/d) embeddings (Transformer); "
    "lecun-normal / orthogonal per gate (RNN), as zoo's; the peer's torch defaults re-drawn.",
    "nn.Transformer's extra final encoder/decoder LayerNorms removed (zoo's post-norm stacks "
    "have none); its attention-weight and feed-forward-inner dropout off, as zoo's.",
    "The peer's beam search re-runs its decoder over the whole prefix each step (no cache).",
]


# ---- entry points ------------------------------------------------------------------------------

def run(corpus_dir: str, models=MODELS, seeds=(0, 1), recipe: Recipe = FULL, out: str = "",
        cache_dir: str = "", mode: str = "full", log=print) -> list[dict]:
    """Every model's pair for every seed; writes the report into results_dir(out) and returns
    the records."""
    check_corpus(corpus_dir)
    reason = peers.unavailable_reason(jax.devices()[0].platform)
    if reason:
        raise ConfigError(f"benchmarks.quality_translate needs its PyTorch peer: {reason}")
    directory = machine.results_dir(out or None)
    cache_dir = cache_dir or os.path.join(tempfile.gettempdir(), "zoo_quality_translate")
    torch_info = peers.setup_torch("cpu")
    started, start = datetime.datetime.now(datetime.timezone.utc), time.perf_counter()
    commit = machine.zoo_commit()  # the code the run started with (it may be edited meanwhile)

    def header() -> dict:
        return dict(machine=machine.machine_name(), zoo_commit=commit,
                    jax=jax.__version__, torch=torch_info["torch"],
                    threads=torch_info["torch_threads"], mode=mode, corpus=corpus_dir,
                    started=started.strftime("%Y-%m-%d %H:%M UTC"), seeds=list(seeds),
                    recipe=dataclasses.asdict(recipe), notes=NOTES,
                    wall_s=time.perf_counter() - start)

    records, paths = [], []
    for model in models:
        task = None
        for seed in seeds:
            log(f"{model} seed {seed}")
            records.append(run_pair(model, corpus_dir, cache_dir, recipe, seed, log, task))
            task = records[-1].pop("task")
        # Rewritten after every model, so a long run stopped part-way keeps what it finished.
        paths = write_report(directory, header(), records)
    for s in map(summarize, records):
        log(f"{s['model']} seed {s['seed']}: val loss zoo {s['val_loss']['zoo']:.3f} peer "
            f"{s['val_loss']['peer']:.3f}; BLEU zoo {s['bleu']['zoo']:.2f} peer "
            f"{s['bleu']['peer']:.2f}; ms/step zoo {s['ms_per_step']['zoo']:.0f} peer "
            f"{s['ms_per_step']['peer']:.0f}")
    log("wrote " + ", ".join(paths))
    return records


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default="", help="directory holding bible/ (" + FETCH + ")")
    parser.add_argument("--quick", action="store_true",
                        help="reduced recipe, one seed, a fixture corpus unless --corpus")
    parser.add_argument("--models", default=",".join(MODELS), help=f"of {MODELS}")
    parser.add_argument("--seeds", default="", help="comma-separated; default 0,1 (quick: 0)")
    parser.add_argument("--out", default="", help="results directory; default "
                        "benchmarks/results/<machine> (quick: a new temporary directory)")
    parser.add_argument("--cache", default="", help="tokenizer cache (default: a temp dir)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        models = [m for m in args.models.split(",") if m]
        unknown = sorted(set(models) - set(MODELS))
        if unknown:
            raise ConfigError(f"--models: unknown {unknown}; choose from {MODELS}")
        seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1")).split(",")]
        corpus = args.corpus
        if args.quick and not corpus:
            corpus = write_fixture_corpus(tempfile.mkdtemp(prefix="quality_translate_corpus_"))
        if not corpus:
            raise ConfigError(f"--corpus DIR is required (make it with `{FETCH}`), or --quick")
        out = args.out or (tempfile.mkdtemp(prefix="quality_translate_") if args.quick else "")
        cache = args.cache or (os.path.join(out, "cache") if args.quick else "")
        run(corpus, models, seeds, QUICK if args.quick else FULL, out, cache,
            "quick" if args.quick else "full",
            log=lambda line: print(line, flush=True))
    except errors.UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
