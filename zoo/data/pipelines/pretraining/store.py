"""Prepared BERT pretraining examples on disk (a local directory or a gs:// bucket).

A prepared directory holds, per shard i, `examples-<i>.npy` (a 1-D numpy structured array of
fixed-size records, zoo.data.pipelines.pretraining.records; rows shuffled when prepared) and a
marker `shard-<i>.json` written last; `word_starts.npy`; `plan.json` (what is being prepared: the
settings, the tokenizer's fingerprint, the corpus pieces) written first; and `manifest.json`
(the row counts of every shard) written once every shard's marker exists. Every file is written
whole or not at all (zoo.paths.write_atomic: a renamed temporary file locally, one object upload
on GCS), so a process killed at any moment leaves no file that looks complete: a shard counts as done only through its marker, the directory only
through its manifest, and a rerun redoes only the shards without a marker.

`PretrainingSource` reads a finished directory where it lies: a local one through memory maps,
one in a bucket by ranged reads of the rows asked for
(zoo.data.pipelines.pretraining.range_reader); no host ever copies the directory.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np
from etils import epath

from zoo import errors, paths, retry
from zoo.data.pipelines.pretraining import records as records_format
from zoo.data.pipelines.pretraining.examples import MaskingSpec, Settings
from zoo.data.pipelines.pretraining.range_reader import RemoteArrays
from zoo.errors import AccessDeniedError, DataError, UserError
from zoo.retry import retrying

# 3: one file of fixed-size records per shard, rows shuffled (2: one int32 file per feature).
FORMAT_VERSION = 3
MANIFEST = "manifest.json"
PLAN = "plan.json"
WORD_STARTS = "word_starts.npy"


def shard_file(shard: int) -> str:
    return f"examples-{shard:05d}.npy"


def marker_file(shard: int) -> str:
    return f"shard-{shard:05d}.json"


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def write_json(path: epath.Path, obj) -> None:
    paths.write_atomic(path, json.dumps(obj, indent=1, sort_keys=True))


def read_json(path: epath.Path):
    return json.loads(paths.read_bytes(path))  # retried on GCS (zoo.retry)


def write_word_starts(directory: epath.Path, table: np.ndarray) -> None:
    paths.write_atomic(directory / WORD_STARTS, _npy(table))


def write_shard(directory: epath.Path, shard: int, records: np.ndarray, summary: dict) -> None:
    """The shard's records (pretraining_records.encode), then its marker (the proof they are
    complete)."""
    paths.write_atomic(directory / shard_file(shard), _npy(records))
    write_json(directory / marker_file(shard), summary)


def done_shards(directory: epath.Path) -> set[int]:
    """The shards whose marker exists, from one listing of the markers' names (one request
    per 1,000 on GCS): waiting hosts call this every poll, and reading every marker each time
    was ~5,000 requests per host per poll at 20 GB of text in 4 MB shards."""
    return {int(name[len("shard-"):-len(".json")])
            for name in paths.list_names(directory, "shard-") if name.endswith(".json")}


def read_markers(directory: epath.Path, shards) -> dict[int, dict]:
    """shard index -> its marker's summary, for the manifest (read once, at the end; on GCS
    the objects are fetched concurrently)."""
    shards = list(shards)
    files = [directory / marker_file(i) for i in shards]
    if not paths.is_remote(directory):
        return {i: read_json(f) for i, f in zip(shards, files)}
    import fsspec

    urls = [os.fspath(f) for f in files]
    found = retrying(lambda: fsspec.filesystem("gs").cat(urls, on_error="raise"),
                           what=f"reading {len(urls)} shard markers in {directory}")
    return {i: json.loads(found[url.split("://", 1)[1]]) for i, url in zip(shards, urls)}




# ---------------------------------------------------------------------------------------------
# Reading.


class PretrainingSource:
    """Random access (a grain RandomAccessDataSource) to the examples of one prepared directory.

    A local directory is read through memory maps (opening a large one costs nothing); one in a
    bucket through ranged reads of the rows asked for, never copied whole. Rows come back as
    format 2's int32 / float32 features (pretraining_records.decode), each with
    example_weight = 1.0 (padding rows built from zeros get 0). `dynamic` rows hold no masked-LM
    features yet; `mask_batch` with `masking` and `word_starts` adds them.
    """

    def __init__(self, path: str):
        self.path = path
        root = paths.as_path(path)
        self.remote = paths.is_remote(path)
        raw = read_part(path, os.fspath(root / MANIFEST))
        try:
            self.manifest = json.loads(raw.decode("utf-8"))
            version = self.manifest.get("format")
        except (ValueError, AttributeError) as e:
            raise corrupt(path, f"unreadable manifest {root / MANIFEST}: {e}") from None
        if version != FORMAT_VERSION:
            raise DataError(
                f"prepared pretraining data {path} is in format {version}, and this version of "
                f"zoo reads format {FORMAT_VERSION} (one file of compact records per shard, "
                "rows shuffled); prepare it again (python -m zoo.commands.prepare, or delete "
                f"{path} and let the job prepare it)")
        try:
            settings = Settings(**self.manifest["settings"])
            self.masking = MaskingSpec(**{**self.manifest["masking"], "special_ids": tuple(
                self.manifest["masking"]["special_ids"])})
            shard_rows = [int(r) for r in self.manifest["shard_rows"]]
        except (ValueError, KeyError, TypeError) as e:
            raise corrupt(path, f"unreadable manifest {root / MANIFEST}: {e}") from None
        self.settings = settings
        self.dynamic = settings.dynamic_masking
        self.shard_rows = shard_rows
        self.dtype = records_format.record_dtype(settings, self.masking.vocab_size)
        files = [root / shard_file(s) for s in range(len(shard_rows))]
        if self.remote:
            self._remote = RemoteArrays([os.fspath(f) for f in files], shard_rows, self.dtype)
        else:
            self._maps = [self._open_local(os.fspath(f), rows)
                          for f, rows in zip(files, shard_rows)]
        raw = read_part(path, os.fspath(root / WORD_STARTS))
        try:
            self.word_starts = np.load(io.BytesIO(raw))
        except (OSError, ValueError) as e:
            raise corrupt(path, f"cannot read {WORD_STARTS}: {e}") from None
        self._offsets = np.cumsum([0, *shard_rows])

    def _open_local(self, file: str, rows: int) -> np.ndarray:
        try:
            array = np.load(file, mmap_mode="r")
        except (OSError, ValueError) as e:
            raise corrupt(self.path, f"cannot read {file}: {e}") from None
        if array.shape != (rows,) or array.dtype != self.dtype:
            raise corrupt(self.path, f"{file} holds {array.dtype}{list(array.shape)}, the "
                                     f"manifest says {self.dtype}[{rows}]")
        return array

    def __len__(self) -> int:
        return int(self._offsets[-1])

    @property
    def requests(self) -> int:
        """Ranged GETs issued for rows so far (0 for a local directory)."""
        return self._remote.requests if self.remote else 0

    def global_index(self, shard: int, row: int) -> int:
        return int(self._offsets[shard]) + row

    def records(self, spans) -> np.ndarray:
        """The stored records of rows [lo, hi) of shard s for each (s, lo, hi), concatenated:
        one contiguous read (one GET in a bucket) per span."""
        if self.remote:
            return self._remote.read(spans)
        parts = [self._maps[s][lo:hi] for s, lo, hi in spans]
        return np.concatenate(parts) if parts else np.zeros(0, self.dtype)

    def decode(self, records: np.ndarray) -> dict[str, np.ndarray]:
        out = records_format.decode(records)
        out["example_weight"] = np.ones(len(records), np.float32)
        return out

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} examples")
        return {k: v[0] for k, v in self.read([index]).items()}

    def read(self, indices) -> dict[str, np.ndarray]:
        """Rows `indices` stacked [len(indices), ...]: locally one gather per shard; from a
        bucket one GET per run of consecutive indices."""
        indices = np.asarray(indices, np.int64).reshape(-1)
        if indices.size and not (0 <= indices.min() and indices.max() < len(self)):
            raise IndexError(f"indices out of range for {len(self)} examples")
        if not indices.size:
            return self.decode(np.zeros(0, self.dtype))
        shards = np.searchsorted(self._offsets, indices, side="right") - 1
        local = indices - self._offsets[shards]
        if not self.remote:
            out = np.empty(len(indices), self.dtype)
            for shard in np.unique(shards):
                rows = shards == shard
                out[rows] = self._maps[shard][local[rows]]
            return self.decode(out)
        # Sorted unique rows, cut where the next is not the next row of the same shard.
        unique, inverse = np.unique(indices, return_inverse=True)
        u_shards = np.searchsorted(self._offsets, unique, side="right") - 1
        ends = [*(np.flatnonzero((np.diff(unique) != 1) | (np.diff(u_shards) != 0)) + 1),
                len(unique)]
        spans, start = [], 0
        for end in ends:
            s = int(u_shards[start])
            lo = int(unique[start] - self._offsets[s])
            spans.append((s, lo, lo + end - start))
            start = end
        return self.decode(self.records(spans)[inverse])

    def __reduce__(self):
        # Reopen by path when pickled (grain workers): never pickle memory maps or connections.
        return (PretrainingSource, (self.path,))

    def __repr__(self) -> str:
        return f"PretrainingSource({self.path!r}, {len(self)} examples)"


def read_part(path: str, file: str) -> bytes:
    """The bytes of one small file of the prepared directory `path` (through zoo.retry in a
    bucket). A refusal of these credentials is an AccessDeniedError, storage that keeps
    failing a StorageUnavailableError: neither says the data is damaged or asks for it to be
    deleted. Only a file that is not there is `corrupt`."""
    try:
        return paths.read_bytes(file)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - classified just below
        if retry.is_access_denied(e):
            raise AccessDeniedError(
                f"prepared pretraining data {path}: reading {file} was refused ({type(e).__name__}"
                f": {' '.join(errors.message(e).split())[:200]}); these credentials may not read "
                "it. The data is not known to be damaged: give them read access (e.g. "
                "roles/storage.objectViewer on the bucket) and run again") from e
        if isinstance(e, FileNotFoundError):
            raise corrupt(path, f"{file} is missing") from None
        if isinstance(e, OSError):
            raise corrupt(path, f"cannot read {file}: {e}") from None
        raise


def corrupt(path: str, detail: str) -> DataError:
    return DataError(
        f"prepared pretraining data {path} is incomplete or corrupt ({detail}); delete the "
        f"directory {path} and prepare it again"
    )
