"""The real-text config variants (`corpus=`): each builds and reads the fetched corpus's files
from corpus_dir; a corpus not fetched stops the job with one error giving the fetch command;
the character GPT and a classifier train end to end on small fixture corpora of the same
layout as `python -m zoo.commands.corpus fetch` writes (never the real corpora)."""

import contextlib
import io
import json
import os
import subprocess
import sys

import jax
import pytest

from configs import bert_pretrain, classify, elmo, feature_classify, gpt, rnn_translate, rnnlm
from configs import translate
from zoo.commands import jobs
from zoo.data import corpora
from zoo.data.tokenizers import chars
from zoo.errors import ConfigError, MissingFileError
from tests.process_env import process_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ONE_DEVICE = jax.devices()[:1]

# (config module, variant, the corpus it fetches, {config.data key: file in that corpus})
VARIANTS = [
    (gpt, "corpus=shakespeare", "shakespeare", {"train_files": "shakespeare.txt"}),
    (rnnlm, "cell=lstm,corpus=brown", "brown",
     {"train_files": "train.txt", "eval_files": "validation.txt"}),
    (bert_pretrain, "size=tiny,corpus=brown", "brown",
     {"train_files": "train.txt", "eval_files": "validation.txt"}),
    (classify, "corpus=spam_assassin", "spam_assassin",
     {"train_file": "train.tsv", "eval_file": "validation.tsv"}),
    (classify, "strategy=full,corpus=brown_genre", "brown",
     {"train_file": "genre_train.tsv", "eval_file": "genre_validation.tsv"}),
    (elmo, "corpus=brown", "brown", {"train_files": "train.txt", "eval_files": "validation.txt"}),
    (feature_classify, "corpus=spam_assassin", "spam_assassin",
     {"train_file": "train.tsv", "eval_file": "validation.tsv"}),
    (feature_classify, "corpus=brown_genre", "brown",
     {"train_file": "genre_train.tsv", "eval_file": "genre_validation.tsv"}),
    (translate, "corpus=bible", "bible", {"train_file": "train.tsv", "eval_file": "validation.tsv"}),
    (rnn_translate, "attention=general,corpus=bible", "bible",
     {"train_file": "train.tsv", "eval_file": "validation.tsv"}),
]
IDS = [f"{m.__name__.split('.')[-1]}:{v}" for m, v, _, _ in VARIANTS]

PLAY = ("ACT I. SCENE I. Rome. A street.\n\nFIRST CITIZEN.\nBefore we proceed any further, hear "
        "me speak.\n\nALL.\nSpeak, speak.\n\nFIRST CITIZEN.\nYou are all resolv'd rather to die "
        "than to famish?\n\n")


def write_fixture_corpora(root) -> str:
    """Tiny corpora in the layout `corpus fetch` writes (docs/guides/real-corpora.md)."""
    def write(name, file, text):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        with open(os.path.join(root, name, file), "w", encoding="utf-8") as f:
            f.write(text)

    # The last tenth holds a character the first nine never do: counted, not dropped.
    write("shakespeare", "shakespeare.txt", PLAY * 12 + "\u00a7 The end.\n")
    sentences = "The jury said Friday an investigation produced no evidence .\nIt was over .\n\n"
    for split in ("train", "validation", "test"):
        write("brown", f"{split}.txt", sentences * 20)
        write("shakespeare", f"{split}.txt", "Speak , speak .\nYou are all resolved .\n\n" * 20)
        genres = "".join(f"passage {i} about {g} .\t{g}\n" for i in range(12)
                         for g in ("news", "romance", "humor"))
        write("brown", f"genre_{split}.tsv", "text\tlabel\n" + genres)
        mails = "".join(f"Re: meeting {i} agenda attached\tham\nWIN CASH NOW {i} click here\tspam\n"
                        for i in range(20))
        write("spam_assassin", f"{split}.tsv", "text\tlabel\n" + mails)
        verses = "".join(f"En el principio {i}.\tIn the beginning {i}.\n" for i in range(20))
        write("bible", f"{split}.tsv", verses)
        write("bible", f"{split}.txt", "In the beginning .\n\n" * 5)
    return str(root)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return write_fixture_corpora(tmp_path_factory.mktemp("corpora"))


