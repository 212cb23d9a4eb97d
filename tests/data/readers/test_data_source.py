"""config.data.source: one vocabulary (synthetic | files | tfds) for every job, anything else one
error naming the key and the choices, and the synthetic caches keep the file names runs already
made."""

import os

import ml_collections
import pytest

from configs import classify, gpt_classify, squad as squad_config, translate
from zoo.data.readers import (classification, data_source, multiple_choice, parallel,
                              squad)
from zoo.errors import ConfigError


def _data(**values) -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(values)


@pytest.mark.parametrize("given", ["synthetic", "files", "tfds"])
def test_every_job_takes_the_same_three_words(given):
    assert data_source.source_of(_data(source=given)) == given


@pytest.mark.parametrize("given", ["txt", "text", "json"])
@pytest.mark.parametrize("accepted, choices", [
    (data_source.SOURCES, "'synthetic', 'files' or 'tfds'"),
    (data_source.SOURCES[:2], "'synthetic' or 'files'"),
])
def test_an_unknown_source_names_the_key_and_the_choices(accepted, choices, given):
    with pytest.raises(ConfigError, match=rf"config\.data\.source must be {choices}, got "
                                          rf"'{given}'"):
        data_source.source_of(_data(source=given), accepted)


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
@pytest.mark.slow
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
