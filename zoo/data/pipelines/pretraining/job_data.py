"""A BERT pretraining job's data, from its config.data: the tokenizer and the train and validation
examples, either prepared here (into a directory keyed under the cache) or opened from a
directory the prepare command wrote (config.data.prepared_dir), which training only reads.

A prepared directory holds
    tokenizer/   the tokenizer file (a copy of config.data.tokenizer, or the trained model)
                 and tokenizer.json naming it
    train/       examples (zoo.data.pipelines.pretraining.store layout)
    validation/  one pass, static masks
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time

import ml_collections

from zoo.data.pipelines import pretraining
from zoo.data.pipelines.pretraining import free_space as preparation_space
from zoo.data.pipelines.pretraining import store as pretraining_store
from zoo.data.pipelines.pretraining.examples import Settings
from zoo.data.pipelines.pretraining.store import PretrainingSource
from zoo.data.readers import sources
from zoo.data.tokenizers import base as tokenizers
from zoo.data.tokenizers import prepared as saved_tokenizer
from zoo.data.tokenizers import sample
from zoo.errors import ConfigError, MissingFileError
from zoo.paths import as_path

TOKENIZER_DIR = "tokenizer"
# Sentences a trained tokenizer sees at most (config.data.tokenizer_sample_sentences), as
# SentencePiece's own documentation suggests for input_sentence_size: ~1-2 GB of memory.
DEFAULT_SAMPLE = 10_000_000
_SPLITS = ("train", "validation")
# Settings field -> the config.data key it comes from (for messages naming the key).
_KEYS = {
    "max_seq_length": "seq_len",
    "max_predictions_per_seq": "max_predictions_per_seq",
    "masked_lm_prob": "masked_lm_prob",
    "short_seq_prob": "short_seq_prob",
    "dupe_factor": "dupe_factor",
    "whole_word": "whole_word_masking",
    "dynamic_masking": "dynamic_masking",
    "seed": "seed",
}


@dataclasses.dataclass
class PretrainingData:
    tokenizer: object
    train: PretrainingSource
    validation: PretrainingSource


def settings(data: ml_collections.ConfigDict) -> dict[str, Settings]:
    """Settings per split: the train split's from config.data; validation is one pass with
    masks drawn once (a fixed held-out set)."""
    train = Settings(**{field: data[key] for field, key in _KEYS.items()})
    validation = dataclasses.replace(train, dupe_factor=1, dynamic_masking=False)
    return {"train": train, "validation": validation}


def prepare(data: ml_collections.ConfigDict, cache_dir: str, output_dir: str = "", *,
            workers: int = 0, process_index: int = 0, process_count: int = 1,
            report=None) -> PretrainingData:
    """Prepares both splits, streaming the corpus piece by piece.

    Into `output_dir` (the prepared-directory layout above) when given, else into directories
    keyed under `cache_dir` (beside the trained tokenizer, as a job without a prepared
    directory uses them). workers = 0 takes every core. With several processes, process 0 trains (or copies) the tokenizer and
    the others wait for it; every process then makes its share of the shards.
    """
    pieces = {"train": sources.plan_pieces(data, "train", data.get("num_shards", 1)),
              "validation": sources.plan_pieces(data, "validation", 1)}
    split_settings = settings(data)
    names = {"train": f"config.data.source={data.source!r} (train)",
             "validation": f"config.data.source={data.source!r} (validation)"}
    # Before the tokenizer is trained: a disk too small should cost seconds, not hours.
    preparation_space.check_free_space(
        output_dir or cache_dir,
        "config.data.prepared_dir" if output_dir else "config.data.cache_dir", pieces,
        split_settings, data.vocab_size)  # a given tokenizer's size is known later; near enough
    workers = workers or os.cpu_count() or 1
    kwargs = dict(workers=workers, process_index=process_index, process_count=process_count,
                  report=report)
    if not output_dir:
        tokenizer = tokenizers.from_config(data, cache_dir,
                                           sources.StreamedDocuments(pieces["train"]))
        return PretrainingData(tokenizer, *(
            pretraining.prepare_cached(pieces[s], tokenizer, cache_dir, s, split_settings[s],
                                       source=names[s], **kwargs) for s in _SPLITS))
    root = as_path(output_dir)
    tokenizer = _write_tokenizer(data, root / TOKENIZER_DIR, pieces["train"], process_index,
                                 report)
    return PretrainingData(tokenizer, *(
        pretraining.prepare_pieces(pieces[s], tokenizer, root / s, split_settings[s],
                                   source=names[s], **kwargs) for s in _SPLITS))


def _write_tokenizer(data, directory, train_pieces, process_index: int, report):
    if process_index == 0 and not saved_tokenizer.exists(directory):
        directory.mkdir(parents=True, exist_ok=True)
        if data.tokenizer:
            source = as_path(data.tokenizer)
            if source.is_dir():
                raise ConfigError(
                    f"config.data.tokenizer={data.tokenizer!r} is a directory; a prepared "
                    "directory takes a tokenizer file (a SentencePiece .model or a WordPiece "
                    "vocab.txt)")
            if not source.exists():
                raise MissingFileError(f"tokenizer {data.tokenizer} (config.data.tokenizer) "
                                       "does not exist")
            name, content = source.name, source.read_bytes()
        else:
            name, content, trained_on = _train_tokenizer(data, train_pieces, report)
        saved_tokenizer.save(directory, name, content, data.get("lowercase", True),
                             trained_on if not data.tokenizer else None)
    pretraining._wait_for(lambda: saved_tokenizer.exists(directory), 2.0, report,
                          f"waiting for process 0 to write {directory / saved_tokenizer.INFO}")
    return saved_tokenizer.load(directory)


def _train_tokenizer(data, train_pieces, report) -> tuple[str, bytes, dict]:
    """A SentencePiece model trained on a bounded, seeded sample of the train sentences
    (config.data.tokenizer_sample_sentences, config.data.seed): the name, the bytes, and
    what it was trained on."""
    size = sample.check_size(data.get("tokenizer_sample_sentences", DEFAULT_SAMPLE),
                             "config.data.tokenizer_sample_sentences")
    if report:
        report(f"sampling at most {size:,} train sentences (seed {data.seed}) to train a "
               f"{data.tokenizer_type} SentencePiece tokenizer of {data.vocab_size} pieces")
    start = time.perf_counter()
    sentences = (s for doc in sources.StreamedDocuments(train_pieces) for s in doc)
    drawn = sample.sample_sentences(sentences, size, data.seed)
    if report:
        report(f"training on {len(drawn.sentences):,} of {drawn.seen:,} sentences (read in "
               f"{time.perf_counter() - start:.1f} s)")
    trained = tokenizers.train_sentencepiece(drawn.sentences, data.vocab_size,
                                             data.tokenizer_type)
    name = f"spm-{data.tokenizer_type}-{data.vocab_size}.model"
    with tempfile.TemporaryDirectory() as tmp:
        trained.save(os.path.join(tmp, name))
        with open(os.path.join(tmp, name), "rb") as f:
            content = f.read()
    return name, content, {"sample_sentences": size, "seed": int(data.seed),
                           "sentences": len(drawn.sentences), "corpus_sentences": drawn.seen}


def open_prepared(data: ml_collections.ConfigDict) -> PretrainingData:
    """The tokenizer and examples the prepare command wrote into config.data.prepared_dir,
    checked against config.data: a setting that differs is a ConfigError naming its key."""
    root = as_path(data.prepared_dir)
    if not (root / "train" / pretraining_store.MANIFEST).exists():
        raise MissingFileError(
            f"config.data.prepared_dir={data.prepared_dir!r} holds no finished preparation "
            f"({root / 'train' / pretraining_store.MANIFEST} is missing); run `python -m "
            "zoo.commands.prepare` with this config first (or set config.data.prepared_dir='' "
            "to prepare inside the job)")
    found = {s: PretrainingSource(str(root / s)) for s in _SPLITS}
    for split, want in settings(data).items():
        have = found[split].settings
        differ = [f"config.data.{_KEYS[f.name]}={getattr(want, f.name)!r} (prepared with "
                  f"{getattr(have, f.name)!r})" for f in dataclasses.fields(Settings)
                  if getattr(want, f.name) != getattr(have, f.name)]
        if differ:
            raise ConfigError(
                f"config.data.prepared_dir={data.prepared_dir!r} was prepared with other "
                f"settings: {'; '.join(differ)}. Set those keys as prepared, or prepare again "
                "into another directory with this config")
    saved_tokenizer.check_given(data, root / TOKENIZER_DIR)
    tokenizer = saved_tokenizer.load(root / TOKENIZER_DIR)
    return PretrainingData(tokenizer, found["train"], found["validation"])