@pytest.mark.parametrize("module, variant, corpus, files", VARIANTS, ids=IDS)
def test_each_variant_reads_its_corpus_files_from_corpus_dir(module, variant, corpus, files,
                                                             corpus_dir):
    config = module.get_config(f"{variant},corpus_dir={corpus_dir}")
    assert config.data.source == "files"
    assert (config.data.corpus, config.data.corpus_dir) == (corpus, corpus_dir)
    for key, name in files.items():
        assert config.data[key] == os.path.join(corpus_dir, corpus, name)
        assert os.path.isfile(config.data[key])  # the fixture has the fetched layout
    corpora.check_fetched(config.data)  # all there: no error
    # The default corpus_dir is 'corpora', relative to where the job runs.
    default = module.get_config(variant)
    assert default.data.corpus_dir == "corpora"
    assert all(default.data[k] == os.path.join("corpora", corpus, n) for k, n in files.items())


@pytest.mark.parametrize("module, variant, corpus, files", VARIANTS, ids=IDS)
def test_a_corpus_not_fetched_is_one_error_with_the_fetch_command(module, variant, corpus,
                                                                  files, tmp_path):
    empty = str(tmp_path / "nowhere")
    config = module.get_config(f"{variant},corpus_dir={empty}")
    first = os.path.join(empty, corpus, next(iter(files.values())))
    with pytest.raises(MissingFileError) as raised:
        jobs.make_task(config, str(tmp_path / "run"))  # before the task reads anything
    message = str(raised.value)
    assert first in message
    assert f"`python -m zoo.commands.corpus fetch {corpus} --out {empty}`" in message
    assert "corpus_dir=" in message and "\n" not in message


def test_the_prepare_command_checks_before_preparing(tmp_path):
    from zoo.commands import prepare

    config = bert_pretrain.get_config(f"size=tiny,corpus=brown,corpus_dir={tmp_path}")
    with pytest.raises(MissingFileError, match="corpus fetch brown --out"):
        prepare.main(config, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()  # nothing prepared, nothing written


def test_a_file_outside_the_corpus_is_left_to_the_reader(tmp_path):
    """An override pointing elsewhere is the user's own file: not the corpus's to report."""
    config = gpt.get_config(f"corpus=shakespeare,corpus_dir={tmp_path}")
    config.data.train_files = str(tmp_path / "mine" / "*.txt")
    corpora.check_fetched(config.data)
    corpora.check_fetched(gpt.get_config().data)  # no corpus: nothing to check


def test_unknown_corpus_and_a_size_the_recipe_fixes_are_config_errors():
    with pytest.raises(ConfigError, match=r"corpus='wikitext' is not one of .*'shakespeare'"):
        gpt.get_config("corpus=wikitext")
    with pytest.raises(ConfigError, match="brown_genre"):
        classify.get_config("corpus=brown")  # classification's Brown is brown_genre
    with pytest.raises(ConfigError, match="leave size at tiny"):
        gpt.get_config("size=124M,corpus=shakespeare")


def test_shakespeare_char_is_nanogpts_cpu_recipe():
    config = gpt.get_config("corpus=shakespeare")
    model, data, optim = config.model, config.data, config.optim
    assert (model.num_layers, model.num_heads, model.embed_dim, model.mlp_dim) == (4, 4, 128, 512)
    assert model.dropout_rate == model.attention_dropout_rate == 0.0
    assert (data.tokenizer_type, data.char_split, data.seq_len, data.batch_size) == (
        "chars", 0.9, 64, 12)
    assert (config.train.steps, optim.total_steps) == (2000, 2000)
    assert (optim.learning_rate, optim.warmup_steps, optim.decay, optim.end_learning_rate) == (
        1e-3, 100, "cosine", 1e-4)
    assert (optim.b1, optim.b2, optim.weight_decay, optim.clip_norm) == (0.9, 0.99, 0.1, 1.0)


def test_train_py_without_the_corpus_prints_one_line_and_exits_1(tmp_path):
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"),
         f"--config=configs/gpt.py:corpus=shakespeare,corpus_dir={tmp_path / 'corpora'}",
         f"--workdir={tmp_path / 'run'}"],
        cwd=ROOT, env=process_env(1), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1
    assert (f"python -m zoo.commands.corpus fetch shakespeare --out {tmp_path / 'corpora'}"
            in lines[0])


