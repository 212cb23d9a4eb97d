"""Document sources: the synthetic default, local text files, and TFDS datasets read offline.

The TFDS tests build tiny real datasets (array_record files, as `tfds build
--file_format=array_record` writes them) in a temporary data_dir and read them through
`sources.load_documents` with the config a user would write.
"""

import json
import os
import shutil

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

from configs import common

from zoo.data.readers import sources, text_files, tfds_source
from zoo.data.synthetic.documents import corpus_splits

# Record text -> the document it must give (None: a blank record gives no document).
TRAIN = {
    "Ada Lovelace\nAda wrote the first program.\n\nShe worked with Babbage.\n":
        ["Ada Lovelace", "Ada wrote the first program.", "She worked with Babbage."],
    "Zürich liegt am Zürichsee.": ["Zürich liegt am Zürichsee."],
    "東京は日本の首都です。\r\n  It is very large.  \r\n": ["東京は日本の首都です。", "It is very large."],
    "One sentence only.": ["One sentence only."],
    "Ελληνικά κείμενα.\nΔεύτερη γραμμή.\n\n\nΤρίτη.":
        ["Ελληνικά κείμενα.", "Δεύτερη γραμμή.", "Τρίτη."],
    "  \n\n \r\n": None,
    "Emoji 🙂 stay whole.\nA\u2028line separator is not a break.":
        ["Emoji 🙂 stay whole.", "A\u2028line separator is not a break."],
    "Last one.": ["Last one."],
}
TEST = {
    "Москва — столица.\nЭто второе предложение.": ["Москва — столица.", "Это второе предложение."],
    "Short test record.": ["Short test record."],
}
# 'broken' holds one record whose bytes are not UTF-8 among valid ones.
BROKEN = [b"fine record", b"caf\xe9 latin-1, not UTF-8", b"also fine"]
# TFDS 4.9.10 finds a builder's code (for checksums) through `importlib_resources`, a package it
# only requires on Python < 3.9, whenever the builder's module is nested in a package, as test
# modules are; under a top-level module name it finds no code and skips checksums.
_BUILDER_MODULE = "zoo_test_tfds_builders"


