"""BERT pretraining data on disk: a cache of prepared examples and grain pipelines over it.

The examples themselves (NSP pairs, 80/10/10 masking, static or dynamic masks) are made by
zoo.data.pipelines.pretraining_examples; this module decides where they live and reads them
back. `prepare` keys a cache directory by everything that shapes the examples (the Settings,
the shard count, the tokenizer and the corpus), generates the shards into a temporary directory
and renames it into place; `PretrainingSource` memory-maps a cache for random access
(zoo.data.pipelines.pretraining_batches cuts it into batches).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Sequence

import numpy as np

from zoo.data.pipelines.pretraining_examples import (
    MLM_FEATURES,
    PAIR_FEATURES,
    MaskingSpec,
    Settings,
    encode_documents,
    feature_shapes,
    masking_spec,
    shard_examples,
    stored_features,
    word_start_table,
)
from zoo.errors import ConfigError, DataError

_FORMAT_VERSION = 1
_MANIFEST = "manifest.json"
_WORD_STARTS = "word_starts.npy"


# ---------------------------------------------------------------------------------------------
# Cache keys.


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


# ---------------------------------------------------------------------------------------------
# The on-disk cache.


def prepare(
    documents: Sequence[Sequence[str]],
    tokenizer,
    cache_dir: str,
    split: str,
    settings: Settings = Settings(),
    *,
    num_shards: int = 1,
    source: str = "documents",
) -> PretrainingSource:
    """Prepared examples of `documents`, generated once and cached under `cache_dir`.

    The cache directory `<cache_dir>/<split>-<key>` is keyed by a hash of the settings,
    num_shards, the tokenizer (see tokenizer_fingerprint) and the corpus text, so any change
    gives a new directory and the same inputs reuse the old one without tokenizing. Shards are
    contiguous groups of documents (a random B may come from any document), each from its own
    rng, written with the manifest into a temporary directory that is renamed into place: a
    crash never leaves a half-written cache under the final name.

    Args:
      documents: lists of sentences (zoo.data.readers.sources.load_documents).
      tokenizer: the common tokenizer interface (vocab_size, pad/unk/cls/sep/mask ids,
        special_ids, encode, optional encode_batch, is_word_start).
      cache_dir: parent directory of the caches.
      split: names the cache ('train', 'validation', ...).
      settings: see Settings.
      num_shards: files per feature.
      source: names the corpus in error messages (e.g. 'config.data.train_files').

    Returns:
      A memory-mapped PretrainingSource over the shards.
    """
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ConfigError(f"num_shards={num_shards!r} must be a positive int")
    if tokenizer.pad_id != 0:
        # Features are padded with zeros, so id 0 must be the padding token.
        raise DataError(
            f"tokenizer {getattr(tokenizer, 'source', '')}: its padding token has id "
            f"{tokenizer.pad_id}, but examples are padded with id 0; give a WordPiece "
            "vocab.txt with [PAD] on its first line (as every BERT vocabulary has it) or a "
            "SentencePiece model trained by zoo")
    probes = [s for doc in documents[:8] for s in doc][:64]
    key_parts = {
        "format": _FORMAT_VERSION,
        "split": split,
        "settings": dataclasses.asdict(settings),
        "num_shards": num_shards,
        "tokenizer": tokenizer_fingerprint(tokenizer, probes),
        "corpus": corpus_fingerprint(documents),
    }
    key = hashlib.sha256(json.dumps(key_parts, sort_keys=True).encode()).hexdigest()[:20]
    path = os.path.join(cache_dir, f"{split}-{key}")
    if os.path.exists(path):
        return PretrainingSource(path)

    os.makedirs(cache_dir, exist_ok=True)
    tmp = os.path.join(cache_dir, f".{split}-{key}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.makedirs(tmp)
    try:
        manifest = _generate(documents, tokenizer, tmp, settings, num_shards, source)
        manifest.update(key=key, key_parts=key_parts)
        with open(os.path.join(tmp, _MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
        try:
            os.rename(tmp, path)
        except OSError:
            if not os.path.exists(os.path.join(path, _MANIFEST)):
                raise
            # Another process finished the same cache first; its content is identical.
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PretrainingSource(path)


def _generate(documents, tokenizer, out_dir, settings: Settings, num_shards: int,
              source: str) -> dict:
    docs = encode_documents(tokenizer, documents, source)
    table = word_start_table(tokenizer)
    np.save(os.path.join(out_dir, _WORD_STARTS), table)
    shards, is_next = [], 0
    for shard in range(num_shards):
        arrays = shard_examples(docs, settings, shard, num_shards, tokenizer, table, source)
        for k, arr in arrays.items():
            np.save(os.path.join(out_dir, _shard_file(k, shard)), arr)
        shards.append(len(arrays["input_ids"]))
        is_next += len(arrays["input_ids"]) - int(arrays["next_sentence_labels"].sum())
    return {
        "format": _FORMAT_VERSION,
        "source": source,
        "settings": dataclasses.asdict(settings),
        "masking": dataclasses.asdict(masking_spec(settings, tokenizer)),
        "pad_id": int(tokenizer.pad_id),
        "features": sorted(stored_features(settings)),
        "shard_rows": shards,
        "num_examples": int(sum(shards)),
        "num_is_next": int(is_next),
    }


def _shard_file(feature: str, shard: int) -> str:
    return f"{feature}-{shard:05d}.npy"


class PretrainingSource:
    """Random access (a grain RandomAccessDataSource) to the examples of one prepared cache.

    Rows are read through memory maps, so opening a large cache costs nothing. Every row carries
    example_weight = 1.0 (padding rows built from zeros get 0). `dynamic` rows hold no masked-LM
    features yet; `mask_example` with `masking` and `word_starts` adds them.
    """

    def __init__(self, path: str):
        self.path = path
        manifest_path = os.path.join(path, _MANIFEST)
        try:
            with open(manifest_path) as f:
                self.manifest = json.load(f)
            settings = Settings(**self.manifest["settings"])
            self.masking = MaskingSpec(**{**self.manifest["masking"], "special_ids": tuple(
                self.manifest["masking"]["special_ids"])})
            features = self.manifest["features"]
            shard_rows = self.manifest["shard_rows"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise _corrupt(path, f"unreadable manifest {manifest_path}: {e}") from None
        self.settings = settings
        self.dynamic = settings.dynamic_masking
        shapes = feature_shapes(settings)
        feature_dims = {**PAIR_FEATURES, **MLM_FEATURES}
        self._arrays: list[dict[str, np.ndarray]] = []
        for shard, rows in enumerate(shard_rows):
            arrays = {}
            for k in features:
                file = os.path.join(path, _shard_file(k, shard))
                try:
                    arr = np.load(file, mmap_mode="r")
                except (OSError, ValueError) as e:
                    raise _corrupt(path, f"cannot read {file}: {e}") from None
                dtype, dims = feature_dims[k]
                if arr.shape != (rows, *shapes[dims]) or arr.dtype != dtype:
                    raise _corrupt(path, f"{file} holds {arr.dtype}{list(arr.shape)}, the "
                                         f"manifest says {np.dtype(dtype)}{[rows, *shapes[dims]]}")
                arrays[k] = arr
            self._arrays.append(arrays)
        try:
            self.word_starts = np.load(os.path.join(path, _WORD_STARTS))
        except (OSError, ValueError) as e:
            raise _corrupt(path, f"cannot read {_WORD_STARTS}: {e}") from None
        self._offsets = np.cumsum([0, *shard_rows])

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} examples")
        shard = int(np.searchsorted(self._offsets, index, side="right")) - 1
        row = {k: np.array(v[index - self._offsets[shard]]) for k, v in
               self._arrays[shard].items()}
        row["example_weight"] = np.float32(1.0)
        return row

    def __reduce__(self):
        # Reopen by path when pickled (grain workers): never pickle the memory maps' contents.
        return (PretrainingSource, (self.path,))

    def __repr__(self) -> str:
        return f"PretrainingSource({self.path!r}, {len(self)} examples)"


def _corrupt(path: str, detail: str) -> DataError:
    return DataError(
        f"pretraining cache {path} is incomplete or corrupt ({detail}); delete the directory "
        f"{path} and run again to regenerate it"
    )
