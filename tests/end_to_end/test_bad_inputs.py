"""The catalogue of bad inputs (issue 10): each one, reached through the entry point a user hits
(train.py for command-line mistakes, zoo.commands.jobs.train for the rest, the loader itself
for data files), ends in one error that names the file / record / config key and says what to
do, and leaves every file already written (a run's checkpoints, metrics, summary)
byte-identical. Each error is a zoo.errors.UserError, which the command line prints without a
traceback."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from configs import classify as classify_config
from configs import gpt as gpt_config
from configs import gpt_classify as gpt_classify_config
from configs import squad as squad_config
from tests.process_env import process_env
from zoo.checkpoints.checkpoint import CheckpointMismatchError, MissingParamsError
from zoo.commands import jobs
from zoo.data.readers import squad
from zoo.errors import ConfigError, UserError
from zoo.models import bert, gpt

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = "The cat sat on the mat.\nIt was warm.\n\nA dog ran home.\nIt was late.\n"
SEQ_LEN = 16  # both fixture runs: GPT wpe and BERT position_embeddings have 16 rows
VOCAB = 128  # and 128-token vocabularies


def train(config, workdir):
    """zoo.commands.jobs.train on one device: with conftest's 8 fake devices every build and save
    compiles per-shard work that no entry of the catalogue needs."""
    return jobs.train(config, str(workdir), devices=jax.devices()[:1])


# ---- two tiny finished runs (trained once) and the before / after comparison ------------------


def _lm_config(cache_dir, **overrides):
    """configs/gpt.py:size=tiny shrunk to test size (as tests/conftest.py's tiny_lm_config),
    without the best-checkpoint copy or samples: less to write."""
    config = gpt_config.get_config("size=tiny")
    config.data.update(seq_len=SEQ_LEN, batch_size=8, eval_batch_size=8, vocab_size=VOCAB,
                       synthetic_entities=100, cache_dir=str(cache_dir or ""))
    config.train.update({"steps": 2, "log_every": 1, "eval_every": 1000, "checkpoint_every": 1000,
                         "tensorboard": False, "best_metric": "", **overrides})
    config.optim.warmup_steps = 2
    config.sample.num = 0
    return config


def _finetune_data(config, cache_dir):
    config.data.update(synthetic_entities=100, seq_len=SEQ_LEN, batch_size=8, eval_batch_size=8,
                       cache_dir=str(cache_dir or ""))
    config.train.update(steps=1, log_every=1, eval_every=1000, checkpoint_every=1000,
                        tensorboard=False, best_metric="")
    config.optim.warmup_steps = 1
    return config


def _classify_config(cache_dir, **overrides):
    """configs/classify.py (BERT) at test size: 16 positions, a 128-token vocabulary."""
    config = _finetune_data(classify_config.get_config("size=tiny"), cache_dir)
    config.data.vocab_size = VOCAB
    config.model.max_position_embeddings = SEQ_LEN
    config.train.update(overrides)
    return config


def _gpt_classify_config(cache_dir, **overrides):
    config = _finetune_data(gpt_classify_config.get_config("size=tiny"), cache_dir)
    config.train.update(overrides)
    return config


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A finished tiny GPT language-model run and a finished tiny BERT classification run, each
    with its tokenizer in <run>/data (where a run keeps it by default, and where a fine-tuning
    job looks for it). A bad run with the same data config passes that directory as its
    config.data.cache_dir, so it reads the tokenizer instead of training it again."""
    root = tmp_path_factory.mktemp("runs")
    train(_lm_config(None), root / "gpt")
    train(_classify_config(None), root / "bert")
    return root


def tree_digest(root) -> dict[str, str]:
    """relative path -> sha256 of every file under `root` (directories as 'dir')."""
    digest = {}
    for directory, _, files in os.walk(root):
        digest[os.path.relpath(directory, root)] = "dir"
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                digest[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return digest


@pytest.fixture
def copy_of(runs, tmp_path):
    """copy_of('gpt') -> a private copy of that finished run (the workdir a bad command hits)."""

    def make(name):
        target = tmp_path / f"{name}_workdir"
        shutil.copytree(runs / name, target)
        assert {"checkpoints", "metrics.jsonl", "summary.json"} <= set(os.listdir(target))
        return target

    return make


def assert_kept(before: dict[str, str], after: dict[str, str]) -> None:
    """Every file of `before` is still there, byte-identical (a bad run may add, e.g., a
    tokenizer it trained before failing, but never change or delete what was written)."""
    assert {path: after.get(path) for path in before} == before


def raises_and_keeps(error, message, run, *workdirs):
    """`run()` raises `error` whose text matches `message`, a UserError (the command line prints
    it alone); `workdirs` lose nothing."""
    before = [tree_digest(w) for w in workdirs]
    with pytest.raises(error, match=message) as info:
        run()
    assert isinstance(info.value, UserError), type(info.value).__mro__
    for old, workdir in zip(before, workdirs):
        assert_kept(old, tree_digest(workdir))
    return str(info.value)


# ---- 1. config typos, through train.py ------------------------------------------------------

_GPT = "--config=configs/gpt.py:size=tiny"
_CLI_CASES = {  # name: (script, arguments, what stderr says)
    # absl's lock_config: an unknown key, in one line with ml_collections' suggestion.
    "unknown_key": ("train.py", [_GPT, "--config.train.stpes=5"],
                    r"unknown config key config\.train\.stpes; did you mean "
                    r"config\.train\.steps\?"),
    "unknown_key_eval": ("eval.py", [_GPT, "--config.data.seqlen=8"],
                         r"unknown config key config\.data\.seqlen; did you mean "
                         r"config\.data\.seq_len\?"),
    "unknown_variant": ("train.py", ["--config=configs/gpt.py:sise=tiny"],
                        r"config variant key 'sise' is unknown; known keys: "
                        r"\['corpus', 'corpus_dir', 'size', 'tokenizer'\]"),
    "missing_config_file": ("train.py", ["--config=configs/nope.py"],
                            r"configs/nope\.py.*No such file or directory"),
    "bad_nonfinite": ("train.py", [_GPT, "--config.train.nonfinite=skp"],
                      r"config\.train\.nonfinite must be one of \('skip', 'stop'\), got 'skp'"),
    "bad_source": ("train.py", [_GPT, "--config.data.source=txt"],
                   r"config\.data\.source must be 'synthetic', 'files' or 'tfds', got 'txt'"),
    "bad_int": ("train.py", [_GPT, "--config.train.steps=ten"],  # absl's own check
                r"flag --config\.train\.steps=ten: invalid literal for int\(\)"),
    "bad_watchdog": ("train.py", [_GPT, "--config.train.watchdog.factor=0.5"],
                     r"config\.train\.watchdog\.factor=0\.5 must be > 1"),
    "bad_heartbeat": ("train.py", [_GPT, "--config.train.heartbeat_timeout_s=1"],
                      r"config\.train\.heartbeat_timeout_s=1 must be a whole number of "
                      r"seconds >= 2"),
    "bad_storage_timeout": ("train.py", [_GPT, "--config.train.storage.request_timeout_s=0"],
                            r"config\.train\.storage\.request_timeout_s=0\.0 must be a number "
                            r"of seconds > 0"),
}


@pytest.fixture(scope="module")
def cli_results(runs, tmp_path_factory):
    """Every _CLI_CASES command run at once (each is a few seconds of imports), each in its own
    copy of the finished GPT run: name -> (returncode, stderr, digest before, digest after)."""
    root = tmp_path_factory.mktemp("cli")
    env = process_env(1)
    env.pop("ZOO_DEBUG", None)  # it would show the tracebacks these cases check are not there
    started = {}
    for name, (script, args, _) in _CLI_CASES.items():
        workdir = root / name
        shutil.copytree(runs / "gpt", workdir)
        before = tree_digest(workdir)
        process = subprocess.Popen(
            [sys.executable, script, *args, f"--workdir={workdir}"], cwd=REPO, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        started[name] = (process, workdir, before)
    results = {}
    for name, (process, workdir, before) in started.items():
        _, stderr = process.communicate(timeout=300)
        results[name] = (process.returncode, stderr, before, tree_digest(workdir))
    return results


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(_CLI_CASES))
def test_config_typo_is_one_clear_error_on_the_command_line(cli_results, case):
    returncode, stderr, before, after = cli_results[case]
    assert returncode != 0
    assert re.search(_CLI_CASES[case][2], stderr, re.DOTALL), stderr[-3000:]
    # One message, not absl's, ml_collections' or zoo's traceback.
    assert "Traceback" not in stderr, stderr[-3000:]
    assert_kept(before, after)  # the run already in --workdir loses nothing


@pytest.mark.parametrize("section, key, value, message", [
    ("model", "size", "huge",
     r"config\.model\.size: unknown GPT size 'huge'; choose from \['tiny', '124M'"),
    ("optim", "name", "adamm",
     r"config\.optim\.name must be adamw, lamb, adafactor or sgd, got 'adamm'"),
    ("optim", "decay", "cosin",
     r"config\.optim\.decay must be constant, linear, cosine or inverse_sqrt, got 'cosin'"),
], ids=["model.size", "optim.name", "optim.decay"])
@pytest.mark.slow
def test_bad_enum_value_in_a_config_file(copy_of, section, key, value, message):
    # Values a config file (not the command line) sets: the job itself rejects them.
    workdir = copy_of("gpt")
    config = _lm_config(None)
    config[section][key] = value
    raises_and_keeps(ValueError, message, lambda: train(config, workdir), workdir)


# ---- 2. a vocabulary that does not match the checkpoint -------------------------------------


def test_gpt_init_from_a_checkpoint_with_another_vocabulary(runs, tmp_path):
    config = _lm_config(tmp_path / "cache", init_from=str(runs / "gpt"))
    config.data.vocab_size = 2 * VOCAB
    message = raises_and_keeps(
        CheckpointMismatchError,
        r"config\.train\.init_from='.*gpt': 1 of the checkpoint's parameters .* other shapes",
        lambda: train(config, tmp_path / "run"), runs / "gpt")
    assert "['wte']['embedding']: checkpoint (128, 64), this model (256, 64)" in message
    assert "config.data.tokenizer" in message and "128 tokens" in message


def test_bert_finetune_init_from_a_checkpoint_with_another_vocabulary(runs, tmp_path):
    config = _classify_config(tmp_path / "cache", init_from=str(runs / "bert"))
    config.data.vocab_size = 2 * VOCAB
    message = raises_and_keeps(
        CheckpointMismatchError, r"config\.train\.init_from='.*bert'",
        lambda: train(config, tmp_path / "run"), runs / "bert")
    assert ("['bert']['embeddings']['word_embeddings']['embedding']: checkpoint (128, 64), "
            "this model (256, 64)") in message
    assert "config.data.tokenizer" in message


# ---- 3. a checkpoint of another model family --------------------------------------------------


def test_bert_finetune_init_from_a_gpt_run(runs, tmp_path):
    config = _classify_config(runs / "bert" / "data", init_from=str(runs / "gpt"))
    message = raises_and_keeps(
        MissingParamsError,
        r"config\.train\.init_from='.*gpt' is not a checkpoint of this model",
        lambda: train(config, tmp_path / "run"), runs / "gpt")
    # Both sides' top-level names: the checkpoint is a GPT, the model wants a BERT encoder.
    assert "the checkpoint holds h, wpe, wte, this model embeddings, encoder, pooler" in message


def test_gpt_init_from_a_bert_run(runs, tmp_path):
    config = _lm_config(runs / "gpt" / "data", init_from=str(runs / "bert"))
    message = raises_and_keeps(
        MissingParamsError,
        r"config\.train\.init_from='.*bert' is not a checkpoint of this model",
        lambda: train(config, tmp_path / "run"), runs / "bert")
    assert "the checkpoint holds bert, classifier, this model h, wpe, wte" in message


def test_init_from_a_run_with_the_other_layer_layout(runs, tmp_path):
    config = _lm_config(runs / "gpt" / "data", init_from=str(runs / "gpt"))
    config.model.scan_layers = True  # the run stored layer_0, layer_1 (tiny: unscanned)
    raises_and_keeps(
        MissingParamsError,
        r"does not fit this model.*stores its layers one by one: set "
        r"config\.model\.scan_layers=False",
        lambda: train(config, tmp_path / "run"), runs / "gpt")


@pytest.mark.parametrize("job, files, message", [
    ("classify", {"config.json": {"model_type": "gpt2", "n_layer": 2}},
     (r"init_from='.*' is not a checkpoint of this model: its config\.json says "
      r"model_type='gpt2', and this task fine-tunes BERT")),
    ("gpt_classify", {"config.json": {"model_type": "bert", "hidden_size": 64}},
     (r"init_from='.*' is not a checkpoint of this model: its config\.json says "
      r"model_type='bert', and this task fine-tunes GPT.*configs/classify\.py")),
    ("gpt_classify", {"bert_config.json": {"hidden_size": 64}},
     (r"init_from='.*' is not a checkpoint of this model: it is a google-research/bert "
      r"checkpoint")),
], ids=["bert_from_gpt2_dir", "gpt_from_bert_dir", "gpt_from_google_bert_dir"])
def test_init_from_a_pretrained_directory_of_another_family(tmp_path, job, files, message):
    directory = tmp_path / "pretrained"
    directory.mkdir()
    for name, content in files.items():
        (directory / name).write_text(json.dumps(content))
    make = _classify_config if job == "classify" else _gpt_classify_config
    config = make(tmp_path / "cache", init_from=str(directory))
    raises_and_keeps(ValueError, message, lambda: train(config, tmp_path / "run"),
                     directory)


# ---- 4. a sequence longer than the model's positions -----------------------------------------


def test_model_called_with_more_tokens_than_positions():
    tokens = jnp.zeros((1, 9), jnp.int32)
    model = gpt.GPT(gpt.config_for_size("tiny", vocab_size=32, max_len=8))
    with pytest.raises(ValueError, match=r"GPT: the input has 9 tokens but the model has 8 "
                                         r"positions \(GPTConfig\.max_len=8, set by "
                                         r"config\.data\.seq_len.*lower config\.data\.seq_len"
                       ) as info:
        model.init(jax.random.key(0), tokens)
    assert isinstance(info.value, UserError)
    encoder = bert.BertModel(bert.config_for_size("tiny", vocab_size=32,
                                                  max_position_embeddings=8))
    with pytest.raises(ValueError, match=r"BERT: the input has 9 tokens but the model has 8 "
                                         r"positions .*config\.model\.max_position_embeddings"
                       ) as info:
        encoder.init(jax.random.key(0), tokens)
    assert isinstance(info.value, UserError)


def test_gpt_init_from_a_checkpoint_with_fewer_positions(runs, tmp_path):
    config = _lm_config(runs / "gpt" / "data", init_from=str(runs / "gpt"))
    config.data.seq_len = 2 * SEQ_LEN
    message = raises_and_keeps(
        CheckpointMismatchError, r"config\.train\.init_from=",
        lambda: train(config, tmp_path / "run"), runs / "gpt")
    assert ("['wpe']['embedding']: checkpoint (16, 64), this model (32, 64), its rows are the "
            "positions: set config.data.seq_len=16") in message


def test_bert_finetune_init_from_a_checkpoint_with_fewer_positions(runs, tmp_path):
    config = _classify_config(runs / "bert" / "data", init_from=str(runs / "bert"))
    config.data.seq_len = config.model.max_position_embeddings = 2 * SEQ_LEN
    message = raises_and_keeps(
        CheckpointMismatchError, r"config\.train\.init_from=",
        lambda: train(config, tmp_path / "run"), runs / "bert")
    assert ("['position_embeddings']['embedding']: checkpoint (16, 64), this model (32, 64), its "
            "rows are the positions: set config.model.max_position_embeddings=16 and "
            "config.data.seq_len <= 16") in message


def test_gpt_finetune_longer_than_the_checkpoint_positions(runs, tmp_path):
    config = _gpt_classify_config(runs / "bert" / "data", init_from=str(runs / "gpt"))
    config.data.seq_len = 2 * SEQ_LEN
    raises_and_keeps(
        ValueError, r"config\.data\.seq_len=32 exceeds the 16 positions of the GPT "
                    r"\(config\.train\.init_from='.*gpt'\); lower config\.data\.seq_len",
        lambda: train(config, tmp_path / "run"), runs / "gpt")


# ---- 5, 6. corpus files: empty, not UTF-8, not there -------------------------------------------


@pytest.mark.parametrize("content, message", [
    (b"", r"corpus\.txt: the corpus is empty; expected one sentence per line"),
    (b"  \n\n\t\n", r"corpus\.txt: the corpus is empty"),
    (b"Fine here.\nCaf\xe9 au lait.\n",
     r"corpus\.txt:2: invalid UTF-8 byte 0xe9 at column 4; the corpus must be UTF-8 text"),
    (None, r"config\.data\.train_files='.*corpus\.txt' matches no files"),
], ids=["empty", "blank_lines_only", "not_utf8", "no_such_file"])
def test_bad_corpus_file(copy_of, tmp_path, content, message):
    corpus = tmp_path / "corpus.txt"
    if content is not None:
        corpus.write_bytes(content)
    (tmp_path / "eval.txt").write_text(CORPUS)
    workdir = copy_of("gpt")
    config = _lm_config(workdir / "data", steps=4)
    config.data.update(source="files", train_files=str(corpus),
                       eval_files=str(tmp_path / "eval.txt"))
    error = FileNotFoundError if content is None else ValueError
    raises_and_keeps(error, message, lambda: train(config, workdir), workdir)


# ---- 6, 8. classification files: missing columns, not UTF-8 ------------------------------------


@pytest.mark.parametrize("content, message", [
    (b"sentence\tlabel\nGood one.\t1\nNo label here.\n",
     r"train\.tsv:3: 1 tab-separated fields, the header has 2 \(sentence, label\)"),
    (b"sentence\tgold\nGood one.\t1\n",
     (r"train\.tsv:1: no label column 'label'; the columns found are 'sentence', 'gold'; name the "
      r"label's column with label \(config\.data\.label")),
    (b"words\tlabel\nGood one.\t1\n",
     (r"train\.tsv:1: none of the columns sentence, .* is present.*the columns found are "
      r"'words', 'label'; name the first text's with text_a \(config\.data\.text_a\)")),
    (b"sentence\tlabel\nGood one.\t1\nCaf\xe9.\t0\n",
     r"train\.tsv:3: invalid UTF-8 byte 0xe9; the file must be UTF-8 text"),
], ids=["row_missing_a_column", "no_label_column", "no_text_column", "not_utf8"])
def test_bad_classification_tsv(copy_of, tmp_path, content, message):
    (tmp_path / "train.tsv").write_bytes(content)
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\nGood one.\t1\n")
    workdir = copy_of("bert")
    config = _classify_config(workdir / "data", steps=2)
    config.data.update(source="files", train_file=str(tmp_path / "train.tsv"),
                       eval_file=str(tmp_path / "dev.tsv"))
    raises_and_keeps(ValueError, message, lambda: train(config, workdir), workdir)


# ---- 7. SQuAD JSON ---------------------------------------------------------------------------


def _squad_file(path, qas, context="Paris is the capital of France."):
    document = {"version": "1.1", "data": [
        {"title": "France", "paragraphs": [{"context": context, "qas": qas}]}]}
    path.write_text(json.dumps(document))
    return path


def _qa(qid, question="What is the capital?", text="Paris", start=0):
    return {"id": qid, "question": question, "answers": [{"text": text, "answer_start": start}]}


def test_squad_file_that_is_not_json_through_the_job(copy_of, tmp_path):
    bad = tmp_path / "train.json"
    bad.write_text('{"data": [\n  {"title": "x",\n}')
    workdir = copy_of("bert")
    config = squad_config.get_config("size=tiny")
    config.data.update(source="files", train_file=str(bad), eval_file=str(bad),
                       cache_dir=str(workdir / "data"))
    raises_and_keeps(ValueError, r"train\.json:3:1: malformed JSON: Expecting property name",
                     lambda: train(config, workdir), workdir)


@pytest.mark.parametrize("build, message", [
    (lambda p: p.write_text(json.dumps({"version": "1.1"})),
     r"bad\.json: the top level has no field 'data'; the official SQuAD format needs it"),
    (lambda p: _squad_file(p, [{"id": "q7", "answers": []}]),
     (r"bad\.json: question 'q7' \(data\[0\]\.paragraphs\[0\]\.qas\[0\]\) has no field "
      r"'question'")),
    (lambda p: _squad_file(p, [_qa("q1", start=5)]),
     r"bad\.json: no usable questions \(1 read, 1 skipped: .* answer_start is the character offset"),
    (lambda p: p.write_bytes(b'{"data": [], "title": "Caf\xe9"}'),
     r"bad\.json: invalid UTF-8 byte 0xe9 at byte 26; SQuAD files are UTF-8 JSON"),
], ids=["no_data", "no_question", "answer_start_off", "not_utf8"])
def test_bad_squad_file(tmp_path, build, message):
    path = tmp_path / "bad.json"
    build(path)
    with pytest.raises(ValueError, match=message) as info:
        squad.read_squad_json(path)
    assert isinstance(info.value, UserError)


def test_squad_answer_start_off_its_text_is_named_and_skipped(tmp_path, caplog):
    path = _squad_file(tmp_path / "train.json", [_qa("q1"), _qa("q2", start=5)])
    examples = squad.read_squad_json(path)
    assert [ex["id"] for ex in examples] == ["q1"]
    # run_squad's policy: the question is skipped, and the warning names file, id and offsets.
    assert re.search(r"train\.json: question 'q2' .*could not find answer 'Paris' at "
                     r"answer_start 5", caplog.text)


# ---- 9. a workdir, init_from or mesh that jax / orbax / the OS would reject deep inside --------


def test_workdir_that_is_a_file(tmp_path):
    path = tmp_path / "run"
    path.write_text("notes")
    raises_and_keeps(ConfigError, r"--workdir=.*run is a file, not a directory",
                     lambda: train(_lm_config(tmp_path / "cache"), path), tmp_path)


def test_init_from_a_directory_without_a_checkpoint_is_left_untouched(runs, tmp_path):
    missing, empty = tmp_path / "no_such_run", tmp_path / "empty"
    empty.mkdir()
    config = _lm_config(runs / "gpt" / "data", init_from=str(missing))
    raises_and_keeps(FileNotFoundError, r"config\.train\.init_from='.*no_such_run' is not a "
                     r"directory", lambda: train(config, tmp_path / "run"), runs / "gpt")
    config.train.init_from = str(empty)
    raises_and_keeps(FileNotFoundError, r"config\.train\.init_from='.*empty' holds no checkpoint",
                     lambda: train(config, tmp_path / "run"), runs / "gpt")
    # Orbax's CheckpointManager would have created <init_from>/checkpoints in both.
    assert not missing.exists() and os.listdir(empty) == []


@pytest.mark.parametrize("mesh, message", [
    ({"tensor": 3}, r"mesh: \.params\[.*\] of shape \(\d+,.*\) cannot be split 3 ways "
                    r"\(config\.mesh\.tensor=3\): its dimension \d has \d+ entries"),
    ({"data": 3}, r"mesh: a batch of 8 rows cannot be split over the 3 devices that share each "
                  r"batch \(config\.mesh\.data=3 x config\.mesh\.fsdp=1\); make "
                  r"config\.data\.batch_size .* a multiple of 3"),
], ids=["tensor_does_not_divide_a_width", "batch_does_not_divide"])
def test_mesh_that_does_not_divide_the_model_or_the_batch(runs, tmp_path, mesh, message):
    # jax reports both from inside jit / device_put, naming neither the parameter nor the keys.
    config = _lm_config(runs / "gpt" / "data")
    config.mesh.update(mesh)
    raises_and_keeps(ConfigError, message,
                     lambda: jobs.train(config, str(tmp_path / "run"), devices=jax.devices()[:3]),
                     runs / "gpt")