class ZooTinyText(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A Wikipedia-shaped corpus whose builder code TFDS does not know: read from files alone."""

    __module__ = _BUILDER_MODULE
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict({
                "title": tfds.features.Text(),
                "text": tfds.features.Text(),
                "id": tfds.features.Scalar(np.int64),
            }),
        )

    def _split_generators(self, dl_manager):
        return {
            "train": self._generate_examples(list(TRAIN)),
            "test": self._generate_examples(list(TEST)),
            "broken": self._generate_examples(BROKEN),
        }

    def _generate_examples(self, texts):
        for i, text in enumerate(texts):
            yield i, {"title": f"doc {i}", "text": text, "id": i}


def _lm1b_builder_class():
    # The registered lm1b code reads our files when they sit at the version that code declares.
    version = tfds.builder_cls("lm1b").VERSION

    class Lm1b(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        __module__ = _BUILDER_MODULE
        VERSION = version

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()})
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(["The cat sat .", "Über alles ."]),
                    "test": self._generate_examples(["A held-out sentence ."])}

        def _generate_examples(self, texts):
            for i, text in enumerate(texts):
                yield i, {"text": text}

    return Lm1b


def _prepare(builder_class, data_dir) -> None:
    builder = builder_class(data_dir=str(data_dir), file_format="array_record")
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False)
    )


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tfds")
    _prepare(ZooTinyText, path)
    _prepare(_lm1b_builder_class(), path)
    return str(path)


def _raw_texts(data_dir, split, name="zoo_tiny_text") -> list[bytes]:
    """The split's texts in stored order, read with TFDS alone (TFDS shuffles at build time)."""
    source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    return [source[i]["text"] for i in range(len(source))]


def _expected(table, texts) -> list[list[str]]:
    docs = [table[t.decode("utf-8")] for t in texts]
    return [d for d in docs if d is not None]


def _cfg(**overrides) -> ml_collections.ConfigDict:
    # The source block every job's config carries, pointed at the test dataset.
    cfg = ml_collections.ConfigDict(common.source_config())
    cfg.update(source="tfds", tfds_name="zoo_tiny_text")
    cfg.update(overrides)
    return cfg


# --- TFDS: documents -------------------------------------------------------------------------


def test_tfds_records_become_documents_of_their_lines(data_dir):
    cfg = _cfg(tfds_data_dir=data_dir)
    train = sources.load_documents(cfg, "train")
    # Stored order is kept, each record is one document, the blank record gives none.
    assert train == _expected(TRAIN, _raw_texts(data_dir, "train"))
    assert sorted(train) == sorted(d for d in TRAIN.values() if d is not None)
    assert sorted(sources.load_documents(cfg, "test")) == sorted(TEST.values())


def test_tfds_splits_map_and_slice_by_config(data_dir):
    raw = _raw_texts(data_dir, "train")
    # lm1b style: no validation split, so validation reads 'test'.
    cfg = _cfg(tfds_data_dir=data_dir, tfds_validation_split="test")
    assert sources.load_documents(cfg, "validation") == sources.load_documents(cfg, "test")
    # Carve validation out of train with TFDS slices: disjoint, together the whole split.
    cfg = _cfg(tfds_data_dir=data_dir, tfds_train_split="train[2:]",
               tfds_validation_split="train[:2]")
    assert sources.load_documents(cfg, "validation") == _expected(TRAIN, raw[:2])
    assert sources.load_documents(cfg, "train") == _expected(TRAIN, raw[2:])
    cfg = _cfg(tfds_data_dir=data_dir, tfds_train_split="train[:50%]+test")
    assert sources.load_documents(cfg, "train") == _expected(
        TRAIN | TEST, raw[:4] + _raw_texts(data_dir, "test"))


@pytest.mark.parametrize("cap", [1, 3, 100])
def test_tfds_max_records_reads_the_first_records(data_dir, cap):
    cfg = _cfg(tfds_data_dir=data_dir, tfds_max_records=cap)
    assert sources.load_documents(cfg, "train") == _expected(
        TRAIN, _raw_texts(data_dir, "train")[:cap])


def test_tfds_reads_a_registered_builder_prepared_offline(data_dir):
    # lm1b's own builder code (not the files-only reader) opens it; one line = one sentence.
    builder = tfds_source.open_builder("lm1b", data_dir)
    assert not isinstance(builder, tfds.core.read_only_builder.ReadOnlyBuilder)
    cfg = _cfg(tfds_name="lm1b", tfds_data_dir=data_dir, tfds_validation_split="test")
    assert sorted(sources.load_documents(cfg, "train")) == [["The cat sat ."], ["Über alles ."]]
    assert sources.load_documents(cfg, "validation") == [["A held-out sentence ."]]


# --- TFDS: errors ----------------------------------------------------------------------------


@pytest.fixture
def no_downloads(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("download_and_prepare must never run")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", fail)


@pytest.mark.parametrize("name", ["lm1b", "zoo_never_built", "wikipedia/20230601.en"])
def test_tfds_missing_dataset_says_where_and_how_to_prepare(tmp_path, no_downloads, name):
    empty = str(tmp_path / "empty")
    with pytest.raises(FileNotFoundError) as e:
        sources.load_documents(_cfg(tfds_name=name, tfds_data_dir=empty), "train")
    message = str(e.value)
    for part in (repr(name), repr(empty), "config.data.tfds_data_dir", "config.data.tfds_name",
                 f"tfds build {name} --file_format=array_record"):
        assert part in message


def test_tfds_missing_version_lists_the_prepared_ones(data_dir, no_downloads):
    with pytest.raises(FileNotFoundError, match=r"Prepared there: 'zoo_tiny_text:1\.0\.0';"):
        sources.load_documents(_cfg(tfds_name="zoo_tiny_text:9.9.9", tfds_data_dir=data_dir),
                               "train")


def test_tfds_empty_data_dir_means_the_tfds_default(data_dir, monkeypatch, tmp_path,
                                                   no_downloads):
    monkeypatch.setattr(tfds.core.constants, "DATA_DIR", data_dir)
    cfg = _cfg(tfds_data_dir="", tfds_validation_split="test")
    assert sources.load_documents(cfg, "validation") == sources.load_documents(
        _cfg(tfds_data_dir=data_dir), "test")
    monkeypatch.setattr(tfds.core.constants, "DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=f"the TFDS default data_dir '{tmp_path}'"):
        sources.load_documents(cfg, "train")


def test_tfds_dataset_without_random_access_format_is_rejected(data_dir, tmp_path):
    # The same files, but its info says tfrecord: what a default `tfds build` leaves.
    copy = tmp_path / "zoo_tiny_text"
    shutil.copytree(os.path.join(data_dir, "zoo_tiny_text"), copy)
    info_path = copy / "1.0.0" / "dataset_info.json"
    info = json.loads(info_path.read_text())
    info["fileFormat"] = "tfrecord"
    info_path.write_text(json.dumps(info))
    with pytest.raises(ValueError, match="tfrecord.*convert_format.*array_record"):
        sources.load_documents(_cfg(tfds_data_dir=str(tmp_path)), "train")


def test_tfds_missing_text_feature_lists_features_and_key(data_dir):
    with pytest.raises(ValueError) as e:
        sources.load_documents(_cfg(tfds_data_dir=data_dir, tfds_text_key="body"), "train")
    assert "'body'" in str(e.value) and "config.data.tfds_text_key" in str(e.value)
    assert "its features are id, text, title" in str(e.value)


def test_tfds_non_text_feature_is_rejected_naming_the_text_ones(data_dir):
    with pytest.raises(ValueError, match=r"'id'.*not text.*tfds_text_key.*: text, title\."):
        sources.load_documents(_cfg(tfds_data_dir=data_dir, tfds_text_key="id"), "train")


def test_tfds_unknown_split_names_key_and_available_splits(data_dir):
    # The default validation split does not exist in this (lm1b-like) dataset.
    with pytest.raises(ValueError) as e:
        sources.load_documents(_cfg(tfds_data_dir=data_dir), "validation")
    message = str(e.value)
    assert "config.data.tfds_validation_split='validation'" in message
    assert "train (8 records)" in message and "test (2 records)" in message


def test_tfds_invalid_utf8_names_dataset_split_and_record(data_dir):
    raw = _raw_texts(data_dir, "broken")
    bad = raw.index(BROKEN[1])
    with pytest.raises(ValueError) as e:
        sources.load_documents(_cfg(tfds_data_dir=data_dir, tfds_train_split="broken"), "train")
    message = str(e.value)
    for part in ("'zoo_tiny_text'", "split 'broken'", "config.data.tfds_train_split",
                 f"record {bad}:", "0xe9"):
        assert part in message


@pytest.mark.parametrize("overrides, match", [
    (dict(tfds_name=""), "config.data.tfds_name is empty"),
    (dict(tfds_max_records=-1), "config.data.tfds_max_records must be >= 0"),
])
def test_tfds_bad_config_values_are_named(overrides, match):
    with pytest.raises(ValueError, match=match):
        sources.load_documents(_cfg(**overrides), "train")


# --- local text files and the synthetic default ----------------------------------------------


def test_text_source_reads_globbed_files_in_sorted_order(tmp_path):
    text_files.write_text_corpus(tmp_path / "b.txt", [["B one.", "B two."]])
    text_files.write_text_corpus(tmp_path / "a1.txt", [["A one."], ["A two.", "A three."]])
    text_files.write_text_corpus(tmp_path / "eval.txt", [["Ünïcode eval."]])
    cfg = _cfg(source="files", train_files=f"{tmp_path}/b.txt, {tmp_path}/a*.txt",
               eval_files=str(tmp_path / "eval.txt"))
    assert sources.load_documents(cfg, "train") == [
        ["A one."], ["A two.", "A three."], ["B one.", "B two."]]
    assert sources.load_documents(cfg, "validation") == [["Ünïcode eval."]]
    assert sources.load_documents(cfg, "test") == [["Ünïcode eval."]]


def test_text_source_reads_directories_of_files(tmp_path):
    corpus = tmp_path / "wiki"
    (corpus / "AA").mkdir(parents=True)
    (corpus / ".cache").mkdir()
    text_files.write_text_corpus(corpus / "AA" / "wiki_01", [["Second file."]])
    text_files.write_text_corpus(corpus / "AA" / "wiki_00", [["First file.", "Still first."]])
    text_files.write_text_corpus(corpus / "top.txt", [["Top level."]])
    (corpus / ".cache" / "junk").write_bytes(b"\xff\xfe not text")  # hidden: never read
    (corpus / ".hidden.txt").write_bytes(b"\xff")
    cfg = _cfg(source="files", train_files=str(corpus), eval_files=str(corpus / "top.txt"))
    assert sources.load_documents(cfg, "train") == [
        ["First file.", "Still first."], ["Second file."], ["Top level."]]


@pytest.mark.parametrize("split, key", [("train", "config.data.train_files"),
                                        ("test", "config.data.eval_files")])
def test_text_source_without_files_names_the_config_key(tmp_path, split, key):
    cfg = _cfg(source="files", train_files=f"{tmp_path}/*.txt", eval_files="")
    with pytest.raises(FileNotFoundError, match=key):
        sources.load_documents(cfg, split)


def test_synthetic_default_gives_the_seeded_corpus_splits():
    cfg = _cfg(source="synthetic", seed=3)
    expected = corpus_splits(seed=3)
    for split in ("train", "validation", "test"):
        assert sources.load_documents(cfg, split) == [list(d.texts) for d in expected[split]]
    assert sources.load_documents(cfg, "train") != sources.load_documents(_cfg(source="synthetic",
                                                                               seed=4), "train")


@pytest.mark.parametrize("overrides, split, match", [
    (dict(source="hub"), "train", "'synthetic', 'files' or 'tfds'"),
    (dict(source="synthetic"), "dev", "split must be one of"),
])
def test_bad_source_or_split_is_rejected(overrides, split, match):
    with pytest.raises(ValueError, match=match):
        sources.load_documents(_cfg(**overrides), split)
