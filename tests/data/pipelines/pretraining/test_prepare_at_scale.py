"""Preparation at scale: what a waiting host costs the bucket per poll, a tokenizer trained on
a bounded sample of the corpus, and a local disk checked for room before anything starts."""

import json
import threading
import time
import types

import pytest

from configs import bert_pretrain
from zoo import paths
from zoo.data.pipelines.pretraining import progress as preparation_progress
from zoo.data.pipelines.pretraining import free_space as preparation_space
from zoo.data.pipelines import pretraining as pt
from zoo.data.pipelines.pretraining import job_data as pretraining_data
from zoo.data.pipelines.pretraining import examples
from zoo.data.pipelines.pretraining import store
from zoo.data.readers import corpus_pieces, sources, text_files
from zoo.data.tokenizers import base as tokenizers
from zoo.data.tokenizers import prepared as saved_tokenizer
from zoo.errors import ConfigError, UserError


def test_a_waiting_host_lists_the_markers_once_per_poll_and_reads_none(gcs_knobs, gcs_bucket):
    directory = paths.as_path(f"{gcs_bucket}/prepared/train")
    for shard in range(3):
        store.write_json(directory / store.marker_file(shard), {"rows": 1, "is_next": 0})
        paths.write_atomic(directory / store.shard_file(shard), b"rows")
    lines = []
    mark = gcs_knobs.mark()
    thread = threading.Thread(target=pt._wait_for_shards,
                              args=(directory, 4, lines.append, 0.05), daemon=True)
    thread.start()
    deadline = time.time() + 10
    while len(lines) < 3 and time.time() < deadline:
        time.sleep(0.01)
    store.write_json(directory / store.marker_file(3), {"rows": 1, "is_next": 0})
    thread.join(10)
    assert not thread.is_alive(), "the wait did not end when the last marker came"
    # The writes and gcsfs's one-off question about the bucket (its type, asked by an upload)
    # are not the poller's: what a poll could cost per marker is a listing, a stat or a read.
    polls = [r for r in gcs_knobs.requests(mark) if r["op"] in ("list", "stat", "read")]
    # each report line is a poll that found a shard missing; the last poll found none missing
    assert [(r["op"], r["prefix"]) for r in polls] == [
        ("list", "prepared/train/shard-")] * (len(lines) + 1)
    assert "waiting for 1 of 4 shards from other processes (e.g. 3)" in lines[0]


def test_markers_are_listed_in_pages_of_names(gcs_knobs, gcs_bucket):
    directory = paths.as_path(f"{gcs_bucket}/prepared/train")
    for shard in (0, 2, 5, 7, 8):
        store.write_json(directory / store.marker_file(shard), {"rows": shard, "is_next": 0})
    mark = gcs_knobs.mark()
    names = paths.list_names(directory, "shard-", page_size=2)
    assert names == [store.marker_file(i) for i in (0, 2, 5, 7, 8)]
    assert len(gcs_knobs.requests(mark)) == 3
    assert store.done_shards(directory) == {0, 2, 5, 7, 8}
    assert store.read_markers(directory, [2, 7]) == {2: {"rows": 2, "is_next": 0},
                                                      7: {"rows": 7, "is_next": 0}}
    assert store.done_shards(paths.as_path(f"{gcs_bucket}/nothing/here")) == set()


def _text_data(corpus, tmp_path, **overrides):
    text_files.write_text_corpus(tmp_path / "train.txt", corpus["train"])
    data = bert_pretrain.get_config("size=tiny").data
    data.update(source="files", train_files=str(tmp_path / "train.txt"), vocab_size=200,
                **overrides)
    return data


def test_the_tokenizer_trains_on_a_bounded_seeded_sample_recorded_beside_it(
        corpus, tmp_path, monkeypatch):
    data = _text_data(corpus, tmp_path, tokenizer_sample_sentences=300, seed=4)
    seen = []
    real = tokenizers.train_sentencepiece
    monkeypatch.setattr(tokenizers, "train_sentencepiece",
                        lambda texts, *a: seen.append(len(texts)) or real(texts, *a))
    pieces = sources.plan_pieces(data, "train")
    lines = []
    pretraining_data._write_tokenizer(data, paths.as_path(tmp_path / "tok"), pieces, 0,
                                      lines.append)
    total = sum(len(doc) for doc in corpus["train"])
    assert seen == [300] and total > 300
    info = json.loads((tmp_path / "tok" / saved_tokenizer.INFO).read_text())
    assert info["trained_on"] == {"sample_sentences": 300, "seed": 4, "sentences": 300,
                                  "corpus_sentences": total}
    assert any(f"training on 300 of {total:,} sentences" in line for line in lines)
    pretraining_data._write_tokenizer(data, paths.as_path(tmp_path / "again"), pieces, 0, None)
    model = info["file"]
    assert (tmp_path / "tok" / model).read_bytes() == (tmp_path / "again" / model).read_bytes()


