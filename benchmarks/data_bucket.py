"""The 'bucket' stage of benchmarks.data: the pretraining train iterator reading prepared data
where it lies in a bucket that behaves like one (every request waits --latency-ms, 30 ms by
default: what a VM sees from GCS), beside the same directory read from local disk.

A phase-1-like directory (seq 128, 20 predictions, static masks x dupe_factor: what
configs/bert_pretrain.py prepares for BERT-base, on benchmarks.data's synthetic corpus and
BERT-sized vocabulary, 4 shards) is prepared on local disk and uploaded to a GCS-API server the
stage starts on 127.0.0.1 (tests/gcs_server.py: gcp-storage-emulator with per-request latency
and a JSON-lines request log). The server is the test double the test suite uses, imported from
tests/ (a checkout's directory, as benchmarks/ is): benchmarks run from a checkout, zoo itself
does not depend on it, and the figures are measured against the server the acceptance tests
check the same reads on.

Then zoo.data.pipelines.pretraining.batches.train_iterator (threads in this process, run_rows =
config.data.read_run_rows, read_ahead_mb = config.data.read_ahead_mb) reads it as 1 and as 4
simulated hosts (process_index / process_count; the hosts run one after another, each alone on
this box), from the bucket and from local disk. Per host:
  first_batch_s     opening the directory (manifest, shard headers) to the first batch
  examples_per_s    that host's examples over two epochs of steps after the first batch
  epoch bytes / GETs from the server's request log, over the second epoch of steps (the read-ahead
                    runs ahead at both ends of the window, so it counts one epoch's reads in
                    steady state), scaled to one epoch of the directory; its share is the
                    directory's record bytes / hosts (goal: <= 1.1 x the share)
  open GETs         requests made to open the directory
  peak_disk_bytes   the most bytes under a fresh HOME / TMPDIR (tempfile's directory too) while
                    the host reads, sampled every 20 ms: a mirror of the data would show here.
                    From local disk the directory itself is on disk: its size is reported.
"""

import os
import re
import tempfile
import threading
import time

from zoo.data.pipelines.pretraining.free_space import bytes_under

HOST_COUNTS = (1, 4)


class _DiskPeak:
    """HOME, TMPDIR and tempfile's directory pointed at an empty directory; the most bytes it
    held while inside, sampled on a thread."""

    def __init__(self):
        self.peak = 0

    def __enter__(self):
        self.root = tempfile.mkdtemp(prefix="bench-host-")
        self._saved = ({k: os.environ.get(k) for k in ("HOME", "TMPDIR")}, tempfile.tempdir)
        os.environ.update(HOME=self.root, TMPDIR=self.root)
        tempfile.tempdir = self.root
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, bytes_under(self.root))

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, bytes_under(self.root))
        env, tempfile.tempdir = self._saved
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        import shutil

        shutil.rmtree(self.root, ignore_errors=True)


def _settled(server) -> int:
    """The request log's position once no request has come in for 0.2 s: the read-ahead
    threads of the host just measured have finished their last fetches (so they neither fall
    into the next host's count nor meet a stopped server)."""
    mark = server.mark()
    while True:
        time.sleep(0.2)
        now = server.mark()
        if now == mark:
            return now
        mark = now


def _data_offsets(local_dir: str, shards: int) -> list[int]:
    """Where each shard file's records start (after its .npy header)."""
    import numpy as np

    from zoo.data.pipelines.pretraining import store as pretraining_store

    offsets = []
    for shard in range(shards):
        with open(os.path.join(local_dir, pretraining_store.shard_file(shard)), "rb") as f:
            version = np.lib.format.read_magic(f)
            (np.lib.format.read_array_header_1_0 if version == (1, 0)
             else np.lib.format.read_array_header_2_0)(f)
            offsets.append(f.tell())
    return offsets


def _account(requests: list[dict], wanted: list[tuple[int, int, int]], offsets: list[int],
             itemsize: int) -> dict:
    """Sorts a host's logged requests into the row reads of the steps it consumed (`wanted`:
    (shard, lo, hi) spans, a multiset), reads ahead past its last step, and the rest (opening:
    manifest, listing, shard headers, word_starts)."""
    from collections import Counter

    left = Counter(wanted)
    out = dict(rows_requests=0, rows_bytes=0, ahead_requests=0, ahead_bytes=0,
               open_requests=0, open_bytes=0)
    for r in requests:
        match = re.fullmatch(r".*/examples-(\d+)\.npy", r.get("object") or "")
        rng = re.fullmatch(r"bytes=(\d+)-(\d+)", r.get("range") or "")
        kind = "open"
        if match and rng and r["op"] == "read":
            shard, first = int(match.group(1)), int(rng.group(1))
            if first >= offsets[shard]:  # not the header
                lo = (first - offsets[shard]) // itemsize
                hi = (int(rng.group(2)) + 1 - offsets[shard]) // itemsize
                kind = "ahead"
                if left[(shard, lo, hi)] > 0:
                    left[(shard, lo, hi)] -= 1
                    kind = "rows"
        out[f"{kind}_requests"] += 1
        out[f"{kind}_bytes"] += r["bytes"] or 0
    out["missing_spans"] = sum(left.values())  # consumed rows the log saw no read for
    return out


