"""configs/gpt.py:corpus=shakespeare,tokenizer=gpt2: nanoGPT's data/shakespeare, the character
split read as GPT-2 tokens (the `gpt2_bpe` fetch). A GPT-2 vocabulary's documents start and
end with its own <|endoftext|>, never with zoo's fixed ids 2 and 3 (GPT-2's '#' and '$'), and
sampling stops there. Fixture corpora and a fixture rank table, never the real ones."""

import contextlib
import io
import os

import jax
import pytest

from configs import gpt
from tests.configs.test_corpus_variants import write_fixture_corpora
from tests.data.corpora import fake_packages
from zoo.commands import jobs
from zoo.data import corpora
from zoo.data.pipelines import lm_pipeline
from zoo.data.tokenizers.base import load_tokenizer
from zoo.errors import MissingFileError

SOURCE_TEXT = ("FIRST CITIZEN. Before we proceed any further, hear me speak. ALL. Speak, speak. "
               "You are all resolv'd rather to die than to famish? ") * 4


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpora")
    write_fixture_corpora(root)
    ranks = fake_packages.rank_file(fake_packages.learnt_ranks(SOURCE_TEXT, merges=60))
    sdist = fake_packages.whisper_sdist(tmp_path_factory.mktemp("sdist"), ranks)
    with pytest.MonkeyPatch.context() as patch:
        fake_packages.pin(patch, sdist)
        corpora.fetch("gpt2_bpe", str(root), [sdist], report=lambda line: None)
    return str(root)


def test_variant_reads_the_fetched_tokenizer_and_names_its_fetch_when_missing(corpus_dir,
                                                                              tmp_path):
    config = gpt.get_config(f"corpus=shakespeare,tokenizer=gpt2,corpus_dir={corpus_dir}")
    assert config.data.tokenizer == os.path.join(corpus_dir, "gpt2_bpe")
    assert config.data.char_split == 0.9 and config.model.embed_dim == 128
    corpora.check_fetched(config.data)
    empty = str(tmp_path / "nowhere")
    os.makedirs(os.path.join(empty, "shakespeare"))
    open(os.path.join(empty, "shakespeare", "shakespeare.txt"), "w").close()
    config = gpt.get_config(f"corpus=shakespeare,tokenizer=gpt2,corpus_dir={empty}")
    with pytest.raises(MissingFileError,
                       match=f"fetch gpt2_bpe --out {empty}"):
        corpora.check_fetched(config.data)


def test_documents_carry_the_tokenizers_own_endoftext(corpus_dir):
    tokenizer = load_tokenizer(os.path.join(corpus_dir, "gpt2_bpe"))
    eot = tokenizer.eos_id
    assert eot == tokenizer.vocab_size - 1 == 256 + 60
    (ids,) = lm_pipeline.tokenize_documents(tokenizer, [["Speak, speak.", " You are"]])
    assert ids == [eot] + tokenizer.encode("Speak, speak.") + tokenizer.encode(" You are") + [eot]


@pytest.mark.slow
def test_gpt_trains_on_gpt2_tokens_and_samples_until_endoftext(corpus_dir, tmp_path):
    config = gpt.get_config(f"corpus=shakespeare,tokenizer=gpt2,corpus_dir={corpus_dir}")
    config.model.update(num_layers=1, num_heads=2, embed_dim=32, mlp_dim=64)
    config.data.update(seq_len=16, batch_size=4, eval_batch_size=8,
                       cache_dir=str(tmp_path / "cache"))
    config.train.update(steps=20, log_every=10, eval_every=20, checkpoint_every=20,
                        tensorboard=False)
    config.sample.update(num=2, max_len=16, prompt="FIRST")
    task = jobs.make_task(config, str(tmp_path / "task"))
    eot = task.tokenizer.eos_id
    text = open(config.data.train_files, encoding="utf-8").read()
    cut = int(len(text) * 0.9)
    train_ids = [eot] + task.tokenizer.encode(text[:cut]) + [eot]
    inputs, weights = task.train_rows["inputs"], task.train_rows["weights"]
    assert inputs[0, 0] == eot and inputs.reshape(-1)[:len(train_ids) - 1].tolist() == \
        train_ids[:-1]
    assert weights.sum() == len(train_ids) - 1
    assert task.model_config.vocab_size == task.tokenizer.vocab_size
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        summary = jobs.train(config, str(tmp_path / "run"), devices=jax.devices()[:1])
    assert summary["tokens"] == len(task.tokenizer.encode(text[cut:])) + 1
    samples = out.getvalue().split("samples:\n", 1)[1].splitlines()
    assert samples[0].strip().startswith("FIRST")
