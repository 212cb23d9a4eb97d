"""Feed rate: examples/s the train iterators supply on this host, beside the examples/s BERT-base
consumes on a named accelerator host at a given MFU.

    python -m benchmarks.data                 # this machine: 0..cpu_count workers, ~10 s each
    python -m benchmarks.data --quick         # seconds: a small corpus, 0 and 1 workers
    python -m benchmarks.data --workers 0,4,8 --accelerator "TPU v5p" --chips 4

Supply (one stage per input pipeline, each measured with 0 = threads in this process and 1..N
grain worker processes, zoo.data.pipelines.batching.iterate):
  pretraining_static   zoo.data.pipelines.pretraining.batches.train_iterator over a cache made by
                       zoo.data.pipelines.pretraining.prepare (masks stored on disk)
  pretraining_dynamic  the same with dynamic_masking (masks drawn per batch)
  squad                zoo.tasks.squad.SquadTask's train_batches (featurized windows in memory)
The corpus (benchmarks.data_corpus) is the synthetic world (zoo.data.synthetic), tokenized by a
WordPiece vocabulary of BERT's size (30,522: the corpus's words and characters, padded with
[unused] entries), so random replacements are drawn from a BERT-sized vocabulary. The first batch
of each iterator (worker start-up) is not timed; then batches are drawn for --seconds.

Demand: peak FLOP/s of --chips x --accelerator (zoo.train.metrics.peak_flops, the table MFU is
reported against) x --mfu / (zoo.models.bert.flops_per_token(BERT-base) x seq_len): sequences
per second the model eats. ratio = supply / demand; per_cpu = supply / os.cpu_count(), and
per_cpu x --host-cpus (a TPU v4 VM host has 240) projects one host's supply.

Preparation (stage 'prepare', benchmarks.data_prepare): MB of text per second turned into
pretraining shards by 1..N worker processes, and peak memory at 1x and 8x the corpus; stage
'tokenize': WordPiece alone, zoo's beside Hugging Face's `tokenizers` on the same text.

STAGES maps a stage name to a function (args, progress) -> records.

Outputs in benchmarks.machine.results_dir(--out): data.jsonl (every measurement), data.md
(table), data.png (examples/s vs workers with the demand lines).
"""

import argparse
import json
import os
import tempfile
import time
import types
from collections.abc import Callable

from benchmarks import data_bucket, data_prepare, machine
from benchmarks.data_corpus import VOCAB_SIZE, bert_sized_vocab, documents
# vCPUs of one TPU VM host (v4: 240), what the per-CPU rate is projected onto.
HOST_CPUS = {"TPU v4": 240, "TPU v5p": 208, "TPU v5 lite": 224, "TPU v6 lite": 180}


# ---------------------------------------------------------------------------------------------
# Demand.


def demand(accelerator: str, chips: int, mfu: float, seq_len: int,
           predictions: int) -> dict[str, float]:
    """Sequences/s that BERT-base consumes at `mfu` of `chips` x `accelerator`'s peak."""
    from zoo.models import bert
    from zoo.train import metrics

    peak = metrics.peak_flops([types.SimpleNamespace(device_kind=accelerator)] * chips)
    if peak is None:
        raise SystemExit(f"--accelerator {accelerator!r} is not in zoo.train.metrics' peak "
                         "table; name one of its kinds, e.g. 'TPU v4'")
    config = bert.config_for_size("base", vocab_size=VOCAB_SIZE)
    flops = bert.flops_per_token(config, seq_len, predictions)
    return {"peak_flops": peak, "flops_per_token": flops,
            "examples_per_s": peak * mfu / (flops * seq_len)}


# ---------------------------------------------------------------------------------------------
# Supply.


