"""Training quality beside the reference implementation, on the same bytes (issue 37).

    python -m benchmarks.quality --corpus DIR          # full: ~50 min on a 2-core CPU
    python -m benchmarks.quality --corpus DIR --pairs gpt --seeds 0,1,2
    python -m benchmarks.quality --quick               # ~3 min, a fixture corpus, one seed
    python -m benchmarks.quality --merge A,B,C         # one report of runs made apart

--merge joins the quality.jsonl of runs made separately (e.g. one process per pair, started
together on a machine shared with other jobs: each pair's two sides still alternate step by
step in their own process, so their times compare) into one quality.{jsonl,md} and the plots.

Pairs (each trains zoo's job and its peer in one process, one step each in turns, on identical
numpy batches in the same order, same recipe and step budget; see benchmarks.quality_sides):
  gpt   zoo's GPT job vs Hugging Face's PyTorch GPT2LMHeadModel, character level on Shakespeare,
        nanoGPT's CPU recipe (benchmarks.quality_gpt); metric: val loss (goal: within 0.05).
  gpt_bpe  the same on the same split as GPT-2 tokens (nanoGPT's data/shakespeare; the
        `gpt2_bpe` fetch in DIR: GPT-2's tokenizer, 50,257 ids).
  lstm  zoo's RNN LM job vs a torch.nn.LSTM LM of the same shape and init family, word level on
  gru   Brown (benchmarks.quality_rnn); validation and test perplexity (goal: within 3%).
The other pairs run their own modules, each writing its own report beside quality.md (which
links them), with this command's --corpus, --seeds, --quick and --out:
  nnlm           zoo's NNLM vs a PyTorch NNLM on Brown (benchmarks.quality_nnlm)
  translate      Transformer and RNN seq2seq (additive, general attention) vs PyTorch models,
                 Spanish -> English Bible verses, sacrebleu BLEU (benchmarks.quality_translate)
  bert           tiny BERT MLM + NSP on Brown vs HF BertForPreTraining (benchmarks.quality_bert)
  bert_finetune  tiny BERT fine-tuned on SpamAssassin and Brown's genres vs HF
                 BertForSequenceClassification (benchmarks.quality_bert_finetune)
  word2vec       skip-gram and CBOW vs gensim's Word2Vec on all the English text, WordSim-353
                 and SimLex-999 Spearman (benchmarks.quality_word2vec)
Without --pairs: every pair (several hours on a 2-core CPU); --quick: gpt, lstm, gru.

DIR is what `python -m zoo.commands.corpus fetch shakespeare|brown|... --out DIR` writes (layout in
benchmarks.quality_data). --quick writes a small fixture corpus of the same layout (or reads
--corpus), runs reduced recipes and one seed, and by default writes into a fresh temporary
directory, so it never replaces the committed results.

Outputs in benchmarks.machine.results_dir(--out): quality.jsonl, quality.md, quality_<pair>.png
(benchmarks.quality_report).
"""

import os

# Before torch loads OpenMP: its worker threads otherwise spin-wait between the many small
# parallel regions of a tiny model, and on a 2-core machine shared with XLA's thread pool (and
# here another training job) a step of the GPT peer measured 0.41-3.1 s in turns with zoo's,
# against 0.09 s with passive waiting; zoo's step was unchanged (0.10-0.15 s).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import datetime  # noqa: E402
import glob  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

from benchmarks import cli, machine, peers, quality_data, quality_gpt, quality_report  # noqa: E402
from benchmarks import quality_rnn  # noqa: E402
from zoo.errors import ConfigError  # noqa: E402

PAIRS = ("gpt", "gpt_bpe", "lstm", "gru")
QUICK_PAIRS = ("gpt", "lstm", "gru")  # the fixture corpus has no GPT-2 tokenizer
# pair -> the module that runs it and writes its own report (its main(argv)).
DELEGATED = {"nnlm": "benchmarks.quality_nnlm", "translate": "benchmarks.quality_translate",
             "bert": "benchmarks.quality_bert", "bert_finetune": "benchmarks.quality_bert_finetune",
             "word2vec": "benchmarks.quality_word2vec"}

