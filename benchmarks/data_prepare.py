"""The 'prepare' stage of benchmarks.data: MB of text per second that preparation
(zoo.data.pipelines.pretraining.prepare_pieces) turns into BERT pretraining shards with 1..N
worker processes, and its peak memory at 1x and 8x the corpus (it streams: memory must not grow
with the corpus).

The corpus is the synthetic world written as BERT-format text (1x) and that text 8 times over
(8x), tokenized by benchmarks.data_corpus's BERT-sized WordPiece vocabulary, with BERT-base phase
1's settings (seq 128, 20 predictions, dupe_factor 5, static masks: what configs/bert_pretrain.py
prepares). Every measurement is a fresh child process (`--child`), so its peak RSS is its own:
`rss_mb` is the largest of the child and its worker processes (getrusage).

The 'tokenize' stage (`tokenize_stage`) times WordPiece alone on the 1x corpus in one thread
(what a preparation worker has): zoo's tokenizer cold (a fresh instance) and warm (its cache of
chunks filled, as in a worker's later shards), beside Hugging Face's `tokenizers` (Rust) with
the same rules (BertNormalizer, BertPreTokenizer, WordPiece: the tests' reference), whose ids
must be zoo's.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _write_corpus(args) -> dict[str, str]:
    """1x and 8x BERT-format text files and a vocab.txt in args.cache_dir (written once)."""
    from benchmarks.data_corpus import bert_sized_vocab, documents
    from zoo.data.readers import text_files

    paths = {"vocab": os.path.join(args.cache_dir, "prepare-vocab.txt"),
             "1x": os.path.join(args.cache_dir, "corpus-1x.txt"),
             "8x": os.path.join(args.cache_dir, "corpus-8x.txt")}
    if all(os.path.exists(p) for p in paths.values()):
        return paths
    docs = documents(args.prepare_entities)
    with open(paths["vocab"], "w", encoding="utf-8") as f:
        f.write("\n".join(bert_sized_vocab(s for d in docs for s in d)) + "\n")
    text_files.write_text_corpus(paths["1x"], docs)
    with open(paths["1x"], "rb") as f:
        text = f.read()
    with open(paths["8x"], "wb") as f:
        for _ in range(8):
            f.write(text + b"\n")
    return paths


def _measure(corpus: str, vocab: str, workers: int, shard_mb: float, out: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.data_prepare", "--child", corpus, vocab,
         str(workers), str(shard_mb), out],
        cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"preparation of {corpus} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def stage(args, progress) -> list[dict]:
    paths = _write_corpus(args)
    sizes = {k: os.path.getsize(paths[k]) / 1e6 for k in ("1x", "8x")}
    records = []

    def run(corpus: str, workers: int) -> dict:
        out = os.path.join(args.cache_dir, f"prepared-{corpus}-{workers}")
        rec = dict(stage="prepare", corpus=corpus, corpus_mb=sizes[corpus], workers=workers,
                   shard_mb=args.shard_mb,
                   **_measure(paths[corpus], paths["vocab"], workers, args.shard_mb, out))
        rec["mb_per_s"] = rec["corpus_mb"] / rec["seconds"]
        progress(rec)
        records.append(rec)
        return rec

    for workers in [w for w in args.worker_counts if w > 0] or [1]:
        run("8x", workers)
    run("1x", 1)  # beside 8x with 1 worker: memory must not grow with the corpus
    one = next(r for r in records if r["corpus"] == "8x" and r["workers"] == 1)
    for r in records:
        r["speedup_vs_1_worker"] = one["seconds"] / r["seconds"] if r["corpus"] == "8x" else None
    return records


def tokenize_stage(args, progress) -> list[dict]:
    paths = _write_corpus(args)
    # One thread, as a preparation worker has one core: HF's batch encoding would otherwise
    # spread over every core of the machine.
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", RAYON_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.data_prepare", "--tokenize", paths["1x"],
         paths["vocab"]], cwd=ROOT, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise SystemExit(f"tokenizing {paths['1x']} failed:\n{done.stderr[-3000:]}")
    rec = dict(stage="tokenize", corpus="1x", **json.loads(done.stdout.strip().splitlines()[-1]))
    progress(rec)
    return [rec]


def tokenize_table(records: list[dict]) -> str:
    lines = ["", "## Tokenizing (WordPiece alone, one thread, the 1x corpus)", "",
             "| tokenizer | seconds | MB/s |", "|---|---:|---:|"]
    for r in records:
        rows = [("zoo, cold (a new instance)", r["zoo_cold_s"]),
                ("zoo, warm (its cache of chunks filled)", r["zoo_warm_s"])]
        rows.append(("Hugging Face tokenizers (Rust WordPiece, the same rules)", r["hf_s"])
                    if r["hf_s"] is not None else None)
        for name, seconds in filter(None, rows):
            lines.append(f"| {name} | {seconds:.2f} | {r['corpus_mb'] / seconds:.2f} |")
        lines += ["", f"{r['corpus_mb']:.1f} MB of text, {r['sentences']:,} sentences. "
                  + (f"Hugging Face's ids equal zoo's: {'yes' if r['same_ids'] else 'NO'}."
                     if r["hf_s"] is not None else f"Hugging Face: {r['hf_skipped']}")]
    return "\n".join(lines) + "\n"


def _tokenize_child(corpus: str, vocab: str) -> None:
    from zoo.data.tokenizers.wordpiece import WordPieceTokenizer

    with open(corpus, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    rec = {"corpus_mb": sum(len(line.encode("utf-8")) for line in lines) / 1e6,
           "sentences": len(lines)}
    ours = WordPieceTokenizer.from_vocab_file(vocab)
    for key in ("zoo_cold_s", "zoo_warm_s"):
        start = time.perf_counter()
        ids, _ = ours.encode_flat(lines)
        rec[key] = time.perf_counter() - start
    try:
        import tokenizers as hf
    except ImportError:
        rec.update(hf_s=None, same_ids=None, hf_skipped="not installed (the parity extra)")
    else:
        theirs = hf.Tokenizer(hf.models.WordPiece.from_file(vocab, unk_token="[UNK]"))
        theirs.normalizer = hf.normalizers.BertNormalizer(lowercase=True)
        theirs.pre_tokenizer = hf.pre_tokenizers.BertPreTokenizer()
        start = time.perf_counter()
        encoded = theirs.encode_batch(lines, add_special_tokens=False)
        rec["hf_s"] = time.perf_counter() - start
        rec["same_ids"] = [i for e in encoded for i in e.ids] == ids.tolist()
    print(json.dumps(rec))


def table(records: list[dict]) -> str:
    lines = ["", "## Preparation (BERT-base phase 1 settings, WordPiece, static masks x5)", "",
             "| corpus | MB of text | workers | seconds | MB/s | speed-up vs 1 worker | "
             "peak RSS MB |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        speedup = f"{r['speedup_vs_1_worker']:.2f}" if r["speedup_vs_1_worker"] else ""
        lines.append(f"| {r['corpus']} | {r['corpus_mb']:.1f} | {r['workers']} | "
                     f"{r['seconds']:.1f} | {r['mb_per_s']:.2f} | {speedup} | "
                     f"{r['rss_mb']:.0f} |")
    one = {r["corpus"]: r["rss_mb"] for r in records if r["workers"] == 1}
    if len(one) == 2:
        lines += ["", f"Peak memory at 8x the corpus / at 1x (1 worker): "
                      f"{one['8x'] / one['1x']:.2f}"]
    return "\n".join(lines) + "\n"


def _child(corpus: str, vocab: str, workers: int, shard_mb: float, out: str) -> None:
    from zoo.data.pipelines import pretraining
    from zoo.data.pipelines.pretraining.examples import Settings
    from zoo.data.readers import corpus_pieces
    from zoo.data.tokenizers.wordpiece import WordPieceTokenizer

    tokenizer = WordPieceTokenizer.from_vocab_file(vocab)
    settings = Settings(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=5)
    start = time.perf_counter()
    pieces = corpus_pieces.plan_text([corpus], int(shard_mb * 2**20))
    source = pretraining.prepare_pieces(pieces, tokenizer, out, settings, workers=workers)
    seconds = time.perf_counter() - start
    # ru_maxrss is in KiB on Linux; RUSAGE_CHILDREN covers the (waited-for) worker processes.
    rss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
              resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
    print(json.dumps({"seconds": seconds, "rss_mb": rss, "shards": len(pieces),
                      "examples": len(source)}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", nargs=5, metavar=("CORPUS", "VOCAB", "WORKERS", "SHARD_MB",
                                                      "OUT"))
    parser.add_argument("--tokenize", nargs=2, metavar=("CORPUS", "VOCAB"))
    parsed = parser.parse_args()
    if parsed.tokenize:
        _tokenize_child(*parsed.tokenize)
    else:
        c = parsed.child
        _child(c[0], c[1], int(c[2]), float(c[3]), c[4])