def _rate(make_iterator: Callable[[int], object], workers: int, batch_size: int,
          seconds: float) -> dict[str, float]:
    it = make_iterator(workers)
    start = time.perf_counter()
    next(it)  # worker start-up and the first batch: not the steady rate
    first_s = time.perf_counter() - start
    batches, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or batches < 3:
        next(it)
        batches += 1
    close = getattr(it, "close", None)
    if close:
        close()  # stop worker processes before the next measurement starts its own
    return {"examples_per_s": batches * batch_size / elapsed, "batches": batches,
            "seconds": elapsed, "first_batch_s": first_s}


def _sweep(stage: str, make_iterator, args, progress, **fields) -> list[dict]:
    records = []
    for workers in args.worker_counts:
        rec = dict(stage=stage, workers=workers, batch_size=args.batch_size, **fields,
                   **_rate(make_iterator, workers, args.batch_size, args.seconds))
        progress(rec)
        records.append(rec)
    return records


def _pretraining(dynamic: bool):
    def stage(args, progress) -> list[dict]:
        from zoo.data.pipelines import pretraining
        from zoo.data.pipelines.pretraining import batches as pretraining_batches
        from zoo.data.pipelines.pretraining import examples as pretraining_examples
        from zoo.data.tokenizers.wordpiece import WordPieceTokenizer

        docs = documents(args.entities)
        tokenizer = WordPieceTokenizer(bert_sized_vocab(s for d in docs for s in d))
        settings = pretraining_examples.Settings(
            max_seq_length=args.seq_len, max_predictions_per_seq=args.predictions,
            dupe_factor=args.dupe_factor, dynamic_masking=dynamic)
        source = pretraining.prepare(docs, tokenizer, args.cache_dir, "train", settings,
                                     num_shards=2)
        return _sweep(
            f"pretraining_{'dynamic' if dynamic else 'static'}",
            lambda w: pretraining_batches.train_iterator(source, args.batch_size, seed=0,
                                                         num_workers=w),
            args, progress, seq_len=args.seq_len, examples=len(source))
    return stage


def _squad(args, progress) -> list[dict]:
    from configs import squad as squad_config
    from zoo.tasks.squad import SquadTask

    config = squad_config.get_config("size=base")
    docs = documents(args.entities)
    vocab_file = os.path.join(args.cache_dir, "vocab.txt")
    with open(vocab_file, "w") as f:
        f.write("\n".join(bert_sized_vocab(s for d in docs for s in d)) + "\n")
    config.data.update(tokenizer=vocab_file, cache_dir=args.cache_dir,
                       synthetic_entities=args.entities, batch_size=args.batch_size)
    task = SquadTask(config, args.cache_dir)

    def make(workers):
        config.data.num_workers = workers
        return task.train_batches(0, 1)

    return _sweep("squad", make, args, progress, seq_len=config.data.seq_len,
                  examples=len(task.train_rows["input_ids"]))


STAGES: dict[str, Callable] = {
    "pretraining_static": _pretraining(dynamic=False),
    "pretraining_dynamic": _pretraining(dynamic=True),
    "squad": _squad,
    "prepare": data_prepare.stage,  # MB/s of preparation and its memory (not examples/s)
    "tokenize": data_prepare.tokenize_stage,  # WordPiece alone: zoo's and Hugging Face's
    "bucket": data_bucket.stage,  # the train iterator from a gs:// bucket vs from local disk
}
_OWN_TABLES = ("prepare", "tokenize", "bucket")  # stages with a table of their own


# ---------------------------------------------------------------------------------------------
# Report.