NOTES = [
    "zoo runs its job's own code: the config's task and loss, "
    "zoo.train.optim.make_optimizer(config.optim) and zoo.train.loop's jitted train step.",
    "The peers' AdamW groups: decay on every parameter with dim >= 2 (embeddings included, "
    "biases and LayerNorm not), zoo.train.optim.decay_mask's split by name.",
    "The learning rate is zoo's schedule on both sides: linear warm-up from 0 at step 0 "
    "(nanoGPT starts its warm-up at lr / (warmup + 1)), then cosine to end_learning_rate.",
    "RNN LMs: neither side carries the state from one window to the next (zoo's train step is "
    "stateless), so the perplexities are those of 35-token contexts at most.",
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default="", help="corpus directory (shakespeare/, brown/)")
    parser.add_argument("--quick", action="store_true",
                        help="reduced recipes, one seed, a fixture corpus unless --corpus")
    parser.add_argument("--pairs", default="",
                        help=f"of {PAIRS + tuple(DELEGATED)}; default all (--quick: {QUICK_PAIRS})")
    parser.add_argument("--seeds", default="", help="comma-separated; default 0,1 (quick: 0)")
    parser.add_argument("--merge", default="",
                        help="comma-separated result directories to join into --out")
    parser.add_argument("--out", default="", help="results directory; default "
                        "benchmarks/results/<machine> (quick: a new temporary directory)")
    return parser.parse_args(argv)


def merge(directories: list[str], out: str) -> list[str]:
    """One report from the quality.jsonl files of `directories` (header: the first one's, with
    every run's mode, commit, start and wall time)."""
    headers, records = [], []
    for directory in directories:
        path = os.path.join(directory, "quality.jsonl")
        if not os.path.exists(path):  # a run cut short: its progress files
            partial = sorted(glob.glob(os.path.join(directory, "quality_partial_*.json")))
            if not partial:
                raise ConfigError(f"--merge: {directory} has no quality.jsonl and no "
                                  "quality_partial_*.json")
            for name in partial:
                with open(name) as f:
                    record = json.load(f)
                headers.append(record.pop("header"))
                records.append(record)
            continue
        with open(path) as f:
            lines = [json.loads(line) for line in f]
        headers.append(lines[0])
        records += [{k: v for k, v in r.items() if k != "summary"} for r in lines[1:]]
    header = {k: v for k, v in headers[0].items() if k != "record"}
    commits = sorted({h["zoo_commit"] for h in headers})
    header.update(zoo_commit=", ".join(commits), started=min(h["started"] for h in headers),
                  wall_s=max(h["wall_s"] for h in headers),
                  seeds=sorted({s for h in headers for s in h["seeds"]}),
                  merged_from=[{k: h[k] for k in ("started", "wall_s", "zoo_commit", "mode")}
                               for h in headers])
    return quality_report.write(machine.results_dir(out or None), header, records)