def _host(path: str, server, hosts: int, index: int, args, offsets) -> dict:
    from zoo.data.pipelines.pretraining import batches as pretraining_batches
    from zoo.data.pipelines.pretraining import store as pretraining_store
    from zoo.data.pipelines.pretraining import run_order

    remote = server is not None
    mark = _settled(server) if remote else 0
    local = args.batch_size // hosts
    with _DiskPeak() as disk:
        start = time.perf_counter()
        source = pretraining_store.PretrainingSource(path)
        it = pretraining_batches.train_iterator(
            source, args.batch_size, seed=0, process_index=index, process_count=hosts,
            num_workers=0, run_rows=args.run_rows, read_ahead_mb=args.read_ahead_mb)
        next(it)
        first = time.perf_counter() - start
        steps = len(source) // args.batch_size  # global batches in one epoch of the directory
        start = time.perf_counter()
        for _ in range(2 * steps):
            next(it)
        elapsed = time.perf_counter() - start
        del it
        end = _settled(server) if remote else 0
    rec = dict(host=index, examples_per_s=2 * steps * local / elapsed, first_batch_s=first,
               peak_disk_bytes=disk.peak, steps_per_epoch=steps,
               share_bytes=len(source) * source.dtype.itemsize / hosts)
    if remote:
        # The spans this host read: its rows of global batches 0..2 * steps (the first too).
        order = run_order.RunOrder(source.shard_rows, args.run_rows, 0)
        wanted = [span[:3] for step in range(2 * steps + 1)
                  for span in order.spans(step * args.batch_size + index * local,
                                          step * args.batch_size + (index + 1) * local)]
        acc = _account([r for r in server.requests(mark) if r["seq"] <= end], wanted,
                       offsets, source.dtype.itemsize)
        # Rows read per epoch of the directory (the consumed steps scaled to one epoch), plus
        # opening once: what a host reads per epoch, counted high for a run of one epoch.
        scale = len(source) / ((2 * steps + 1) * args.batch_size)
        rec.update(acc, epoch_bytes=acc["rows_bytes"] * scale + acc["open_bytes"],
                   epoch_requests=acc["rows_requests"] * scale + acc["open_requests"])
        rec["bytes_over_share"] = rec["epoch_bytes"] / rec["share_bytes"]
        rec["row_bytes_over_share"] = acc["rows_bytes"] * scale / rec["share_bytes"]
    return rec


def _summary(where: str, hosts: int, per_host: list[dict], args, extra: dict) -> dict:
    def most(key):
        return max(h[key] for h in per_host) if key in per_host[0] else None

    rates = [h["examples_per_s"] for h in per_host]
    return dict(stage="bucket", read_from=where, hosts=hosts, workers=0,
                batch_size=args.batch_size, local_batch=args.batch_size // hosts,
                latency_ms=args.latency_ms if where == "bucket" else 0,
                run_rows=args.run_rows, read_ahead_mb=args.read_ahead_mb,
                examples_per_s=sum(rates) / len(rates), min_examples_per_s=min(rates),
                first_batch_s=most("first_batch_s"), epoch_bytes=most("epoch_bytes"),
                share_bytes=most("share_bytes"), bytes_over_share=most("bytes_over_share"),
                row_bytes_over_share=most("row_bytes_over_share"),
                ahead_bytes=most("ahead_bytes"), missing_spans=most("missing_spans"),
                epoch_requests=most("epoch_requests"), open_requests=most("open_requests"),
                peak_disk_bytes=most("peak_disk_bytes"), per_host=per_host, **extra)


