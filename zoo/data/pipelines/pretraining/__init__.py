"""Preparing BERT pretraining data once: streaming, deterministic per shard, parallel over worker
processes and hosts.

The corpus is cut into pieces (zoo.data.readers.corpus_pieces) from its size alone; shard i is
made from piece i by zoo.data.pipelines.pretraining.examples.shard_examples, a pure function of
the piece, the Settings, the tokenizer and i. So the bytes on disk are the same whether one
process makes every shard or 256 hosts with 8 workers each share them, and no process ever holds
more than a piece per worker. On a pod, process p of P makes the shards i with i % P == p that
are not done yet, then waits for the others' markers; process 0 writes the manifest
(zoo.data.pipelines.pretraining.store has the layout and what makes a file count as written).

`prepare_pieces` writes into a directory the user names (the prepare command,
`python -m zoo.commands.prepare`); `prepare` / `prepare_cached` key a directory under a cache by
everything that shapes the examples, which is how a job prepares its own data when no prepared
directory is given.

The rest of BERT pretraining's data lives beside this file: examples (sentence pairs, masked-LM
targets), records (the on-disk record), store (the prepared directory, PretrainingSource),
progress and free_space (preparation's report and disk check), job_data (a job's data from its
config.data), run_order, range_reader and batches (reading it back for training).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import multiprocessing
import time
from collections.abc import Callable, Sequence

import numpy as np

from zoo.data.pipelines.pretraining import records as pretraining_records
from zoo.data.pipelines.pretraining import store
from zoo.data.pipelines.pretraining.progress import Progress
from zoo.data.pipelines.pretraining.examples import (
    Settings,
    encode_documents,
    masking_spec,
    shard_examples,
    stored_features,
    word_start_table,
)
from zoo.data.pipelines.pretraining.store import PretrainingSource
from zoo.data.readers.corpus_pieces import Piece, plan_documents, read_piece
from zoo.errors import ConfigError, DataError
from zoo.paths import as_path

__all__ = ["PretrainingSource", "prepare", "prepare_cached", "prepare_pieces"]

Report = Callable[[str], None]


# ---------------------------------------------------------------------------------------------
# Fingerprints.


def corpus_fingerprint(documents: Sequence[Sequence[str]]) -> str:
    """sha256 of the text with its sentence and document boundaries (which change the pairs)."""
    h = hashlib.sha256()
    for doc in documents:
        for s in doc:
            h.update(s.encode("utf-8"))
            h.update(b"\n")
        h.update(b"\x00")
    return h.hexdigest()


def tokenizer_fingerprint(tokenizer, probe_texts: Sequence[str] = ()) -> str:
    """A hash of what the tokenizer does: its own `fingerprint` (attribute or method) when it
    has one, its special ids, vocabulary (via id_to_token), word starts and the ids of
    `probe_texts` (which catch models with equal vocabularies that segment differently)."""
    h = hashlib.sha256()
    own = getattr(tokenizer, "fingerprint", None)
    if own is not None:
        h.update(str(own() if callable(own) else own).encode())
    h.update(json.dumps([
        type(tokenizer).__qualname__, int(tokenizer.vocab_size), int(tokenizer.pad_id),
        int(tokenizer.unk_id), int(tokenizer.cls_id), int(tokenizer.sep_id),
        int(tokenizer.mask_id), sorted(int(i) for i in tokenizer.special_ids),
    ]).encode())
    id_to_token = getattr(tokenizer, "id_to_token", None) or getattr(tokenizer, "id_to_piece",
                                                                     None)
    if id_to_token is not None:
        for i in range(tokenizer.vocab_size):
            h.update(str(id_to_token(i)).encode("utf-8") + b"\x00")
    h.update(np.packbits(word_start_table(tokenizer)).tobytes())
    for text in ("The quick brown fox jumps over the lazy dog.", *probe_texts):
        h.update(np.asarray(tokenizer.encode(text), np.int64).tobytes() + b"\xff")
    return h.hexdigest()


def _probe_texts(pieces: Sequence[Piece]) -> list[str]:
    # The first sentences of the corpus: read lazily, so only the first documents are touched.
    docs = itertools.islice(read_piece(pieces[0]), 8) if pieces else ()
    return [s for doc in docs for s in doc][:64]


# ---------------------------------------------------------------------------------------------
# Entry points.


def prepare(
    documents: Sequence[Sequence[str]],
    tokenizer,
    cache_dir: str,
    split: str,
    settings: Settings = Settings(),
    *,
    num_shards: int = 1,
    source: str = "documents",
    **kwargs,
) -> PretrainingSource:
    """Prepared examples of in-memory `documents` (num_shards contiguous groups of them),
    keyed under `cache_dir` (see prepare_cached; kwargs go to prepare_pieces)."""
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ConfigError(f"num_shards={num_shards!r} must be a positive int")
    return prepare_cached(plan_documents(documents, num_shards), tokenizer, cache_dir, split,
                          settings, source=source, **kwargs)


def prepare_cached(pieces: Sequence[Piece], tokenizer, cache_dir: str, split: str,
                   settings: Settings = Settings(), **kwargs) -> PretrainingSource:
    """Prepared examples in `<cache_dir>/<split>-<key>`, made once and reused.

    The key hashes the settings, the tokenizer (tokenizer_fingerprint) and the pieces (text by
    path, byte range, size and modification time; in-memory documents by their text), so any
    change gives a new directory and the same inputs reuse the old one without tokenizing.
    """
    key_parts = {
        "format": store.FORMAT_VERSION,
        "split": split,
        "settings": dataclasses.asdict(settings),
        "tokenizer": tokenizer_fingerprint(tokenizer, _probe_texts(pieces)),
        "pieces": [p.identity() for p in pieces],
    }
    key = hashlib.sha256(json.dumps(key_parts, sort_keys=True).encode()).hexdigest()[:20]
    directory = as_path(cache_dir) / f"{split}-{key}"
    return prepare_pieces(pieces, tokenizer, directory, settings,
                          tokenizer_id=key_parts["tokenizer"], **kwargs)


def prepare_pieces(
    pieces: Sequence[Piece],
    tokenizer,
    directory,
    settings: Settings = Settings(),
    *,
    source: str = "documents",
    workers: int = 1,
    process_index: int = 0,
    process_count: int = 1,
    report: Report | None = None,
    poll_seconds: float = 2.0,
    tokenizer_id: str | None = None,
) -> PretrainingSource:
    """Prepares shard i from pieces[i] into `directory` and returns the finished source.

    Args:
      pieces: the corpus, cut (zoo.data.readers.corpus_pieces.plan_*).
      tokenizer: the common tokenizer interface; picklable when workers > 1.
      directory: local path or gs:// URL; shared by every process of a pod.
      settings: see Settings.
      source: names the corpus in messages (e.g. "config.data.train_files").
      workers: worker processes on this host (1 = in this process).
      process_index, process_count: this host's share: the shards i with
        i % process_count == process_index.
      report: called with progress lines (pretraining.progress: shards done, examples/s,
        MB/s, ETA) and waits.
      poll_seconds: how often a waiting process looks for the others' markers.
      tokenizer_id: tokenizer_fingerprint, when the caller has it.

    Raises:
      DataError: `directory` holds another preparation (other settings, tokenizer or corpus),
        or a piece cannot make next-sentence pairs.
    """
    if tokenizer.pad_id != 0:
        # Features are padded with zeros, so id 0 must be the padding token.
        raise DataError(
            f"tokenizer {getattr(tokenizer, 'source', '')}: its padding token has id "
            f"{tokenizer.pad_id}, but examples are padded with id 0; give a WordPiece "
            "vocab.txt with [PAD] on its first line (as every BERT vocabulary has it) or a "
            "SentencePiece model trained by zoo")
    if not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"the number of preparation workers must be an int >= 1, got "
                          f"{workers!r}")
    if not pieces:
        raise DataError(f"{source}: the corpus is empty; nothing to prepare")
    directory = as_path(directory)
    plan = {
        "format": store.FORMAT_VERSION,
        "settings": dataclasses.asdict(settings),
        "tokenizer": tokenizer_id or tokenizer_fingerprint(tokenizer, _probe_texts(pieces)),
        "pieces": [p.identity() for p in pieces],
    }
    _claim(directory, plan, process_index, report, poll_seconds)
    if (directory / store.MANIFEST).exists():
        return PretrainingSource(str(directory))
    if process_index == 0 and not (directory / store.WORD_STARTS).exists():
        store.write_word_starts(directory, word_start_table(tokenizer))

    done = store.done_shards(directory)
    own = [i for i in range(len(pieces)) if i % process_count == process_index and i not in done]
    _make_shards(pieces, own, tokenizer, directory, settings, source, workers, report)
    _wait_for_shards(directory, len(pieces), report, poll_seconds)
    if process_index == 0:
        done = store.read_markers(directory, range(len(pieces)))
        rows = [done[i]["rows"] for i in range(len(pieces))]
        store.write_json(directory / store.MANIFEST, {
            "format": store.FORMAT_VERSION,
            "source": source,
            "settings": dataclasses.asdict(settings),
            "masking": dataclasses.asdict(masking_spec(settings, tokenizer)),
            "pad_id": int(tokenizer.pad_id),
            "features": sorted(stored_features(settings)),
            "tokenizer": plan["tokenizer"],
            "shard_rows": rows,
            "num_examples": int(sum(rows)),
            "num_is_next": int(sum(done[i]["is_next"] for i in range(len(pieces)))),
        })
    else:
        _wait_for(lambda: (directory / store.MANIFEST).exists(), poll_seconds, report,
                  f"waiting for process 0 to write {directory / store.MANIFEST}")
    return PretrainingSource(str(directory))


# ---------------------------------------------------------------------------------------------
# Coordination between processes.


def _claim(directory, plan: dict, process_index: int, report, poll_seconds: float) -> None:
    """Process 0 writes plan.json (or finds an equal one); the others wait for it. A different
    plan means the directory belongs to another preparation: never mix the two."""
    plan = json.loads(json.dumps(plan))  # as read back: tuples become lists
    path = directory / store.PLAN
    if process_index == 0 and not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        store.write_json(path, plan)
    _wait_for(path.exists, poll_seconds, report, f"waiting for process 0 to write {path}")
    found = store.read_json(path)
    if found != plan:
        differ = sorted(k for k in {*found, *plan} if found.get(k) != plan.get(k))
        raise DataError(
            f"{directory} holds data prepared (or being prepared) from another "
            f"{' and '.join(differ)} ({path} differs); give another directory, or delete "
            f"{directory} to prepare it again with these inputs")


def _wait_for_shards(directory, count: int, report, poll_seconds: float) -> None:
    """Until every shard's marker exists: one listing per poll (store.done_shards), never a
    read of each marker."""
    done = store.done_shards(directory)
    while len(done) < count:
        missing = sorted(set(range(count)) - done)
        if report:
            report(f"waiting for {len(missing)} of {count} shards from other processes (e.g. "
                   f"{', '.join(map(str, missing[:5]))}) in {directory}")
        time.sleep(poll_seconds)
        done = store.done_shards(directory)


def _wait_for(condition, poll_seconds: float, report, message: str) -> None:
    said = False
    while not condition():
        if report and not said:
            report(message)
            said = True
        time.sleep(poll_seconds)


# ---------------------------------------------------------------------------------------------
# Making shards, here or in worker processes.

# A worker's constant arguments, set once per process by _init_worker.
_WORKER: dict = {}


def _init_worker(tokenizer, directory: str, settings: Settings, source: str) -> None:
    _WORKER.update(tokenizer=tokenizer, directory=as_path(directory), settings=settings,
                   source=source, word_starts=word_start_table(tokenizer))


def _make_shard(task: tuple[int, Piece]) -> tuple[int, int, int]:
    """Makes and writes one shard; returns (shard, size of input, examples) for progress."""
    shard, piece = task
    w = _WORKER
    where = f"{w['source']} shard {shard} ({piece.describe()})"
    try:
        docs = encode_documents(w["tokenizer"], list(read_piece(piece)), where)
    except DataError as e:
        if "non-empty documents" not in str(e):
            raise
        raise DataError(f"{e}; with many small pieces, prepare fewer, larger shards "
                        "(config.data.shard_mb or config.data.num_shards)") from None
    arrays = shard_examples(docs, w["settings"], shard, w["tokenizer"], w["word_starts"])
    labels = arrays["next_sentence_labels"]
    records = pretraining_records.encode(arrays, w["settings"], w["tokenizer"].vocab_size,
                                         verify=False)
    del arrays  # the records are a fifth of the features' bytes
    store.write_shard(w["directory"], shard, records, {
        "rows": int(len(labels)), "is_next": int(len(labels) - labels.sum()),
        "piece": piece.identity(),
    })
    return shard, piece.size, int(len(labels))


def _make_shards(pieces, own: list[int], tokenizer, directory, settings, source, workers,
                 report) -> None:
    if not own:
        return
    tasks = [(i, pieces[i]) for i in own]
    unit = "MB" if pieces[0].kind == "text" else pieces[0].kind.replace("tfds", "records")
    workers = min(workers, len(tasks))
    progress = Progress(len(tasks), sum(p.size for _, p in tasks), unit, workers)
    if workers == 1:
        _init_worker(tokenizer, str(directory), settings, source)
        results = map(_make_shard, tasks)
        pool = None
    else:
        # spawn, not fork: the parent may hold JAX's threads, which fork would copy mid-state.
        pool = multiprocessing.get_context("spawn").Pool(
            workers, _init_worker, (tokenizer, str(directory), settings, source))
        results = pool.imap_unordered(_make_shard, tasks)
    try:
        for _, size, rows in results:
            line = progress.update(size, rows)
            if report:
                report(line)
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
