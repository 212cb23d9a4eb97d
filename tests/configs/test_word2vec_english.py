"""configs/word2vec.py:corpus=english: the English text of three fetched corpora (Brown,
Shakespeare, the Bible's English side), each file from corpus_dir; one not fetched stops the
job with its own fetch command; gensim's defaults and optimizer; and the job trains end to end
on fixture corpora of the fetched layout (never the real corpora)."""

import contextlib
import io
import json
import os

import jax
import pytest

from configs import word2vec
from tests.configs.test_corpus_variants import write_fixture_corpora
from zoo.commands import jobs
from zoo.data import corpora
from zoo.errors import ConfigError, MissingFileError

ONE_DEVICE = jax.devices()[:1]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return write_fixture_corpora(tmp_path_factory.mktemp("corpora"))


def test_english_reads_each_corpus_text_from_corpus_dir(corpus_dir):
    config = word2vec.get_config(f"corpus=english,corpus_dir={corpus_dir}")
    data = config.data
    assert data.source == "files" and data.corpus == "brown,shakespeare,bible"
    for key, name in (("train_files", "train.txt"), ("eval_files", "validation.txt")):
        files = data[key].split(",")
        assert files == [os.path.join(corpus_dir, c, name) for c in ("brown", "shakespeare",
                                                                      "bible")]
        assert all(os.path.isfile(f) for f in files)
    corpora.check_fetched(data)  # all there: no error
    assert word2vec.get_config("corpus=english").data.train_files.startswith(
        os.path.join("corpora", "brown", "train.txt"))


@pytest.mark.parametrize("missing", ["shakespeare", "bible"])
def test_a_corpus_not_fetched_is_named_with_its_own_fetch_command(missing, corpus_dir, tmp_path):
    # A corpus_dir holding two of the three: the error names the third, not the first.
    partial = tmp_path / "corpora"
    partial.mkdir()
    for name in {"brown", "shakespeare", "bible"} - {missing}:
        os.symlink(os.path.join(corpus_dir, name), partial / name)
    config = word2vec.get_config(f"corpus=english,corpus_dir={partial}")
    with pytest.raises(MissingFileError) as raised:
        jobs.make_task(config, str(tmp_path / "run"))
    message = str(raised.value)
    assert os.path.join(str(partial), missing, "train.txt") in message
    assert f"`python -m zoo.commands.corpus fetch {missing} --out {partial}`" in message


def test_english_is_gensims_defaults_and_its_sgd():
    for mode, steps in (("skipgram", 36_590), ("cbow", 7_980)):
        config = word2vec.get_config(f"corpus=english,mode={mode}")
        data, optim = config.data, config.optim
        assert config.model.embed_dim == 100 and config.model.mode == mode
        assert (data.min_count, data.window, data.sample, data.negatives, data.noise_power,
                data.pair_draws) == (5, 5, 1e-3, 5, 0.75, 5)
        # Plain SGD, its step per example alpha = 0.025 -> 0.0001 on the batch-mean gradient.
        assert (optim.name, optim.momentum, optim.weight_decay, optim.clip_norm) == (
            "sgd", 0.0, 0.0, 0.0)
        assert optim.learning_rate == pytest.approx(0.025 * data.batch_size)
        assert optim.end_learning_rate == pytest.approx(1e-4 * data.batch_size)
        assert (optim.decay, optim.warmup_steps) == ("linear", 0)
        assert config.train.steps == optim.total_steps == steps
    # The synthetic recipe is unchanged: Adam.
    assert word2vec.get_config().optim.name == "adamw"


def test_unknown_corpus_and_a_size_the_recipe_fixes_are_config_errors():
    with pytest.raises(ConfigError, match=r"corpus='brown' is not one of .*'english'"):
        word2vec.get_config("corpus=brown")
    with pytest.raises(ConfigError, match="leave size at tiny"):
        word2vec.get_config("size=base,corpus=english")


@pytest.mark.parametrize("mode", ["skipgram", "cbow"])
def test_english_trains_on_fixture_corpora(mode, corpus_dir, tmp_path):
    config = word2vec.get_config(f"corpus=english,mode={mode},corpus_dir={corpus_dir}")
    config.data.update(batch_size=64, eval_batch_size=64)
    config.optim.update(learning_rate=0.025 * 64, end_learning_rate=1e-4 * 64)
    config.train.update(steps=150, log_every=25, eval_every=150, checkpoint_every=150,
                        tensorboard=False)
    config.sample.words = "jury,speak,beginning"  # one word of each fixture corpus
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        jobs.train(config, str(tmp_path / "run"), devices=ONE_DEVICE)
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    losses = [r["loss"] for r in records if r["split"] == "train"]
    assert losses[-1] < losses[0] - 1.0  # 6 log 2 = 4.16 at the start
    assert "jury:" in out.getvalue() and "beginning:" in out.getvalue()