def _table(records: list[dict], need: dict, args) -> str:
    lines = [
        f"# Feed rate on {machine.machine_name()} ({os.cpu_count()} CPUs)", "",
        f"Demand: BERT-base seq {args.seq_len} at {args.mfu:.0%} MFU on {args.chips} x "
        f"{args.accelerator} ({need['peak_flops'] / 1e12:,.0f} TFLOP/s peak, "
        f"{need['flops_per_token'] / 1e9:.3f} GFLOP/token): "
        f"**{need['examples_per_s']:,.0f} examples/s**; goal 2x = "
        f"{2 * need['examples_per_s']:,.0f}. Projection: per-CPU rate x {args.host_cpus} "
        f"host CPUs.", "",
        "| stage | workers | examples/s | / demand | per CPU | x host CPUs | first batch s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        if r["stage"] in _OWN_TABLES:
            continue
        lines.append(
            f"| {r['stage']} | {r['workers']} | {r['examples_per_s']:,.0f} | "
            f"{r['ratio']:.2f} | {r['per_cpu']:,.0f} | {r['projected_host']:,.0f} | "
            f"{r['first_batch_s']:.2f} |")
    prepared = [r for r in records if r["stage"] == "prepare"]
    tokenized = [r for r in records if r["stage"] == "tokenize"]
    bucket = [r for r in records if r["stage"] == "bucket"]
    return ("\n".join(lines) + "\n" + (data_prepare.table(prepared) if prepared else "")
            + (data_prepare.tokenize_table(tokenized) if tokenized else "")
            + (data_bucket.table(bucket, need, args.host_cpus) if bucket else ""))


def _plot(records: list[dict], need: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for stage in dict.fromkeys(r["stage"] for r in records if r["stage"] not in _OWN_TABLES):
        rs = [r for r in records if r["stage"] == stage]
        ax.plot([r["workers"] for r in rs], [r["examples_per_s"] for r in rs], "o-",
                label=stage)
    for r in records:  # at 0 workers: the train iterator's threads, per simulated host
        if r["stage"] == "bucket":
            where = f"gs:// {r['latency_ms']} ms" if r["read_from"] == "bucket" else "local"
            ax.plot([0], [r["examples_per_s"]], "s^"[r["hosts"] > 1],
                    label=f"bucket stage: {where}, {r['hosts']} host(s), per host")
    ax.axhline(need["examples_per_s"], color="k", ls="--", label="demand (BERT-base seq 128)")
    ax.axhline(2 * need["examples_per_s"], color="k", ls=":", label="goal: 2x demand")
    ax.set_xlabel("grain worker processes (0 = threads in the training process)")
    ax.set_ylabel("examples / s")
    ax.set_title(f"Train iterator supply on {machine.machine_name()}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="a small corpus, 0 and 1 workers, a fraction of a second each")
    parser.add_argument("--stages", default=",".join(STAGES),
                        help=f"comma-separated, of {list(STAGES)}")
    parser.add_argument("--workers", help="comma-separated worker counts (default 0..cpus)")
    parser.add_argument("--seconds", type=float, help="timed seconds per measurement")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--predictions", type=int, default=20)
    parser.add_argument("--accelerator", default="TPU v4")
    parser.add_argument("--chips", type=int, default=4, help="chips per host")
    parser.add_argument("--mfu", type=float, default=0.5)
    parser.add_argument("--host-cpus", type=int,
                        help="CPUs of the accelerator host (default: its TPU VM's)")
    parser.add_argument("--latency-ms", type=int, default=30,
                        help="stage bucket: the test bucket's delay per request")
    parser.add_argument("--run-rows", type=int,
                        help="stage bucket: rows per ranged read (default: "
                             "config.data.read_run_rows)")
    parser.add_argument("--read-ahead-mb", type=float,
                        help="stage bucket: default config.data.read_ahead_mb")
    parser.add_argument("--out", help="results directory (default benchmarks/results/<machine>)")
    args = parser.parse_args(argv)
    unknown = set(args.stages.split(",")) - set(STAGES)
    if unknown:
        parser.error(f"--stages: unknown {sorted(unknown)}; known {list(STAGES)}")
    args.stages = args.stages.split(",")
    default_workers = "0,1" if args.quick else ",".join(map(str, range(os.cpu_count() + 1)))
    args.worker_counts = [int(w) for w in (args.workers or default_workers).split(",")]
    args.seconds = args.seconds or (0.3 if args.quick else 10.0)
    if args.quick:
        args.batch_size = min(args.batch_size, 32)
    # Corpus size: ~0.8 documents per entity; static masks need dupe_factor passes on disk.
    args.entities, args.dupe_factor = (150, 1) if args.quick else (2000, 5)
    # Preparation: a corpus of ~0.25 MB (quick) or ~3.8 MB (1x; 8x ~30 MB), shards of shard_mb.
    args.prepare_entities, args.shard_mb = (1000, 0.1) if args.quick else (20000, 4.0)
    from configs import bert_pretrain
    from zoo.data.pipelines.pretraining import run_order

    pretrain_data = bert_pretrain.get_config("size=base").data
    args.run_rows = args.run_rows or run_order.resolve_run_rows(pretrain_data.read_run_rows,
                                                                args.batch_size)
    args.read_ahead_mb = (pretrain_data.read_ahead_mb if args.read_ahead_mb is None
                          else args.read_ahead_mb)
    args.host_cpus = args.host_cpus or HOST_CPUS.get(args.accelerator, os.cpu_count())
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    out = machine.results_dir(args.out)
    need = demand(args.accelerator, args.chips, args.mfu, args.seq_len, args.predictions)
    print(f"demand: {need['examples_per_s']:.1f} examples/s (BERT-base seq {args.seq_len}, "
          f"{args.mfu:.0%} MFU of {args.chips} x {args.accelerator})", flush=True)
    cpus = os.cpu_count()

    def progress(rec: dict) -> None:
        if rec["stage"] == "prepare":
            print(f"prepare {rec['corpus']} ({rec['corpus_mb']:.1f} MB) workers={rec['workers']:<2}"
                  f" {rec['mb_per_s']:.3f} MB/s  {rec['seconds']:.1f} s  peak RSS "
                  f"{rec['rss_mb']:.0f} MB", flush=True)
            return
        if rec["stage"] == "tokenize":
            hf = (f"Hugging Face {rec['corpus_mb'] / rec['hf_s']:.2f} MB/s (same ids: "
                  f"{rec['same_ids']})" if rec["hf_s"] else f"Hugging Face {rec['hf_skipped']}")
            print(f"tokenize {rec['corpus']} ({rec['corpus_mb']:.1f} MB): zoo cold "
                  f"{rec['corpus_mb'] / rec['zoo_cold_s']:.2f} MB/s, warm "
                  f"{rec['corpus_mb'] / rec['zoo_warm_s']:.2f} MB/s; {hf}", flush=True)
            return
        rec.update(ratio=rec["examples_per_s"] / need["examples_per_s"],
                   per_cpu=rec["examples_per_s"] / cpus)
        rec["projected_host"] = rec["per_cpu"] * args.host_cpus
        if rec["stage"] == "bucket":
            print(data_bucket.describe(rec), flush=True)
            return
        print(f"{rec['stage']:<20} workers={rec['workers']:<2} "
              f"{rec['examples_per_s']:>10.1f} examples/s  ratio={rec['ratio']:.3f}  "
              f"per_cpu={rec['per_cpu']:.1f}  (first batch {rec['first_batch_s']:.2f} s)",
              flush=True)

    records = []
    with tempfile.TemporaryDirectory() as cache_dir:
        args.cache_dir = cache_dir
        for name in args.stages:
            records += STAGES[name](args, progress)
    head = dict(kind="run", machine=machine.machine_name(), cpus=cpus, accelerator=args.accelerator,
                chips=args.chips, mfu=args.mfu, seq_len=args.seq_len,
                host_cpus=args.host_cpus, quick=args.quick, demand=need)
    with open(os.path.join(out, "data.jsonl"), "w") as f:
        for rec in [head, *records]:
            f.write(json.dumps(rec) + "\n")
    with open(os.path.join(out, "data.md"), "w") as f:
        f.write(_table(records, need, args))
    _plot(records, need, os.path.join(out, "data.png"))
    print(f"wrote {out}/data.{{jsonl,md,png}}", flush=True)
    return records


if __name__ == "__main__":
    main()
