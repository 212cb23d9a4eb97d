"""Every command reads its --config from wherever the user stands, and an installed zoo ships
the configs.

configs/<job>.py import their siblings as `from configs import common`; ml_collections loads
the file by path, so before zoo.commands.cli put the file's package on sys.path this worked only
from the checkout (the current directory under `python -m`) or through train.py's own directory.
"""

import ast
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.process_env import process_env

REPO = pathlib.Path(__file__).resolve().parents[2]


def _commands() -> dict[str, list[str]]:
    """name -> the command line's start: train.py, eval.py and every `python -m zoo.commands.X`
    (found by its `if __name__ == "__main__":`, so a new command is covered without a list)."""
    commands = {"train.py": [str(REPO / "train.py")], "eval.py": [str(REPO / "eval.py")]}
    for path in sorted((REPO / "zoo" / "commands").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
               for node in tree.body):
            commands[path.stem] = ["-m", f"zoo.commands.{path.stem}"]
    return commands


def _takes_config(name: str) -> bool:
    """Whether the command reads a job's --config (through cli.py or config_flags); the others
    (zoo.commands.corpus) have flags of their own."""
    if name in ("train.py", "eval.py"):
        return True
    source = (REPO / "zoo" / "commands" / f"{name}.py").read_text(encoding="utf-8")
    return "config_flags" in source or "cli.run(" in source


@pytest.fixture(scope="module")
def runs_elsewhere(tmp_path_factory):
    """Each command started in an empty directory outside the checkout, with a zoo importable
    the way an install that ships only zoo/ makes it (a directory on PYTHONPATH holding a link
    to zoo/ and nothing else), given an absolute --config and a misspelt key: the cheapest
    run that still loads the config file (the error names the key's right spelling, which only
    the loaded config knows). name -> (returncode, stderr)."""
    root = tmp_path_factory.mktemp("elsewhere")
    site = root / "site"
    site.mkdir()
    (site / "zoo").symlink_to(REPO / "zoo")
    cwd = root / "cwd"
    cwd.mkdir()
    env = process_env(1, PYTHONPATH=str(site))
    env.pop("ZOO_DEBUG", None)
    started = {
        name: subprocess.Popen(
            [sys.executable, *start, f"--config={REPO}/configs/gpt.py:size=tiny",
             "--config.train.stpes=2", f"--workdir={root / 'run'}"],
            cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for name, start in _commands().items() if _takes_config(name)}
    return {name: (proc.communicate(timeout=300)[1], proc.returncode)[::-1]
            for name, proc in started.items()}


def test_every_command_is_covered():
    assert {"train.py", "eval.py", "attention_maps", "word2vec_query", "prepare",
            "compile", "corpus"} <= set(_commands())
    assert {n for n in _commands() if not _takes_config(n)} == {"corpus"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n in _commands() if _takes_config(n)))
def test_a_command_loads_its_config_from_another_directory(runs_elsewhere, name):
    returncode, stderr = runs_elsewhere[name]
    assert "No module named 'configs'" not in stderr, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert returncode == 1, stderr[-3000:]
    assert "unknown config key config.train.stpes; did you mean config.train.steps?" in stderr, \
        stderr[-3000:]


@pytest.mark.parametrize("name", sorted(n for n in _commands() if not _takes_config(n)))
def test_a_command_without_a_config_runs_from_another_directory(tmp_path, name):
    site = tmp_path / "site"
    site.mkdir()
    (site / "zoo").symlink_to(REPO / "zoo")
    env = process_env(1, PYTHONPATH=str(site))
    proc = subprocess.run([sys.executable, *_commands()[name], "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stdout.startswith("usage: "), proc.stdout[:300]


def test_the_wheel_ships_the_configs(tmp_path):
    """A non-editable install has configs/ beside zoo/ (pyproject's packages.find)."""
    # Built from a copy of what the wheel is made of, so no build/ or egg-info lands in the
    # checkout (nor races another test's build).
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in ("zoo", "configs"):
        shutil.copytree(REPO / package, source / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.o"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", str(source), "-w", str(tmp_path / "dist")],
                   check=True, cwd=tmp_path, timeout=300, env=dict(os.environ, PIP_NO_INDEX="1"))
    wheel, = (tmp_path / "dist").glob("zoo-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {p.relative_to(REPO).as_posix() for p in (REPO / "configs").glob("*.py")}
    assert shipped and shipped <= names, sorted(shipped - names)
    assert "zoo/commands/cli.py" in names