def test_a_bad_sample_size_is_one_error_naming_the_key(corpus, tmp_path):
    data = _text_data(corpus, tmp_path, tokenizer_sample_sentences=0)
    with pytest.raises(ConfigError, match="config.data.tokenizer_sample_sentences=0"):
        pretraining_data._write_tokenizer(data, paths.as_path(tmp_path / "tok"),
                                          sources.plan_pieces(data, "train"), 0, None)


def _small_disk(monkeypatch, free):
    monkeypatch.setattr(preparation_space.shutil, "disk_usage",
                        lambda path: types.SimpleNamespace(free=free))


def test_a_disk_too_small_is_refused_before_anything_is_written(corpus, tmp_path,
                                                                monkeypatch):
    data = _text_data(corpus, tmp_path, eval_files=str(tmp_path / "train.txt"))
    _small_disk(monkeypatch, 10_000)
    out = tmp_path / "prepared"
    with pytest.raises(UserError, match=rf"config.data.prepared_dir={out}: preparing needs "
                                        r"about .* GB more .*its disk has 0.00 GB free.*"
                                        r"config.data.dupe_factor"):
        pretraining_data.prepare(data, str(tmp_path / "cache"), str(out))
    assert not out.exists()  # not even the tokenizer was trained
    with pytest.raises(UserError, match=rf"config.data.cache_dir={tmp_path / 'cache'}: "):
        pretraining_data.prepare(data, str(tmp_path / "cache"))


def test_what_a_resumed_preparation_holds_already_counts_as_written(corpus, tmp_path,
                                                                    monkeypatch):
    data = _text_data(corpus, tmp_path)
    pieces = {"train": sources.plan_pieces(data, "train")}
    settings = pretraining_data.settings(data)
    _, needed = preparation_space.estimate(pieces["train"][0].size, settings["train"],
                                           data.vocab_size)
    (tmp_path / "prepared" / "train").mkdir(parents=True)
    (tmp_path / "prepared" / "train" / "examples-00000.npy").write_bytes(b"x" * needed)
    _small_disk(monkeypatch, 10_000)
    preparation_space.check_free_space(tmp_path / "prepared", "k", pieces, settings,
                                       data.vocab_size)


def test_the_estimate_is_within_a_factor_of_three_of_what_is_written(corpus, tok, tmp_path):
    text_files.write_text_corpus(tmp_path / "a.txt", corpus["train"])
    size = (tmp_path / "a.txt").stat().st_size
    pieces = corpus_pieces.plan_text([str(tmp_path / "a.txt")], size // 3 + 1)
    settings = examples.Settings(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2)
    pt.prepare_pieces(pieces, tok, str(tmp_path / "p"), settings)
    written = sum(f.stat().st_size for f in (tmp_path / "p").iterdir())
    _, estimated = preparation_space.estimate(size, settings, tok.vocab_size)
    assert written / 3 < estimated < written * 3, (estimated, written)


def test_the_progress_line_gives_shards_examples_per_second_and_an_eta(monkeypatch):
    clock = iter([100.0, 102.0, 104.0])
    monkeypatch.setattr(preparation_progress.time, "perf_counter", lambda: next(clock))
    progress = preparation_progress.Progress(4, 4_000_000, "MB", 2)
    assert progress.update(1_000_000, 300) == (
        "[#####...............] shards 1/4 | 1.0 of 4.0 MB | 150 examples/s, 0.50 MB/s | "
        "2 workers | ETA 0:00:06")
    assert progress.update(2_000_000, 500).endswith("200 examples/s, 0.75 MB/s | 2 workers | "
                                                    "ETA 0:00:01")


def test_preparation_reports_that_line_per_shard(corpus, tok, tmp_path):
    text_files.write_text_corpus(tmp_path / "a.txt", corpus["train"])
    size = (tmp_path / "a.txt").stat().st_size
    lines = []
    pt.prepare_pieces(corpus_pieces.plan_text([str(tmp_path / "a.txt")], size // 2 + 1), tok,
                      str(tmp_path / "p"), examples.Settings(max_seq_length=64, dupe_factor=1,
                                                             max_predictions_per_seq=10),
                      report=lines.append)
    assert [line.split(" | ")[0][-10:] for line in lines] == ["shards 1/2", "shards 2/2"]
    assert "examples/s" in lines[-1] and lines[-1].endswith("ETA 0:00:00")
