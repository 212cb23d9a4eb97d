"""word2vec beside gensim (issue 37): zoo's word2vec job and gensim.models.Word2Vec, the reference
word2vec, trained on the same tokenised sentences of all the English text of the fetched corpora
(Brown, Shakespeare's plays and the World English Bible: every split of each), with the same
vocabulary and hyperparameters and the same number of passes, then judged by Spearman correlation
with WordSim-353 and SimLex-999 and by nearest neighbours.

    python -m benchmarks.quality_word2vec --corpus DIR       # full: ~80 min on a 2-core CPU
    python -m benchmarks.quality_word2vec --corpus DIR --modes cbow --seeds 0
    python -m benchmarks.quality_word2vec --quick            # a fixture corpus, one seed, seconds

DIR is what `python -m zoo.commands.corpus fetch brown|shakespeare|bible --out DIR` writes.

zoo's side is what train.py runs for `configs/word2vec.py:corpus=english,mode=MODE` with its
train_files widened to every split: the job's task (tokeniser, vocabulary, subsampling, windows,
rows, loss), its optimizer and zoo.train.loop's jitted train step (benchmarks.step_jobs.build, one
device), its own batch iterator, for one shuffled pass over the rows of its pair_draws (= epochs)
draws. gensim gets the very sentences the task tokenised (zoo.data.readers.word2vec.tokenize of
every line) and the config's hyperparameters: vector_size, window, negative, min_count, sample,
ns_exponent, epochs, alpha 0.025 -> min_alpha 0.0001, cbow_mean=1; the run stops if its vocabulary
and counts differ from zoo's.

gensim reads its sentences in the order it is given them, every pass the same, while zoo shuffles
its rows over the whole run. On this corpus the order alone moves gensim's Spearman by 0.02-0.04
(the file order ends each pass on Brown and Shakespeare), so the peer zoo is judged against reads
the sentences reshuffled every pass (seeded); gensim in file order, and gensim with its default
3 worker threads, are reported beside it.
"""

import argparse
import collections
import contextlib
import datetime
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np

from benchmarks import cli, machine, step_jobs
from configs import word2vec as word2vec_job
from zoo.data.readers import sources
from zoo.data.readers import word2vec as w2v_data
from zoo.errors import ConfigError
from zoo.models import word2vec as w2v_model
from zoo.train import loop

MODES = ("skipgram", "cbow")
SPLITS = ("train", "validation", "test")
PROBE_WORDS = ("king", "water", "god", "love", "said", "house")
NEIGHBOURS = 8
# gensim/test/test_data in the gensim wheel.
SIMILARITY_SETS = {"wordsim353": "wordsim353.tsv", "simlex999": "simlex999.txt"}
CURVE_POINTS = 5  # evaluations over a run: one per pass (gensim: at each epoch's end)
GENSIM_WORKERS = 3  # gensim's default
QUICK_BATCH = 64  # the fixture corpus has a few thousand rows
# zoo as it was, or as gensim reads: the evidence for each real-text choice (run_one).
ABLATIONS = ("adam", "mean_gradient", "file_order")


def job_config(corpus_dir: str, mode: str, seed: int, batch_size: int = 0
               ) -> ml_collections.ConfigDict:
    """configs/word2vec.py:corpus=english,mode=MODE reading every split of the three corpora
    (train, validation and test: all the English text), data and init seeded by `seed`;
    `batch_size` (quick runs) replaces the recipe's, its learning rates following it."""
    config = word2vec_job.get_config(f"corpus=english,mode={mode},corpus_dir={corpus_dir}")
    if batch_size:
        config.data.batch_size = batch_size
        config.optim.update(learning_rate=word2vec_job.ALPHA * batch_size,
                            end_learning_rate=word2vec_job.MIN_ALPHA * batch_size)
    config.data.train_files = ",".join(os.path.join(corpus_dir, corpus, f"{split}.txt")
                                       for corpus in word2vec_job.ENGLISH for split in SPLITS)
    config.data.seed = seed
    config.train.seed = seed
    return config


def sentences(config: ml_collections.ConfigDict) -> list[list[str]]:
    """The training sentences exactly as zoo.tasks.word2vec tokenises them."""
    return [w2v_data.tokenize(s) for doc in sources.load_documents(config.data, "train")
            for s in doc]


# ---- the word-similarity sets ----------------------------------------------------------------

