"""Where documents come from (config.data.source): the synthetic world (default, offline), your
own text files ('files') or TFDS.

Every source yields documents as lists of sentences, the form both LM packing and BERT's
sentence-pair creation start from.
"""

import functools
import glob
import os

import ml_collections

from zoo import paths
from zoo.data.readers import corpus_pieces, data_source, text_files
from zoo.data.synthetic.documents import corpus_splits
from zoo.errors import ConfigError, MissingFileError

Documents = list[list[str]]
_SPLITS = ("train", "validation", "test")


@functools.lru_cache(maxsize=4)
def _synthetic_splits(seed: int, num_entities: int) -> dict[str, Documents]:
    splits = corpus_splits(seed=seed, num_entities=num_entities)
    return {name: [list(doc.texts) for doc in docs] for name, docs in splits.items()}


def expand_files(patterns: str, key: str) -> list[str]:
    """Comma-separated files, globs or directories -> sorted file list (a directory stands for
    every file below it, hidden ones excepted); an error naming the config key if empty."""
    files = set()
    for pattern in filter(None, (p.strip() for p in patterns.split(","))):
        if paths.is_remote(pattern):
            files.update(_expand_remote(pattern))
            continue
        for path in glob.glob(os.path.expanduser(pattern)):
            if not os.path.isdir(path):
                files.add(path)
                continue
            for directory, subdirs, names in os.walk(path):
                subdirs[:] = [d for d in subdirs if not d.startswith(".")]
                files.update(os.path.join(directory, n) for n in names if not n.startswith("."))
    if not files:
        raise MissingFileError(
            f"{key}={patterns!r} matches no files; give comma-separated paths, globs or "
            "directories of text files (one sentence per line, a blank line between documents)"
        )
    return sorted(files)


def plan_pieces(cfg: ml_collections.ConfigDict, split: str, num_pieces: int = 1
                ) -> list[corpus_pieces.Piece]:
    """The documents of `split` as pieces to stream one at a time (zoo.data.readers.corpus_pieces).

    'files': pieces of config.data.shard_mb megabytes (2**20 bytes) of the files, from their
    sizes alone; 'tfds': `num_pieces` record ranges; 'synthetic': `num_pieces` groups of the
    (in-memory) documents. The text files are never read here.
    """
    if split not in _SPLITS:
        raise ValueError(f"split must be one of {_SPLITS}, got {split!r}")
    source = data_source.source_of(cfg)
    if source == data_source.FILES:
        key = "config.data.train_files" if split == "train" else "config.data.eval_files"
        patterns = cfg.train_files if split == "train" else cfg.eval_files
        shard_mb = cfg.get("shard_mb", 4)
        if not isinstance(shard_mb, (int, float)) or shard_mb <= 0:
            raise ConfigError(f"config.data.shard_mb={shard_mb!r} must be a number > 0 "
                              "(megabytes of text per prepared shard)")
        return corpus_pieces.plan_text(expand_files(patterns, key), int(shard_mb * 2**20))
    if source == data_source.TFDS:
        from zoo.data.readers import tfds_source

        records, _ = tfds_source.open_records(cfg, split)
        return corpus_pieces.plan_tfds(
            cfg.tfds_name, cfg.tfds_data_dir, cfg[tfds_source.SPLIT_KEYS[split]],
            cfg.tfds_text_key, tfds_source.num_records(cfg, records), num_pieces)
    return corpus_pieces.plan_documents(load_documents(cfg, split), num_pieces)


class StreamedDocuments:
    """The documents of some pieces, re-read from the start on every iteration (for a
    tokenizer trained on the corpus without holding it)."""

    def __init__(self, pieces: list[corpus_pieces.Piece]):
        self.pieces = pieces

    def __iter__(self):
        for piece in self.pieces:
            yield from corpus_pieces.read_piece(piece)


def _expand_remote(pattern: str) -> list[str]:
    """A gs:// file, glob or directory (every object below it, hidden names excepted)."""
    import fsspec  # gcsfs: epath's glob and walk drop the scheme or refuse '**' on gs://

    scheme, rest = pattern.split("://", 1)
    fs = fsspec.filesystem(scheme)
    found = fs.glob(rest) if any(c in rest for c in "*?[") else [rest] if fs.exists(rest) else []
    files = []
    for name in found:
        if fs.isdir(name):
            files += [f for f in fs.find(name) if not any(
                part.startswith(".") for part in f[len(name):].split("/"))]
        else:
            files.append(name)
    return [f"{scheme}://{f}" for f in files]


def load_documents(cfg: ml_collections.ConfigDict, split: str) -> Documents:
    """Documents of `split` ('train' | 'validation' | 'test') from config.data.source.

    'synthetic': the seeded world corpus of config.data.seed with
    config.data.synthetic_entities entities. 'files': BERT-format text files,
    config.data.train_files for 'train' and config.data.eval_files for the other two. 'tfds': a
    TFDS dataset prepared in a local data_dir (see zoo.data.readers.tfds_source.load_documents).
    """
    if split not in _SPLITS:
        raise ValueError(f"split must be one of {_SPLITS}, got {split!r}")

    def files():
        key = "config.data.train_files" if split == "train" else "config.data.eval_files"
        patterns = cfg.train_files if split == "train" else cfg.eval_files
        return [doc for f in expand_files(patterns, key) for doc in text_files.read_text_corpus(f)]

    def tfds():
        # Imported here: TFDS takes ~0.5 s to import, which only jobs reading it should pay.
        from zoo.data.readers import tfds_source

        return tfds_source.load_documents(cfg, split)

    return data_source.load_split(
        cfg, synthetic=lambda: _synthetic_splits(cfg.seed, cfg.synthetic_entities)[split],
        files=files, tfds=tfds)
