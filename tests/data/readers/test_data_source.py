"""config.data.source: one vocabulary (synthetic | files | tfds) for every job, the old spellings
('text', 'json') still read the same data with one notice, and the synthetic caches keep the
file names runs already made."""

import os

import ml_collections
import pytest

from configs import classify, common, gpt_classify, squad as squad_config, translate
from zoo import deprecation
from zoo.data.readers import (classification, data_source, multiple_choice, parallel, sources,
                              squad)
from zoo.errors import ConfigError
from zoo.tasks import squad as squad_task


@pytest.fixture(autouse=True)
def _fresh_notices(monkeypatch):
    monkeypatch.setattr(deprecation, "_noticed", set())


def _data(**values) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(values)


@pytest.mark.parametrize("given, meant", [("synthetic", "synthetic"), ("files", "files"),
                                          ("tfds", "tfds"), ("text", "files"), ("json", "files")])
def test_every_spelling_means_one_source(given, meant):
    assert data_source.source_of(_data(source=given)) == meant


def test_an_old_spelling_is_noticed_once_on_one_line(capsys):
    for _ in range(3):
        assert data_source.source_of(_data(source="text")) == "files"
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("zoo: deprecated: config.data.source='text' is now spelled 'files'")
    data_source.source_of(_data(source="files"))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("accepted, match", [
    (data_source.SOURCES,
     r"config\.data\.source must be 'synthetic', 'files' or 'tfds', got 'txt'"),
    (data_source.SOURCES[:2], r"config\.data\.source must be 'synthetic' or 'files', got 'txt'"),
])
def test_an_unknown_source_names_the_key_and_the_choices(accepted, match):
    with pytest.raises(ConfigError, match=match):
        data_source.source_of(_data(source="txt"), accepted)


def test_a_job_without_tfds_says_which_sources_it_takes(tmp_path):
    data = classify.get_config("size=tiny").data
    data.source = "tfds"
    with pytest.raises(ConfigError, match=r"must be 'synthetic' or 'files', got 'tfds'"):
        classification.load_split(data, "train", str(tmp_path))


def test_an_empty_file_key_names_the_key_and_the_source(tmp_path):
    data = squad_config.get_config("size=tiny").data
    data.source = "files"
    with pytest.raises(ConfigError, match=r"config\.data\.eval_file is empty; give a SQuAD JSON "
                                          r"file \(config\.data\.source='files'\)"):
        squad.load_split(data, "validation", str(tmp_path))


# The cache names every synthetic split had before one helper wrote them all: a run's cache_dir
# (shared between runs) must keep serving it.
def test_synthetic_caches_keep_their_names(tmp_path):
    jobs = [
        (classification, classify.get_config("size=tiny").data,
         "classify-fact_check-seed0-{n}-{split}.tsv"),
        (squad, squad_config.get_config("size=tiny").data, "squad-v1.1-seed0-{n}-{split}.json"),
        (multiple_choice, gpt_classify.get_config("size=tiny,task=multiple_choice").data,
         "multiple_choice-seed0-{n}-{split}.jsonl"),
    ]
    for reader, data, pattern in jobs:
        for split in ("train", "validation"):
            assert reader.load_split(data, split, str(tmp_path))
            assert pattern.format(n=data.synthetic_entities, split=split) in os.listdir(tmp_path)
    data = translate.get_config("size=tiny").data
    for split in ("train", "validation"):
        parallel.load_split(data, split, str(tmp_path))
    ops = "".join(data.synthetic_operations).replace("/", "d").replace("*", "x")
    assert {f"arith-seed0-{data.synthetic_pairs}-max{data.synthetic_max_operand}-{ops}-{s}.tsv"
            for s in ("train", "validation")} <= set(os.listdir(tmp_path))


def test_a_synthetic_split_is_written_once(tmp_path):
    made = []

    def splits():
        made.append(1)
        return {"train": ["a"], "validation": ["b"]}

    def write(path, rows):
        with open(path, "w") as f:
            f.write("".join(rows))

    first = data_source.synthetic_file(str(tmp_path), "stem", "train", ".txt", splits, write)
    again = data_source.synthetic_file(str(tmp_path), "stem", "train", ".txt", splits, write)
    assert first == again == os.path.join(str(tmp_path), "stem-train.txt")
    assert made == [1] and open(first).read() == "a"
    assert os.listdir(tmp_path) == ["stem-train.txt"]  # no temporary file left behind


def test_old_spellings_read_the_same_files(tmp_path):
    (tmp_path / "corpus.txt").write_text("One sentence.\nTwo sentences.\n\nA second document.\n")
    documents = {}
    for spelling in ("text", "files"):
        cfg = ml_collections.ConfigDict(common.source_config())
        cfg.update(source=spelling, train_files=str(tmp_path / "corpus.txt"))
        documents[spelling] = sources.load_documents(cfg, "train")
    assert documents["text"] == documents["files"] == [["One sentence.", "Two sentences."],
                                                       ["A second document."]]
    data = squad_config.get_config("size=tiny").data
    json_file = squad.load_split(data, "validation", str(tmp_path))  # the synthetic split
    path = os.path.join(tmp_path, f"squad-v1.1-seed0-{data.synthetic_entities}-validation.json")
    examples = {}
    for spelling in ("json", "files"):
        data.update(source=spelling, eval_file=path)
        examples[spelling] = squad.load_split(data, "validation", str(tmp_path))
    assert examples["json"] == examples["files"] == json_file


def test_a_squad_directory_prepared_as_json_serves_files():
    assert squad_task._same_setting("source", "json", "files")
    assert squad_task._same_setting("source", "files", "files")
    assert not squad_task._same_setting("source", "synthetic", "files")
    assert not squad_task._same_setting("seed", 0, 1)
