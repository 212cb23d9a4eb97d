"""benchmarks.smoke, the first-contact suite for a lent accelerator, on this CPU: it skips with one
line; with --allow-cpu --tiny its stages run for real and its report reads their results; a
stage that fails, hangs or does not fit the budget is recorded and the suite goes on."""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from benchmarks import smoke

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_on_a_cpu_it_skips_with_one_line_and_writes_nothing(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks.smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and "skipped: jax sees no GPU or TPU here (backend cpu)" in lines[0]
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_tiny_stages_run_for_real_and_the_report_reads_their_results(tmp_path):
    code = smoke.main(["--allow-cpu", "--tiny", "--stages", "attention", "gpt",
                       "--out", str(tmp_path)])
    assert code == 0
    report = json.loads((tmp_path / "smoke.json").read_text())
    assert [(s["name"], s["status"], s["exit"]) for s in report["stages"]] == [
        ("attention", "ok", 0), ("gpt", "ok", 0)]
    assert report["device"].startswith("cpu") and report["tiny"] is True
    counts = report["headlines"]["attention"]["counts"]
    # einsum, blockwise and pallas_gpu (interpreted) x float32, bfloat16; cuDNN needs a GPU
    assert counts == {"ok": 6, "mismatch": 0, "unsupported": 2, "error": 0}
    (row,) = report["headlines"]["train_steps"]
    assert (row["model"], row["size"], row["seq_len"]) == ("gpt", "tiny", 32)
    assert row["tokens_per_s"] > 0 and row["mfu_vs_matmul"] > 0
    assert row["dry_run_bytes"] > 0 and row["program_bytes"] > 0
    log = (tmp_path / "smoke.log").read_text()
    assert "== attention:" in log and "== gpt:" in log and "dry run: lm" in log


@pytest.fixture
def fake_modules(tmp_path, monkeypatch):
    """Stage modules that fail, hang (with a child of their own) or pass, importable by the
    stage processes."""
    (tmp_path / "stage_fails.py").write_text("print('about to fail'); raise SystemExit(3)\n")
    (tmp_path / "stage_hangs.py").write_text(textwrap.dedent("""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print("child", child.pid, flush=True)
        time.sleep(600)
    """))
    (tmp_path / "stage_passes.py").write_text("import sys; print('args', sys.argv[1:])\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return tmp_path


def test_a_failing_or_hanging_stage_is_recorded_and_its_processes_killed(fake_modules):
    log_path = fake_modules / "log"
    with open(log_path, "w") as log:
        failed = smoke.run_stage(smoke.Stage("attention", "stage_fails", (), 60),
                                 str(fake_modules), 60, log)
        hung = smoke.run_stage(smoke.Stage("bert", "stage_hangs", (), 5),
                               str(fake_modules), 5, log)
    assert (failed["status"], failed["exit"], failed["tail"][0]) == ("failed", 3, "about to fail")
    assert hung["status"] == "timeout" and hung["seconds"] < 60
    grandchild = int(next(line for line in hung["tail"] if line.startswith("child")).split()[1])
    assert _gone(grandchild)
    assert "about to fail" in log_path.read_text()


def _gone(pid: int) -> bool:
    """Whether `pid` has exited (absent, or a zombie nobody has reaped yet), within 5 s."""
    for _ in range(100):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_stages_beyond_the_budget_are_skipped_and_named_and_a_failure_sets_exit_1(
        fake_modules, monkeypatch, capsys):
    monkeypatch.setattr(smoke, "TINY", (
        smoke.Stage("attention", "stage_passes", ("--x",), 60),
        smoke.Stage("bert", "stage_fails", (), 60),
        smoke.Stage("scaling", "stage_passes", (), 10_000),
    ))
    code = smoke.main(["--allow-cpu", "--tiny", "--out", str(fake_modules / "out")])
    assert code == 1
    report = json.loads((fake_modules / "out" / "smoke.json").read_text())
    assert [s["status"] for s in report["stages"]] == ["ok", "failed", "skipped"]
    assert report["stages"][0]["tail"] == [
        f"args ['--x', '--out', '{fake_modules / 'out'}']"]
    out = capsys.readouterr().out
    assert "scaling: skipped: its limit 10000 s exceeds" in out and "--stages scaling" in out


def test_unknown_stage_is_a_config_error():
    with pytest.raises(smoke.ConfigError, match="--stages: unknown \\['foo'\\]"):
        smoke.main(["--stages", "foo"])