def run(args) -> list[str]:
    if args.merge:
        return merge([d for d in args.merge.split(",") if d], args.out)
    default = QUICK_PAIRS if args.quick else PAIRS + tuple(DELEGATED)
    pairs = [p for p in (args.pairs or ",".join(default)).split(",") if p]
    unknown = sorted(set(pairs) - set(PAIRS) - set(DELEGATED))
    if unknown:
        raise ConfigError(f"--pairs: unknown {unknown}; choose from {PAIRS + tuple(DELEGATED)}")
    seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1")).split(",")]
    reason = peers.unavailable_reason(jax.devices()[0].platform)
    if reason:
        raise ConfigError(f"benchmarks.quality needs its PyTorch peers: {reason}")
    corpus_dir = args.corpus
    if args.quick and not corpus_dir:
        corpus_dir = quality_data.write_fixture_corpus(tempfile.mkdtemp(prefix="quality_corpus_"))
    if not corpus_dir:
        raise ConfigError("--corpus DIR is required (or --quick for the fixture corpus)")
    out = args.out or (tempfile.mkdtemp(prefix="quality_") if args.quick else "")
    directory = machine.results_dir(out or None)
    torch_info = peers.setup_torch("cpu")
    started, start = datetime.datetime.now(datetime.timezone.utc), time.perf_counter()
    header = dict(machine=machine.machine_name(), zoo_commit=machine.zoo_commit(),
                  jax=jax.__version__, torch=torch_info["torch"],
                  transformers=torch_info["transformers"], threads=torch_info["torch_threads"],
                  mode="quick" if args.quick else "full", corpus=corpus_dir,
                  started=started.strftime("%Y-%m-%d %H:%M UTC"), seeds=seeds, notes=NOTES)
    log = lambda line: print(line, flush=True)  # noqa: E731

    def progress(record):
        """The run so far as quality_partial_<pair>_<seed>.json (its metric: the curve's)."""
        record = json.loads(json.dumps(record))  # a copy, tuples as lists
        for side in record["sides"].values():
            side["final"] = dict(side["curve"][-1][1])
        record.update(partial=True, metric=next(iter(side["final"])),
                      header=dict(header, wall_s=time.perf_counter() - start))
        path = os.path.join(directory, f"quality_partial_{record['pair']}_{record['seed']}.json")
        with open(path, "w") as f:
            json.dump(record, f)

    records = []
    for pair, load in (("gpt", quality_data.load_shakespeare),
                       ("gpt_bpe", quality_data.load_shakespeare_gpt2)):
        if pair not in pairs:
            continue
        corpus = load(corpus_dir)
        recipe = quality_gpt.QUICK if args.quick else quality_gpt.FULL
        for seed in seeds:
            log(f"{corpus.pair} seed {seed}: {corpus.vocab_size:,} ids, "
                f"{len(corpus.train):,} train / {len(corpus.val):,} val tokens")
            records.append(quality_gpt.run(corpus, recipe, seed, log, progress))
    cells = [p for p in pairs if p in ("lstm", "gru")]
    if cells:
        words = quality_data.load_brown(corpus_dir)
        recipe = quality_rnn.QUICK if args.quick else quality_rnn.FULL
        for cell in cells:
            for seed in seeds:
                log(f"{cell}-word-brown seed {seed}: {words.vocab_size:,} words, "
                    + ", ".join(f"{k} {len(v):,}" for k, v in words.splits.items()))
                records.append(quality_rnn.run(words, cell, recipe, seed, log, progress))
    other_reports = []
    for pair in [p for p in pairs if p in DELEGATED]:
        log(f"{pair}: python -m {DELEGATED[pair]}")
        # --quick without --corpus: each module writes the fixture its pair reads.
        argv = (["--corpus", args.corpus] if args.corpus else []) + ["--out", directory]
        argv += ["--quick"] if args.quick else []
        if args.seeds:
            argv += ["--seeds", args.seeds]
        if importlib.import_module(DELEGATED[pair]).main(argv) != 0:
            raise ConfigError(f"--pairs {pair}: python -m {DELEGATED[pair]} "
                              f"{' '.join(argv)} failed (its error is above)")
        if os.path.exists(os.path.join(directory, f"quality_{pair}.md")):
            other_reports.append(f"quality_{pair}.md")
    if not records:  # only delegated pairs: quality.md (the LM pairs' report) stays as it is
        paths = [os.path.join(directory, name) for name in other_reports]
        log("wrote " + ", ".join(paths))
        return paths
    header.update(wall_s=time.perf_counter() - start, other_reports=other_reports)
    paths = quality_report.write(directory, header, records)
    for name in glob.glob(os.path.join(directory, "quality_partial_*.json")):
        os.remove(name)  # the finished records replace them
    for s in map(quality_report.summarize, records):
        log(f"{s['pair']} seed {s['seed']}: zoo - peer loss {s['loss_gap']:+.4f}, perplexity "
            f"zoo/peer {s['perplexity_ratio']:.3f}, step zoo/peer {s['step_ratio']:.2f}")
    log("wrote " + ", ".join(paths))
    return paths


def main(argv=None) -> int:
    return cli.exit_status(lambda: run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
