"""User errors reach the terminal as their message alone (zoo.errors.reported,
zoo.commands.cli): no traceback, exit status 1; ZOO_DEBUG=1 shows the traceback; any other error
keeps it."""

import importlib
import json
import os
import re
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from tests.process_env import process_env
from zoo import errors
from zoo.commands import cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- the handler, in process ----------------------------------------------------------------


def _exit_code(run) -> int:
    with pytest.raises(SystemExit) as info:
        run()
    return info.value.code


def test_a_user_error_prints_its_message_alone_and_exits_1(capsys, monkeypatch):
    monkeypatch.delenv("ZOO_DEBUG", raising=False)

    def run():
        with errors.reported("zoo.tool"):
            print("some progress")
            raise errors.DataError("train.tsv:3: 1 tab-separated fields; fix the row")

    assert _exit_code(run) == 1
    out, err = capsys.readouterr()
    assert out == "some progress\n"
    assert err == "zoo.tool: train.tsv:3: 1 tab-separated fields; fix the row\n"


@pytest.mark.parametrize("error", [errors.ConfigError("bad key"),
                                   errors.MissingFileError("no such run")])
def test_every_user_error_kind_keeps_its_builtin_type_and_is_reported(capsys, monkeypatch,
                                                                      error):
    monkeypatch.delenv("ZOO_DEBUG", raising=False)
    assert isinstance(error, (ValueError, FileNotFoundError))  # `except` clauses keep working

    def run():
        with errors.reported():
            raise error

    assert _exit_code(run) == 1
    assert capsys.readouterr().err == f"error: {error.args[0]}\n"


@pytest.mark.parametrize("value", ["1", "yes"])
def test_zoo_debug_lets_a_user_error_through_with_its_traceback(monkeypatch, value):
    monkeypatch.setenv("ZOO_DEBUG", value)
    with pytest.raises(errors.ConfigError, match="bad key"):
        with errors.reported():
            raise errors.ConfigError("bad key")


@pytest.mark.parametrize("error", [ZeroDivisionError("division by zero"),
                                   RuntimeError("a bug"), ValueError("not a user error")])
def test_an_internal_error_is_not_caught(monkeypatch, error):
    monkeypatch.delenv("ZOO_DEBUG", raising=False)
    with pytest.raises(type(error)):
        with errors.reported():
            raise error


def test_find_returns_the_first_user_error_of_a_chain():
    # ml_collections re-raises a config file's error as a new one of the same type, holding
    # the traceback as text; absl wraps that in its own flag error.
    try:
        try:
            try:
                raise errors.ConfigError("config variant key 'sise' is unknown")
            except ValueError as e:
                raise errors.ConfigError("Error whilst parsing config file:\n\nTraceback") from e
        except ValueError as e:
            raise flags.IllegalFlagValueError("flag --config=...") from e
    except flags.Error as e:
        assert str(errors.find(e)) == "config variant key 'sise' is unknown"
    assert errors.find(RuntimeError("no user error here")) is None


# ---- command-line parsing, in process --------------------------------------------------------


def _flag_values(argv):
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", lock_config=True, flag_values=fv,
                                    sys_argv=list(argv))
    flags.DEFINE_integer("k", 1, "", flag_values=fv)
    return fv


@pytest.mark.parametrize("args, error, message", [
    (["--config=configs/gpt.py:sise=tiny"], errors.ConfigError,
     r"^config variant key 'sise' is unknown; known keys: "
     r"\['corpus', 'corpus_dir', 'size', 'tokenizer'\]$"),
    (["--config=configs/nope.py"], errors.MissingFileError,
     r"^--config=configs/nope\.py: \[Errno 2\] No such file or directory: 'configs/nope\.py'"),
    (["--config=configs/nope.py", "--config.train.steps=2"], errors.MissingFileError,
     r"^--config=configs/nope\.py: \[Errno 2\] No such file"),
    (["--config=configs/gpt.py", "--config.train.stpes=2"], errors.ConfigError,
     r"^unknown config key config\.train\.stpes; did you mean config\.train\.steps\?"),
    (["--config=configs/gpt.py", "--k=many"], errors.ConfigError,
     r"^flag --k=many: invalid literal for int"),
    (["--config=configs/gpt.py", "--kk=1"], errors.ConfigError,
     r"^Unknown command line flag 'kk'"),
], ids=["variant", "missing_file", "missing_file_with_override", "unknown_key", "bad_value",
        "unknown_flag"])
def test_parse_flags_raises_one_user_error(monkeypatch, args, error, message):
    monkeypatch.chdir(REPO)
    argv = ["prog", *args]
    with pytest.raises(error, match=message) as info:
        cli.parse_flags(_flag_values(argv), argv)
    assert "Traceback" not in str(info.value)


def test_parse_flags_returns_the_config():
    argv = ["prog", f"--config={REPO}/configs/gpt.py:size=tiny", "--config.train.steps=7"]
    fv = _flag_values(argv)
    assert cli.parse_flags(fv, argv) == ["prog"]
    assert fv.config.train.steps == 7


@pytest.mark.parametrize("command", ["attention_maps", "word2vec_query"])
@pytest.mark.parametrize("flag", ["--help", "-h", "--helpfull"])
def test_a_command_with_flags_of_its_own_prints_its_help(command, flag, capsys):
    """python -m zoo.commands.<command> --help: the usage (its docstring) and its flags on
    stdout, exit status 0, before any config or workdir is read."""
    module = importlib.import_module(f"zoo.commands.{command}")
    assert _exit_code(lambda: module.main([command, flag, "--config=configs/nope.py"])) == 0
    out = capsys.readouterr().out
    assert out.startswith(module.__doc__.strip().splitlines()[0])
    assert f"python -m zoo.commands.{command}" in out and "  --workdir: " in out