def stage(args, progress) -> list[dict]:
    from benchmarks import data_corpus
    from tests.gcs_server import GcsServer
    from zoo import paths
    from zoo.data.pipelines import pretraining
    from zoo.data.pipelines.pretraining import examples as pretraining_examples
    from zoo.data.tokenizers.wordpiece import WordPieceTokenizer

    docs = data_corpus.documents(args.entities)
    tokenizer = WordPieceTokenizer(data_corpus.bert_sized_vocab(s for d in docs for s in d))
    settings = pretraining_examples.Settings(
        max_seq_length=args.seq_len, max_predictions_per_seq=args.predictions,
        dupe_factor=args.dupe_factor, dynamic_masking=False)
    local_dir = pretraining.prepare(docs, tokenizer, os.path.join(args.cache_dir, "bucket"),
                                    "train", settings, num_shards=4).path
    dir_bytes = bytes_under(local_dir)
    server_dir = os.path.join(args.cache_dir, "gcs")
    os.makedirs(server_dir)
    server = GcsServer(server_dir, latency_s=args.latency_ms / 1000)
    env = server.env()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # before the first gs:// filesystem is made (gcsfs reads it then)
    records = []
    try:
        url = f"gs://{server.bucket('bench')}/prepared"
        for name in sorted(os.listdir(local_dir)):
            with open(os.path.join(local_dir, name), "rb") as f:
                paths.as_path(f"{url}/{name}").write_bytes(f.read())
        source = pretraining.PretrainingSource(local_dir)
        examples, offsets = len(source), _data_offsets(local_dir, len(source.shard_rows))
        for hosts in HOST_COUNTS:
            for where, path in (("local", local_dir), ("bucket", url)):
                per_host = [_host(path, server if where == "bucket" else None, hosts, i, args,
                                  offsets) for i in range(hosts)]
                if where == "local":
                    for h in per_host:  # each host holds the directory on its own disk
                        h["peak_disk_bytes"] = dir_bytes
                rec = _summary(where, hosts, per_host, args,
                               dict(seq_len=args.seq_len, examples=examples,
                                    directory_bytes=dir_bytes))
                progress(rec)
                records.append(rec)
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return records


def describe(rec: dict) -> str:
    """One line for the progress print."""
    line = (f"bucket read_from={rec['read_from']:<6} hosts={rec['hosts']} "
            f"{rec['examples_per_s']:>10.1f} examples/s per host  ratio={rec['ratio']:.3f}  "
            f"per_cpu={rec['per_cpu']:.1f}  first batch {rec['first_batch_s']:.2f} s  "
            f"peak disk {rec['peak_disk_bytes'] / 1e6:.2f} MB")
    if rec["read_from"] == "bucket":
        line += (f"  epoch {rec['epoch_bytes'] / 1e6:.2f} MB = {rec['bytes_over_share']:.3f} x "
                 f"share (rows {rec['row_bytes_over_share']:.3f}), {rec['epoch_requests']:.0f} "
                 f"requests per host")
    return line


def table(records: list[dict], need: dict, host_cpus: int) -> str:
    first = records[0]
    lines = [
        "", f"## Reading from a bucket ({max(r['latency_ms'] for r in records)} ms per "
            "request) vs from local disk",
        "",
        f"Phase-1-like directory: {first['examples']:,} examples of seq {first['seq_len']} "
        f"(static masks), {first['directory_bytes'] / 1e6:.1f} MB in 4 shards; global batch "
        f"{first['batch_size']}, read_run_rows {first['run_rows']}, read_ahead_mb "
        f"{first['read_ahead_mb']:g}. Simulated hosts run one after another on this box. "
        f"Demand per host: {need['examples_per_s']:,.0f} examples/s; projection: per-CPU rate "
        f"x {host_cpus}.", "",
        "| read from | hosts | examples/s per host (min) | / demand | per CPU x host CPUs | "
        "first batch s | MB per host per epoch | / share (rows only) | requests per host per "
        "epoch | of which opening | peak local disk MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        remote = r["read_from"] == "bucket"
        lines.append(
            f"| {'gs:// (' + str(r['latency_ms']) + ' ms)' if remote else 'local disk'} | "
            f"{r['hosts']} | {r['examples_per_s']:,.0f} ({r['min_examples_per_s']:,.0f}) | "
            f"{r['ratio']:.2f} | {r['projected_host']:,.0f} | {r['first_batch_s']:.2f} | "
            + (f"{r['epoch_bytes'] / 1e6:.2f} | {r['bytes_over_share']:.3f} "
               f"({r['row_bytes_over_share']:.3f}) | "
               f"{r['epoch_requests']:,.0f} | {r['open_requests']} | " if remote else
               "| | | | ")
            + f"{r['peak_disk_bytes'] / 1e6:.2f} |")
    return "\n".join(lines) + "\n"