def similarity_pairs(name: str) -> list[tuple[str, str, float]]:
    """(word, word, human score) of a set shipped with gensim, lower-cased."""
    from gensim.test.utils import datapath

    pairs = []
    with open(datapath(SIMILARITY_SETS[name]), encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            a, b, score = line.rstrip("\n").split("\t")[:3]
            pairs.append((a.lower(), b.lower(), float(score)))
    return pairs


def usable_pairs(vocab: set[str]) -> dict[str, dict[str, list]]:
    """Per set: the pairs both of whose words are in the (shared) vocabulary, and those skipped
    as out-of-vocabulary; both sides are scored on the same `pairs`."""
    out = {}
    for name in SIMILARITY_SETS:
        pairs = similarity_pairs(name)
        out[name] = {"pairs": [p for p in pairs if p[0] in vocab and p[1] in vocab],
                     "skipped": [p[:2] for p in pairs if p[0] not in vocab or p[1] not in vocab]}
    return out


def spearman(vectors: np.ndarray, index: dict[str, int], pairs: list) -> float:
    """Spearman correlation of cosine similarity with the human scores over `pairs` (nan for
    fewer than 3)."""
    from scipy.stats import spearmanr

    if len(pairs) < 3:
        return float("nan")
    v = np.asarray(vectors, np.float64)
    v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
    cosine = [float(v[index[a]] @ v[index[b]]) for a, b, _ in pairs]
    return float(spearmanr([s for _, _, s in pairs], cosine).statistic)


def scores(vectors: np.ndarray, words: list[str], sets: dict) -> dict[str, float]:
    index = {w: i for i, w in enumerate(words)}
    return {name: spearman(vectors, index, s["pairs"]) for name, s in sets.items()}


def neighbours(vectors: np.ndarray, words: list[str]) -> dict[str, list[str]]:
    """The NEIGHBOURS cosine-nearest words of each probe word in the vocabulary."""
    index = {w: i for i, w in enumerate(words)}
    out = {}
    for word in PROBE_WORDS:
        if word in index:
            ids, _ = w2v_model.cosine_neighbours(vectors, vectors[index[word]], NEIGHBOURS,
                                                 exclude=[index[word]])
            out[word] = [words[i] for i in ids]
    return out


# ---- what the data path keeps ------------------------------------------------------------------

def data_accounting(config: ml_collections.ConfigDict, text_sentences: list[str],
                    tokens: list[list[str]], vocab: w2v_data.Vocabulary) -> dict[str, Any]:
    """What zoo's data path drops on the way from the text to the vocabulary ids: characters
    outside every token (punctuation), tokens of words seen fewer than min_count times, and the
    share subsampling keeps per pass (its expectation)."""
    characters = collections.Counter()
    for s in text_sentences:
        characters.update(c for c in s.lower().replace("\u2019", "'") if not c.isspace())
    in_tokens = collections.Counter(c for sentence in tokens for t in sentence for c in t)
    dropped = characters - in_tokens
    total = sum(len(s) for s in tokens)
    known = int(vocab.counts.sum())
    keep = w2v_data.keep_probabilities(vocab.counts, config.data.sample)
    return {
        "lines": len(text_sentences), "tokens": total, "distinct_words": len(
            {t for s in tokens for t in s}),
        "vocabulary": len(vocab), "min_count": config.data.min_count,
        "characters_non_space": sum(characters.values()),
        "characters_dropped": sum(dropped.values()),
        "characters_dropped_top": dropped.most_common(12),
        "letters_or_digits_dropped": sum(n for c, n in dropped.items() if c.isalnum()),
        "tokens_below_min_count": total - known,
        "expected_kept_per_pass": float((vocab.counts * keep).sum()),
    }


# ---- the two sides -----------------------------------------------------------------------------

def train_zoo(config: ml_collections.ConfigDict, task, sets: dict,
              log: Callable[[str], None], in_order: bool = False) -> dict[str, Any]:
    """One shuffled pass over the task's rows (all pair_draws draws) through the job's train
    step under `config` (an ablation's may batch otherwise: the task reads it meanwhile);
    Spearman at CURVE_POINTS points. Times exclude the evaluations. `in_order`: the rows
    unshuffled instead of the task's iterator, i.e. the draws one after another, each the
    sentences in file order, centre after centre: gensim's order in file order."""
    own, task.config = task.config, config
    try:
        return _train_zoo(config, task, sets, log, in_order)
    finally:
        task.config = own


def _train_zoo(config, task, sets, log, in_order):
    batch = config.data.batch_size
    rows = len(task.train_rows["targets"])
    steps = rows // batch
    # The decay ends with the pass (set both: an ablation's copied config has lost the
    # FieldReference between them).
    config.train.steps = config.optim.total_steps = steps
    setup = step_jobs.build(config, task)
    train_step = loop.make_train_step(setup, config)
    state = setup.state
    words = list(task.vocab.words)
    passes = config.data.pair_draws
    marks = {round(steps * k / CURVE_POINTS) for k in range(1, CURVE_POINTS + 1)}

    def table():
        return np.asarray(jax.device_get(state.params["embedding"]))

    curve = [(0.0, scores(table(), words, sets))]
    batches = (({k: v[i * batch:(i + 1) * batch] for k, v in task.train_rows.items()}
                for i in range(steps)) if in_order else task.train_batches(0, 1))
    seconds, first_step_s, losses = 0.0, None, []
    with jax.set_mesh(setup.mesh):
        start = time.perf_counter()
        for i in range(steps):
            state, metrics = train_step(state, jax.device_put(next(batches),
                                                              setup.batch_sharding))
            if i == 0:
                jax.block_until_ready(metrics)
                first_step_s = time.perf_counter() - start  # compilation included
            if i + 1 in marks:
                losses.append(float(metrics["loss_sum"] / metrics["weight_sum"]))
                seconds += time.perf_counter() - start
                curve.append((passes * (i + 1) / steps, scores(table(), words, sets)))
                log(f"    zoo {i + 1:6d}/{steps} steps, loss {losses[-1]:.4f}, "
                    + ", ".join(f"{k} {v:.4f}" for k, v in curve[-1][1].items())
                    + f" ({seconds:.0f} s)")
                start = time.perf_counter()
    vectors = table()
    return {"curve": curve, "final": curve[-1][1], "train_s": seconds,
            "load_1min": os.getloadavg()[0],
            "first_step_s": first_step_s, "steps": steps, "batch_size": batch, "rows": rows,
            "rows_trained": steps * batch, "losses": losses,
            "neighbours": neighbours(vectors, words)}


class Reshuffled:
    """The sentences in a new seeded order each time gensim iterates them (each pass)."""

    def __init__(self, sentences: list[list[str]], seed: int):
        self.sentences, self.seed, self.iterations = sentences, seed, 0

    def __iter__(self):
        order = np.random.default_rng([self.seed, self.iterations]).permutation(
            len(self.sentences))
        self.iterations += 1
        return (self.sentences[i] for i in order)


def train_gensim(config: ml_collections.ConfigDict, sentences: list[list[str]],
                 vocab: w2v_data.Vocabulary, sets: dict, order: str, workers: int,
                 log: Callable[[str], None]) -> dict[str, Any]:
    """gensim.models.Word2Vec with the job's hyperparameters on `sentences`, in file order or
    reshuffled every pass; Spearman after every epoch. Times exclude the evaluations."""
    from gensim.models import Word2Vec
    from gensim.models.callbacks import CallbackAny2Vec

    data, seed = config.data, config.data.seed
    model = Word2Vec(vector_size=config.model.embed_dim, window=data.window,
                     negative=data.negatives, ns_exponent=data.noise_power,
                     min_count=data.min_count, sample=data.sample, epochs=data.pair_draws,
                     alpha=word2vec_job.ALPHA, min_alpha=word2vec_job.MIN_ALPHA,
                     sg=int(config.model.mode == "skipgram"), cbow_mean=1, hs=0, seed=seed,
                     workers=workers)
    corpus = Reshuffled(sentences, seed) if order == "reshuffled" else sentences
    start = time.perf_counter()
    model.build_vocab(corpus)
    vocab_s = time.perf_counter() - start
    theirs = {w: int(model.wv.get_vecattr(w, "count")) for w in model.wv.index_to_key}
    ours = dict(zip(vocab.words, (int(c) for c in vocab.counts)))
    if theirs != ours:
        differ = sorted(set(theirs.items()) ^ set(ours.items()))[:5]
        raise RuntimeError(f"gensim's vocabulary differs from zoo's: {len(theirs)} vs "
                           f"{len(ours)} words, e.g. {differ}")
    curve = [(0.0, scores(model.wv.vectors, model.wv.index_to_key, sets))]

    class Evaluate(CallbackAny2Vec):
        def __init__(self):
            self.epoch, self.eval_s = 0, 0.0

        def on_epoch_end(self, m):
            begin = time.perf_counter()
            self.epoch += 1
            curve.append((float(self.epoch), scores(m.wv.vectors, m.wv.index_to_key, sets)))
            self.eval_s += time.perf_counter() - begin

    callback = Evaluate()
    start = time.perf_counter()
    effective, raw = model.train(corpus, total_examples=model.corpus_count,
                                 epochs=model.epochs, callbacks=[callback])
    seconds = time.perf_counter() - start - callback.eval_s
    log(f"    gensim ({order}, {workers} worker{'s' * (workers > 1)}) "
        + ", ".join(f"{k} {v:.4f}" for k, v in curve[-1][1].items()) + f" ({seconds:.0f} s)")
    return {"curve": curve, "final": curve[-1][1], "train_s": seconds, "vocab_s": vocab_s,
            "load_1min": os.getloadavg()[0],
            "order": order, "workers": workers, "effective_words": int(effective),
            "raw_words": int(raw),
            "neighbours": neighbours(model.wv.vectors, model.wv.index_to_key)}


# ---- one mode and seed ---------------------------------------------------------------------------

def ablation_config(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
    """The job's config with one of its real-text choices undone (the evidence for each):
    'adam' = size=base's recipe before corpus=english had its own, Adam at lr 2e-3 decayed
    linearly to 0 on batches of 4,096 (quick runs: the batch they ran); the others (see
    run_one) keep the config."""
    config = ml_collections.ConfigDict(config.to_dict())
    if name != "adam":
        return config
    if config.data.batch_size != QUICK_BATCH:
        config.data.batch_size = 4096
    config.optim.update(name="adamw", learning_rate=2e-3, end_learning_rate=0.0, b1=0.9,
                        b2=0.999, eps=1e-8, weight_decay=0.0)
    return config


class MeanGradient:
    """Ablation 'mean_gradient' (CBOW): the mean's own gradient, 1/count of the error to each
    context word, as zoo's CBOW trained before it followed word2vec.c's update."""

    def __enter__(self):
        self.original = w2v_model.context_mean
        w2v_model.context_mean = lambda total, count: total / count
        return self

    def __exit__(self, *exc):
        w2v_model.context_mean = self.original


def run_one(corpus_dir: str, mode: str, seed: int, workdir: str, ablations: list[str],
            log: Callable[[str], None], batch_size: int = 0,
            gensim_runs=(("reshuffled", 1), ("file", 1), ("reshuffled", GENSIM_WORKERS))
            ) -> dict[str, Any]:
    """zoo (and its ablations) and gensim (each of `gensim_runs`: order, workers) for one mode
    and seed. The first gensim run is the peer."""
    from zoo.tasks.word2vec import Word2VecTask

    config = job_config(corpus_dir, mode, seed, batch_size)
    start = time.perf_counter()
    task = Word2VecTask(config, workdir)
    prepare_s = time.perf_counter() - start
    docs = sources.load_documents(config.data, "train")
    text = [s for doc in docs for s in doc]
    tokens = [w2v_data.tokenize(s) for s in text]
    sets = usable_pairs(set(task.vocab.words))
    log(f"{mode} seed {seed}: {len(task.vocab):,} words, {len(task.train_rows['targets']):,} "
        f"rows in {config.data.pair_draws} draws ({prepare_s:.0f} s to prepare)")
    record: dict[str, Any] = {
        "pair": f"word2vec-{mode}-english", "mode": mode, "seed": seed,
        "config": {"embed_dim": config.model.embed_dim, **{k: config.data[k] for k in (
            "min_count", "window", "sample", "negatives", "noise_power", "pair_draws",
            "batch_size")}, "optimizer": config.optim.name,
            "learning_rate": config.optim.learning_rate,
            "end_learning_rate": config.optim.end_learning_rate},
        "files": [os.path.relpath(f, corpus_dir) for f in config.data.train_files.split(",")],
        "data": data_accounting(config, text, tokens, task.vocab),
        "sets": {k: {"pairs": len(v["pairs"]), "skipped": v["skipped"]} for k, v in sets.items()},
        "zoo": dict(train_zoo(config, task, sets, log), prepare_s=prepare_s),
        "gensim": [train_gensim(config, tokens, task.vocab, sets, order, workers, log)
                   for order, workers in gensim_runs],
        "ablations": {},
    }
    for name in ablations:
        if name == "mean_gradient" and mode != "cbow":
            continue  # skip-gram has one input word: the rule changes nothing
        log(f"  ablation {name}")
        # mean_gradient: the train step is traced inside, where encode reads context_mean.
        with MeanGradient() if name == "mean_gradient" else contextlib.nullcontext():
            record["ablations"][name] = train_zoo(ablation_config(config, name), task, sets,
                                                  log, in_order=name == "file_order")
    return record


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default="", help="what `zoo.commands.corpus fetch` wrote")
    parser.add_argument("--quick", action="store_true",
                        help="a fixture corpus (unless --corpus), one seed, no ablations")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seeds", default="", help="comma-separated; default 0,1 (quick: 0)")
    parser.add_argument("--ablations", default=None,
                        help=f"comma-separated of {', '.join(ABLATIONS)}; default all (quick: "
                        "none)")
    parser.add_argument("--out", default="", help="results directory; default "
                        "benchmarks/results/<machine> (quick: a new temporary directory)")
    parser.add_argument("--rewrite", action="store_true", help="write the .md and .png again "
                        "from --out's quality_word2vec.jsonl (no training)")
    return parser.parse_args(argv)


def rewrite(out: str) -> list[str]:
    """The report of a finished run, again from its .jsonl (its header and records)."""
    import json

    from benchmarks import quality_word2vec_report as report

    path = os.path.join(machine.results_dir(out or None), "quality_word2vec.jsonl")
    with open(path) as f:
        lines = [json.loads(line) for line in f]
    header = {k: v for k, v in lines[0].items() if k != "record"}
    return report.write(os.path.dirname(path), dict(header, notes=report.NOTES), lines[1:])


def run(args) -> list[str]:
    from benchmarks import quality_word2vec_report as report

    if args.rewrite:
        return rewrite(args.out)

    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - set(MODES):
        raise ConfigError(f"--modes: unknown {sorted(set(modes) - set(MODES))}; of {MODES}")
    seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1")).split(",")]
    ablations = [a for a in (args.ablations if args.ablations is not None else
                             ("" if args.quick else ",".join(ABLATIONS))).split(",") if a]
    if set(ablations) - set(ABLATIONS):
        raise ConfigError(f"--ablations: unknown {sorted(set(ablations) - set(ABLATIONS))}; "
                          f"of {ABLATIONS}")
    corpus_dir = args.corpus
    if args.quick and not corpus_dir:
        corpus_dir = write_fixture_corpus(tempfile.mkdtemp(prefix="quality_word2vec_corpus_"))
    if not corpus_dir:
        raise ConfigError("--corpus DIR is required (or --quick for the fixture corpus)")
    out = machine.results_dir(args.out or (tempfile.mkdtemp(prefix="quality_word2vec_")
                                           if args.quick else None))
    import gensim

    started, start = datetime.datetime.now(datetime.timezone.utc), time.perf_counter()
    log = lambda line: print(line, flush=True)  # noqa: E731
    workdir = tempfile.mkdtemp(prefix="quality_word2vec_work_")
    records = []
    partial = os.path.join(out, "quality_word2vec_partial.jsonl")
    for mode in modes:
        for seed in seeds:
            records.append(run_one(corpus_dir, mode, seed, workdir, ablations, log,
                                   batch_size=QUICK_BATCH if args.quick else 0))
            machine.write_jsonl(partial, records)  # a run cut short keeps what it finished
    header = dict(machine=machine.machine_name(), zoo_commit=machine.zoo_commit(),
                  jax=jax.__version__, gensim=gensim.__version__, cores=os.cpu_count(),
                  mode="quick" if args.quick else "full", corpus=corpus_dir,
                  started=started.strftime("%Y-%m-%d %H:%M UTC"), seeds=seeds, modes=modes,
                  ablations=ablations, wall_s=time.perf_counter() - start, notes=report.NOTES)
    paths = report.write(out, header, records)
    os.remove(partial)
    log("wrote " + ", ".join(paths))
    return paths


def write_fixture_corpus(root: str) -> str:
    """A small corpus in the fetched layout (the three corpora's train/validation/test.txt)
    holding words of a few WordSim-353 and SimLex-999 pairs, and the Bible's U+2019."""
    lines = {
        "brown": ["The king said the house by the water was his .",
                  "The tiger and the cat ran by the car and the train .",
                  "She said her love of the old book and the new paper was hard to hide .",
                  "A smart and intelligent man found the easy and the difficult work ."],
        "shakespeare": ["The king doth love his house and his water ,",
                        "A happy and cheerful queen , glad of the fast car ,",
                        "And God save the king , said the duke of the long night .",
                        "My love is as the water of the sea , short and long ."],
        "bible": ["God said, \u201cLet there be water in the house of the king.\u201d",
                  "The king\u2019s love for God was great, and the queen was glad.",
                  "He said to the king, \u201cGo to your house and your book.\u201d",
                  "The cat, the tiger and the old paper were new to the train."],
    }
    for corpus, text in lines.items():
        os.makedirs(os.path.join(root, corpus), exist_ok=True)
        for split in SPLITS:
            with open(os.path.join(root, corpus, f"{split}.txt"), "w", encoding="utf-8") as f:
                f.write(("\n".join(text) + "\n\n") * 20)
    return root


def main(argv=None) -> int:
    return cli.exit_status(lambda: run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