# ---- real commands ---------------------------------------------------------------------------


def _squad_file_with_answers_elsewhere(path):
    document = {"version": "1.1", "data": [{"title": "France", "paragraphs": [{
        "context": "Paris is the capital of France.",
        "qas": [{"id": "q1", "question": "What is the capital?",
                 "answers": [{"text": "Paris", "answer_start": 5}]}]}]}]}
    path.write_text(json.dumps(document))
    return path


_RAISE = ("import sys; sys.path.insert(0, {repo!r}); from zoo import errors\n"
          "with errors.reported():\n    {statement}")


@pytest.fixture(scope="module")
def commands(tmp_path_factory, gcs):
    """Every command at once (each spends seconds importing): name -> (returncode, stderr,
    the workdir it was given). The gs:// cases talk to the `gcs` test server, or (no_server)
    to a port where nothing listens."""
    from tests.gcs_server import free_port

    root = tmp_path_factory.mktemp("commands")
    squad = _squad_file_with_answers_elsewhere(root / "squad.json")
    (root / "empty").mkdir()
    (root / "empty_debug").mkdir()
    gpt = "--config=configs/gpt.py:size=tiny"
    cases = {
        "eval_empty_workdir": ["eval.py", gpt, f"--workdir={root / 'empty'}"],
        "squad_answers_elsewhere": [
            "train.py", "--config=configs/squad.py:size=tiny", "--config.data.source=files",
            f"--config.data.train_file={squad}", f"--config.data.eval_file={squad}",
            f"--workdir={root / 'squad_run'}"],
        "mesh_too_big": ["train.py", gpt, "--config.mesh.tensor=3",
                         f"--workdir={root / 'mesh_run'}"],
        "attention_maps_bad_flag": ["-m", "zoo.commands.attention_maps", gpt,
                                    "--workdir=nowhere", "--text=hi", "--layer=0"],
        "eval_empty_workdir_debug": ["eval.py", gpt, f"--workdir={root / 'empty_debug'}"],
        "user_error": ["-c", _RAISE.format(
            repo=REPO, statement="raise errors.ConfigError('config.x must be 1')")],
        "internal_error": ["-c", _RAISE.format(repo=REPO, statement="1 / 0")],
        "gs_workdir_no_bucket": ["train.py", gpt, "--workdir=gs://no-such-bucket/run"],
        "gs_workdir_no_server": ["eval.py", gpt, f"--workdir=gs://{gcs.bucket()}/run"],
    }
    env = process_env(1)
    env.pop("ZOO_DEBUG", None)
    started = {name: subprocess.Popen(
        [sys.executable, *args], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, env=dict(env, ZOO_DEBUG="1") if name.endswith("_debug") else
        dict(env, STORAGE_EMULATOR_HOST=f"http://127.0.0.1:{free_port()}")
        if name.endswith("_no_server") else env)
        for name, args in cases.items()}
    results = {name: (proc.communicate(timeout=300)[1], proc.returncode)
               for name, proc in started.items()}
    return {name: (code, stderr, root) for name, (stderr, code) in results.items()}


@pytest.mark.parametrize("case, message", [
    ("eval_empty_workdir",
     r"^error: no checkpoint under .*/empty/checkpoints; train first with `python train\.py"),
    ("squad_answers_elsewhere",
     r"^error: .*squad\.json: no usable questions \(1 read, 1 skipped"),
    ("mesh_too_big",
     r"^error: mesh: 1 devices cannot be split as data/fsdp/tensor = \[-1, 1, 3\]; set "
     r"config\.mesh\.data/fsdp/tensor"),
    ("attention_maps_bad_flag",
     r"^zoo\.commands\.attention_maps: Unknown command line flag 'layer'"),
    ("user_error", r"^error: config\.x must be 1$"),
    ("gs_workdir_no_bucket",
     r"^error: --workdir=gs://no-such-bucket/run: bucket no-such-bucket does not exist at "
     r"http://127\.0\.0\.1:\d+ .*; create it \(`gcloud storage buckets create"),
    ("gs_workdir_no_server",
     r"^error: --workdir=gs://zoo-\w+/run: cannot connect to 127\.0\.0\.1:\d+ for Google "
     r"Cloud Storage \(.*\); is the emulator running\? \(STORAGE_EMULATOR_HOST is set\)$"),
])
@pytest.mark.slow
def test_a_user_error_is_one_message_on_the_command_line(commands, case, message):
    returncode, stderr, _ = commands[case]
    assert returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert re.search(message, stderr, re.MULTILINE), stderr[-3000:]


@pytest.mark.slow
def test_eval_leaves_an_empty_workdir_empty(commands):
    assert os.listdir(commands["eval_empty_workdir"][2] / "empty") == []


@pytest.mark.slow
def test_zoo_debug_shows_the_traceback(commands):
    returncode, stderr, _ = commands["eval_empty_workdir_debug"]
    assert returncode == 1
    assert "Traceback (most recent call last)" in stderr
    assert re.search(r"zoo\.errors\.MissingFileError: no checkpoint under .*/empty_debug/", stderr)


@pytest.mark.slow
def test_an_internal_error_keeps_its_traceback(commands):
    returncode, stderr, _ = commands["internal_error"]
    assert returncode == 1
    assert "Traceback (most recent call last)" in stderr
    assert stderr.rstrip().endswith("ZeroDivisionError: division by zero")