@pytest.mark.slow
def test_shakespeare_char_gpt_trains_on_a_fixture_and_samples(corpus_dir, tmp_path):
    config = gpt.get_config(f"corpus=shakespeare,corpus_dir={corpus_dir}")
    config.model.update(num_layers=2, num_heads=2, embed_dim=32, mlp_dim=64)
    config.data.update(seq_len=32, batch_size=8, eval_batch_size=16,
                       cache_dir=str(tmp_path / "cache"))
    config.train.update(steps=30, log_every=10, eval_every=30, checkpoint_every=30,
                        tensorboard=False)
    config.optim.update(warmup_steps=5, learning_rate=1e-2, end_learning_rate=1e-3)
    config.sample.update(num=2, max_len=24, prompt="FIRST")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        summary = jobs.train(config, str(tmp_path / "run"), devices=ONE_DEVICE)
    stdout = out.getvalue()
    text = open(config.data.train_files, encoding="utf-8").read()
    cut = int(len(text) * 0.9)
    # The vocabulary is the first 90%'s characters, cached as a file in the job's data cache.
    vocab = chars.CharTokenizer.load(str(tmp_path / "cache" / f"vocab{chars.SUFFIX}"))
    assert vocab.chars == sorted(set(text[:cut])) and "\u00a7" not in vocab.chars
    # The eval is the last 10%, one document: [bos] text [eos] predicts len + 1 targets.
    assert summary["tokens"] == len(text) - cut + 1
    assert "validation text holds 1 characters the training text never has ('\u00a7' x1)" in stdout
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    losses = [r["loss"] for r in records if r["split"] == "train"]
    assert losses[-1] < losses[0] - 0.5
    samples = stdout.split("samples:\n", 1)[1].splitlines()
    assert len(samples) >= 2 and all(s.strip().startswith("FIRST") for s in samples[:1])


@pytest.mark.slow
def test_spam_classifier_trains_on_a_fixture(corpus_dir, tmp_path):
    config = classify.get_config(f"corpus=spam_assassin,corpus_dir={corpus_dir}")
    config.data.update(vocab_size=200, seq_len=32, batch_size=8, eval_batch_size=16,
                       cache_dir=str(tmp_path / "cache"))
    config.train.update(steps=40, eval_every=40, log_every=20, checkpoint_every=40,
                        tensorboard=False)
    with contextlib.redirect_stdout(io.StringIO()):
        summary = jobs.train(config, str(tmp_path / "run"), devices=ONE_DEVICE)
    assert summary["accuracy"] >= 75.0  # the fixture's spam shouts: an easy split


@pytest.mark.slow
def test_elmo_features_of_brown_classify_a_fixture(corpus_dir, tmp_path):
    """configs/elmo.py:corpus=brown, then feature_classify.py:corpus=spam_assassin on its
    features: the classifier rebuilds the biLM's vocabulary from the same Brown file."""
    pretrain = elmo.get_config(f"corpus=brown,corpus_dir={corpus_dir}")
    pretrain.data.update(cache_dir=str(tmp_path / "elmo_cache"), seq_len=16, batch_size=8,
                         eval_batch_size=8)
    pretrain.train.update(steps=20, eval_every=20, log_every=10, checkpoint_every=20,
                          tensorboard=False)
    config = feature_classify.get_config(f"corpus=spam_assassin,corpus_dir={corpus_dir}")
    assert config.pretrained.train_files == pretrain.data.train_files
    assert config.pretrained.min_count == pretrain.data.min_count
    config.train.update(steps=40, eval_every=40, log_every=20, checkpoint_every=40,
                        tensorboard=False, init_from=str(tmp_path / "elmo"))
    config.data.update(seq_len=16, batch_size=8, eval_batch_size=16,
                       cache_dir=str(tmp_path / "cache"))
    with contextlib.redirect_stdout(io.StringIO()):
        jobs.train(pretrain, str(tmp_path / "elmo"), devices=ONE_DEVICE)
        summary = jobs.train(config, str(tmp_path / "run"), devices=ONE_DEVICE)
    assert summary["accuracy"] >= 75.0  # the fixture's spam shouts: an easy split


def test_feature_corpus_variants_are_elmo_only():
    with pytest.raises(ConfigError, match="configs/elmo.py:corpus=brown"):
        feature_classify.get_config("kind=word2vec,corpus=spam_assassin")
    with pytest.raises(ConfigError, match="is not one of"):
        feature_classify.get_config("corpus=brown")
