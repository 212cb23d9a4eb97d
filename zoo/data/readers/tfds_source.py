"""TFDS text corpora (lm1b, Wikipedia, ...) read from a local data_dir, without TensorFlow.

Nothing is downloaded: a dataset must already be prepared in `data_dir` in a random-access format
(array_record, as `tfds build --file_format=array_record` writes it). TFDS reads those files
through its data-source API (`builder.as_data_source`) with no TensorFlow; `tfds.load` and the
default tfrecord format would need TensorFlow, so neither is used.

One record is one document. Its text is split into sentences on line breaks: a one-line record
(lm1b) is a one-sentence document, a Wikipedia article a document of its lines (paragraphs).
"""

import glob
import os
from collections.abc import Iterator, Sequence

import ml_collections
import numpy as np
import tensorflow_datasets as tfds

from zoo import paths
from zoo.errors import ConfigError, DataError, MissingFileError

Documents = list[list[str]]
# Our split name -> the config.data key holding the TFDS split (or slice) it reads.
SPLIT_KEYS = {
    "train": "tfds_train_split",
    "validation": "tfds_validation_split",
    "test": "tfds_test_split",
}
_READ_CHUNK = 4096  # records per batched array_record read


def _base_name(name: str) -> str:
    """'wikipedia/20230601.en:1.0.0' -> 'wikipedia', the folder it lives in under data_dir."""
    return name.split("/")[0].split(":")[0]


def _prepared_names(name: str, data_dir: str) -> list[str]:
    """Full names ('dataset[/config]:version') of what is prepared on disk under `name`'s folder,
    for a hint when the one asked for is missing."""
    base = _base_name(name)
    if paths.is_remote(data_dir):
        return []  # only a hint: not worth listing a bucket for
    root = os.path.join(os.path.expanduser(data_dir), base)
    infos = glob.glob(os.path.join(root, "*", "dataset_info.json"))
    infos += glob.glob(os.path.join(root, "*", "*", "dataset_info.json"))
    names = []
    for info in infos:
        *config, version = os.path.relpath(os.path.dirname(info), root).split(os.sep)
        names.append("/".join([base, *config]) + ":" + version)
    return sorted(names)


def _not_prepared(name: str, data_dir: str) -> MissingFileError:
    where = repr(data_dir)
    if not data_dir:
        data_dir = tfds.core.constants.DATA_DIR  # $TFDS_DATA_DIR, else ~/tensorflow_datasets
        where = f"the TFDS default data_dir {data_dir!r}"
    found = _prepared_names(name, data_dir)
    hint = ""
    if found:
        hint = (
            f"\nPrepared there: {', '.join(map(repr, found))}; config.data.tfds_name may name "
            "one of them."
        )
    return MissingFileError(
        f"TFDS dataset {name!r} (config.data.tfds_name) is not prepared in {where} "
        "(config.data.tfds_data_dir), and nothing is downloaded here. Prepare it on a machine "
        "with internet access (plus any extras its builder asks for, e.g. apache-beam for "
        "wikipedia):\n"
        "    pip install tensorflow-datasets tensorflow\n"
        f"    tfds build {name.split(':')[0]} --file_format=array_record --data_dir=DIR\n"
        f"then copy DIR/{_base_name(name)} into that data_dir (array_record files are read "
        "without TensorFlow; tfrecord ones are not)." + hint
    )


def open_builder(name: str, data_dir: str = "") -> tfds.core.DatasetBuilder:
    """The prepared, random-access TFDS builder of `name` in `data_dir`; never downloads.

    Args:
      name: 'dataset[/config][:version]', e.g. 'lm1b' or 'wikipedia/20230601.en'. Datasets whose
        builder code TFDS lacks are read from their files alone.
      data_dir: the TFDS data dir holding it, local or gs://; '' means TFDS's default.

    Raises:
      FileNotFoundError: it is not prepared there (the message says how to prepare it).
      ValueError: it is prepared only in a format without random access (tfrecord).
    """
    # TFDS finds the files through epath (gcsfs); array_record then reads them with its own
    # GCS client (google-cloud-cpp), which retries an unreachable endpoint for minutes.
    paths.check_remote(data_dir, "config.data.tfds_data_dir")
    try:
        builder = tfds.builder(name, data_dir=data_dir or None)
    except tfds.core.DatasetNotFoundError:
        raise _not_prepared(name, data_dir) from None
    # Registered builders (lm1b) construct even when nothing is on disk; ask, never download.
    if not builder.is_prepared():
        raise _not_prepared(name, data_dir)
    formats = builder.info.available_file_formats()
    if not formats & set(tfds.core.FileFormat.with_random_access()):
        raise DataError(
            f"TFDS dataset {name!r} in {builder.data_dir} is stored as "
            f"{', '.join(sorted(f.value for f in formats)) or 'an unknown format'}, which only "
            "TensorFlow can read. Convert it where tensorflow is installed: `tfds convert_format "
            f"--dataset_version_dir={builder.data_dir} --out_file_format=array_record`, or "
            "rebuild it with `tfds build ... --file_format=array_record`."
        )
    return builder


