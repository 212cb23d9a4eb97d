"""benchmarks.quality_word2vec: the similarity sets read from gensim's wheel, the Spearman zoo's
side and gensim's are scored by (equal to gensim's own evaluate_word_pairs on the same pairs),
the per-pass reshuffle the peer reads, the vocabulary check, and (acceptance) a --quick run."""

import json
import os

import numpy as np
import pytest

from benchmarks import quality_word2vec as bench
from zoo.data.readers import word2vec as w2v_data

pytest.importorskip("gensim")


def test_the_sets_are_gensims_copies_lowercased():
    wordsim, simlex = bench.similarity_pairs("wordsim353"), bench.similarity_pairs("simlex999")
    assert len(wordsim) == 353 and len(simlex) == 999
    assert wordsim[0] == ("love", "sex", 6.77) and simlex[0] == ("old", "new", 1.58)
    assert all(a == a.lower() and b == b.lower() for a, b, _ in wordsim + simlex)


def test_spearman_is_gensims_evaluate_word_pairs_on_the_same_pairs():
    from gensim.models import KeyedVectors
    from gensim.test.utils import datapath

    # A vocabulary holding some of WordSim's words: pairs with a word outside it are skipped.
    words = sorted({w for a, b, _ in bench.similarity_pairs("wordsim353")[:120] for w in (a, b)})
    vectors = np.random.default_rng(0).normal(size=(len(words), 16)).astype(np.float32)
    sets = bench.usable_pairs(set(words))
    ours = bench.scores(vectors, words, sets)["wordsim353"]
    kv = KeyedVectors(16)
    kv.add_vectors(words, vectors)
    _, theirs, oov = kv.evaluate_word_pairs(datapath("wordsim353.tsv"))
    assert ours == pytest.approx(theirs.statistic, abs=1e-6)
    assert len(sets["wordsim353"]["skipped"]) == pytest.approx(353 * oov / 100)
    assert len(sets["wordsim353"]["pairs"]) + len(sets["wordsim353"]["skipped"]) == 353


def test_the_peer_reads_every_sentence_once_a_pass_in_a_new_order():
    sentences = [[str(i)] for i in range(50)]
    corpus = bench.Reshuffled(sentences, seed=3)
    first, second = list(corpus), list(corpus)
    assert sorted(first) == sorted(second) == sorted(sentences)
    assert first != second
    assert list(bench.Reshuffled(sentences, seed=3)) == first  # seeded


def test_gensim_is_stopped_when_its_vocabulary_is_not_zoos():
    config = bench.job_config("corpora", "cbow", 0, batch_size=64)
    sentences = [["a", "b", "a"], ["a", "c"]] * 5
    vocab = w2v_data.build_vocabulary(sentences, min_count=6)  # zoo's: 'a' only
    with pytest.raises(RuntimeError, match="gensim's vocabulary differs from zoo's"):
        bench.train_gensim(config, sentences, vocab, {}, "file", 1, log=lambda line: None)


def test_the_benchmark_reads_every_split_of_the_three_corpora():
    config = bench.job_config("DIR", "skipgram", 1)
    files = config.data.train_files.split(",")
    assert len(files) == 9 and files[0] == os.path.join("DIR", "brown", "train.txt")
    assert {os.path.basename(f) for f in files} == {"train.txt", "validation.txt", "test.txt"}
    assert config.data.seed == config.train.seed == 1
    assert config.optim.name == "sgd"  # the job's own recipe


@pytest.mark.acceptance
def test_quick_run_writes_the_report(tmp_path):
    paths = bench.run(bench.parse_args(["--quick", "--out", str(tmp_path)]))
    assert sorted(os.path.basename(p) for p in paths) == [
        "quality_word2vec.jsonl", "quality_word2vec.md", "quality_word2vec.png"]
    lines = [json.loads(line) for line in open(tmp_path / "quality_word2vec.jsonl")]
    assert lines[0]["record"] == "header" and [r["mode"] for r in lines[1:]] == [
        "skipgram", "cbow"]
    for record in lines[1:]:
        # zoo trained one pass over every row drawn, less the last partial batch.
        zoo = record["zoo"]
        assert zoo["rows"] - zoo["batch_size"] < zoo["rows_trained"] <= zoo["rows"]
        # One point a pass (at the step nearest its end).
        assert [p[0] for p in zoo["curve"]] == pytest.approx(range(6), abs=0.02)
        assert zoo["losses"][-1] < zoo["losses"][0]
        # gensim trained on what zoo's subsampling keeps, within sampling noise.
        per_pass = record["gensim"][0]["effective_words"] / 5
        assert per_pass == pytest.approx(record["data"]["expected_kept_per_pass"], rel=0.05)
    report = open(tmp_path / "quality_word2vec.md").read()
    assert "## skipgram" in report and "## cbow" in report and "(the peer)" in report
