"""docs/guides/adding-a-model.md, followed literally: a copy of the repository gets every file the
guide writes (each code block captioned with its path), the registry line it adds, and then runs
the guide's commands; the new task must train, its test pass and the run leave its summary."""

import json
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.process_env import process_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guides" / "adding-a-model.md"
# What the copy needs besides the guide's files: the package, the configs, the two mains and
# the test setup (pytest's options and the suite's conftest).
COPIED = ("zoo", "configs", "train.py", "eval.py", "pyproject.toml", "tests/conftest.py",
          "tests/process_env.py", "tests/numerics.py")
REGISTRY = "zoo/tasks/__init__.py"


def guide_blocks() -> dict[str, str]:
    """Caption -> code of every captioned code block of the guide."""
    text = GUIDE.read_text(encoding="utf-8")
    blocks = re.findall(r"```\{code-block\} \w+\n:caption: (\S+)\n\n(.*?)```", text, re.S)
    return dict(blocks)


def test_the_guide_writes_a_model_task_config_and_test():
    assert set(guide_blocks()) == {"zoo/models/bigram.py", "zoo/tasks/bigram.py", REGISTRY,
                                   "configs/bigram.py", "tests/tasks/test_bigram.py", "commands"}


@pytest.mark.slow
def test_following_the_guide_trains_the_new_model(tmp_path):
    copy = tmp_path / "repo"
    for name in COPIED:
        source, target = ROOT / name, copy / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, target)
    blocks = guide_blocks()
    for path, code in blocks.items():
        if path in ("commands", REGISTRY):
            continue
        assert not (copy / path).exists(), f"the guide's {path} would overwrite a file"
        (copy / path).parent.mkdir(parents=True, exist_ok=True)
        (copy / path).write_text(code, encoding="utf-8")
    registry = (copy / REGISTRY).read_text(encoding="utf-8")
    assert registry.count("_REGISTRY = {\n") == 1
    (copy / REGISTRY).write_text(registry.replace("_REGISTRY = {\n",
                                                  "_REGISTRY = {\n" + blocks[REGISTRY]))

    workdir = tmp_path / "bigram"
    env = process_env(1)
    for line in blocks["commands"].strip().splitlines():
        argv = [sys.executable if word == "python" else word.replace("/tmp/bigram", str(workdir))
                for word in shlex.split(line)]
        # The copy first on the path: its zoo (with the new task), not the installed one.
        proc = subprocess.run(argv, cwd=copy, env=dict(env, PYTHONPATH=str(copy)),
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{line}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["perplexity"] < summary["unigram_perplexity"], summary
