"""README.md stays a front page (at most 8 KB: what zoo is, install, the Quickstart's two
commands, the jobs and links into the docs, where everything else lives); its commands name
configs and variants that exist, and the facts it used to carry are checked where they now
live, in the docs pages."""

import importlib
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")

QUICKSTART = ("pip install -c requirements/lock.txt -e . && python train.py "
              "--config=configs/quickstart.py --workdir=runs/quickstart")
TESTS = "pip install -c requirements/lock.txt -e '.[test,parity]' && python -m pytest -n 2"


def test_the_readme_is_at_most_8_kb():
    size = len(README.encode("utf-8"))
    assert size <= 8192, f"README.md is {size} bytes; move detail into docs/ and link to it"


def test_the_quickstart_commands_are_unchanged_in_the_readme_and_the_docs():
    quickstart = (ROOT / "docs/getting-started/quickstart.md").read_text(encoding="utf-8")
    for text in (README, quickstart):
        lines = text.splitlines()
        assert QUICKSTART in lines and TESTS in lines


def test_every_config_the_readme_runs_exists_with_its_variant():
    commands = re.findall(r"--config=configs/(\w+)\.py(?::([\w=,.]+))?", README)
    assert len(commands) >= 10
    for job, variant in commands:
        module = importlib.import_module(f"configs.{job}")
        config = module.get_config(variant or None)  # an unknown variant key raises
        assert config, job


def test_every_job_config_is_named_in_the_readme():
    jobs = {p.stem for p in (ROOT / "configs").glob("*.py")} - {"__init__", "common"}
    missing = sorted(job for job in jobs if f"{job}.py" not in README)
    assert not missing, f"jobs the README's table does not name: {missing}"


def test_the_docs_keep_the_readmes_former_facts():
    """Sections that left the README, each held to a fact the code backs, on its new page."""
    page = {name: (ROOT / "docs" / name).read_text(encoding="utf-8") for name in (
        "guides/gpu-clusters.md", "explanation/reliability.md", "development/testing.md",
        "guides/cloud-storage.md", "explanation/sharding.md", "development/measurement-log.md")}
    # The launch table: one row per shape tests/train/hosts/test_launch.py checks.
    assert page["guides/gpu-clusters.md"].count("| `srun ") == 5
    assert page["guides/gpu-clusters.md"].count("| `mpirun ") == 3
    # The reliability table names the tests that prove each guarantee, and they exist.
    named = set(re.findall(r"`(tests/[\w/]+\.py)", page["explanation/reliability.md"]))
    assert len(named) >= 15 and all((ROOT / path).exists() for path in named), named
    # The test tiers: the commands .ci/run runs.
    ci = (ROOT / ".ci/run").read_text(encoding="utf-8")
    for command in ("python -m pytest -n 2 -m acceptance", "-m \"numerics and not acceptance\"",
                    "python -m pytest -n 2 -m \"slow and not acceptance\""):
        assert command in ci and command in page["development/testing.md"]
    # The sharding rules: the table is generated from the code, the summary holds to it.
    from zoo.train.partitioning import DEFAULT_RULES
    rules = dict(DEFAULT_RULES)
    assert "generated/sharding_rules.inc" in page["explanation/sharding.md"]
    assert rules["embed"] == "fsdp" and rules["act_batch"] == ("data", "fsdp")
    assert {rules[a] for a in ("mlp", "heads", "vocab")} == {"tensor"}
    # Dated timings live in the measurement log, not in the pages that say what holds now (the
    # changelog too says what changed per version, not when it was measured).
    assert "2026-11-27" in page["development/measurement-log.md"]
    dated = [p.name for p in (ROOT / "docs").rglob("*.md")
             if "generated" not in p.parts and p.name != "measurement-log.md"
             and re.search(r"\b20\d\d-\d\d-\d\d\b", p.read_text(encoding="utf-8"))]
    assert not dated, f"dated timings outside docs/development/measurement-log.md: {dated}"