def _check_text_feature(builder: tfds.core.DatasetBuilder, name: str, text_key: str) -> None:
    features = builder.info.features
    keys = sorted(features.keys())

    def is_text(key: str) -> bool:
        # Text and scalar string Tensors decode to bytes; Sequences, dicts and numbers do not.
        f = features[key]
        return getattr(f, "shape", None) == () and np.dtype(f.np_dtype) == np.dtype(object)

    if text_key not in keys:
        raise ConfigError(
            f"TFDS dataset {name!r} has no feature {text_key!r}; its features are "
            f"{', '.join(keys)}. Set config.data.tfds_text_key to its text feature."
        )
    if not is_text(text_key):
        texts = [k for k in keys if is_text(k)]
        raise ConfigError(
            f"feature {text_key!r} of TFDS dataset {name!r} is {features[text_key]!r}, not text; "
            f"set config.data.tfds_text_key to one of its text features: "
            f"{', '.join(texts) or '(none)'}."
        )


def open_split(builder: tfds.core.DatasetBuilder, name: str, split: str, key: str = ""
               ) -> Sequence[dict]:
    """The random-access records of `split` (a name or TFDS slicing); a split the dataset cannot
    read is a ValueError listing its splits (naming config.data.<key> when given)."""
    try:
        return builder.as_data_source(split=split)
    except ValueError as e:
        available = ", ".join(
            f"{s} ({info.num_examples} records)" for s, info in builder.info.splits.items()
        )
        what = f"config.data.{key}={split!r}" if key else f"split {split!r}"
        raise ConfigError(
            f"{what} cannot be read from TFDS dataset {name!r}: {e}\n"
            f"Its splits: {available}. Give a split name or TFDS slicing syntax, e.g. "
            "'train[:1%]', 'train[1%:]', 'train[:5000]', 'train+test'."
        ) from None


def document_from_text(text: str) -> list[str]:
    """A record's text -> its sentences: stripped non-blank lines (no sentence for blank text)."""
    # split("\n"), not splitlines(): the latter also breaks on \x0c, \u2028, ... inside sentences.
    return [s for line in text.split("\n") if (s := line.strip())]


def _decode(value, where: str, index: int) -> str:
    if isinstance(value, str):
        return value
    data = bytes(value)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{where}, record {index}: invalid UTF-8 byte 0x{data[e.start]:02x} at byte "
            f"{e.start}; the text must be UTF-8 (fix or drop the record and rebuild the dataset)"
        ) from None


def load_documents(cfg: ml_collections.ConfigDict, split: str) -> Documents:
    """Documents of our `split` ('train' | 'validation' | 'test') from a TFDS dataset.

    Reads config.data keys: tfds_name, tfds_data_dir, tfds_text_key, tfds_<split>_split (a TFDS
    split or slice) and tfds_max_records (0 = all; else the first N records of the split, a
    random sample because TFDS shuffles records when it prepares a dataset, unless its builder
    disables that). Records are read in stored order; blank records give no document.
    """
    source, where = open_records(cfg, split)
    return list(documents_of_records(source, 0, num_records(cfg, source), cfg.tfds_text_key,
                                     where))


def open_records(cfg: ml_collections.ConfigDict, split: str) -> tuple[Sequence[dict], str]:
    """The checked random-access records of our `split` and a description for messages."""
    if split not in SPLIT_KEYS:
        raise ValueError(f"split must be one of {tuple(SPLIT_KEYS)}, got {split!r}")
    name = cfg.tfds_name
    if not name:
        raise ConfigError(
            "config.data.tfds_name is empty; set it to a TFDS dataset prepared in "
            "config.data.tfds_data_dir, e.g. 'lm1b' or 'wikipedia/20230601.en'"
        )
    if cfg.tfds_max_records < 0:
        raise ConfigError(
            f"config.data.tfds_max_records must be >= 0 (0 reads every record), "
            f"got {cfg.tfds_max_records}"
        )
    key = SPLIT_KEYS[split]
    builder = open_builder(name, cfg.tfds_data_dir)
    _check_text_feature(builder, name, cfg.tfds_text_key)
    return (open_split(builder, name, cfg[key], key),
            f"TFDS dataset {name!r} split {cfg[key]!r} (config.data.{key})")


def num_records(cfg: ml_collections.ConfigDict, source: Sequence[dict]) -> int:
    """How many records of `source` a job reads: all, or the first config.data.tfds_max_records."""
    return len(source) if cfg.tfds_max_records == 0 else min(len(source), cfg.tfds_max_records)


def documents_of_records(source: Sequence[dict], start: int, stop: int, text_key: str,
                         where: str) -> Iterator[list[str]]:
    """The documents of records [start, stop), streamed; blank records give no document."""
    for lo in range(start, stop, _READ_CHUNK):
        # One batched read per chunk: ~3x faster than record by record (26 vs 79 us per
        # lm1b-sized record here), which matters for tens of millions of records.
        records = source.__getitems__(list(range(lo, min(stop, lo + _READ_CHUNK))))
        for index, record in enumerate(records, lo):
            document = document_from_text(_decode(record[text_key], where, index))
            if document:
                yield document
