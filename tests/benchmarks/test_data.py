"""benchmarks.data: a --quick run as a real process writes its files, and each ratio is the
supply it printed over the demand it printed."""

import json
import os
import re
import subprocess
import sys

import pytest

from benchmarks import data

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _quick(out, stages: str, timeout: int, *extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.data", "--quick", "--out", str(out),
         "--stages", stages, *extra], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_quick_run_writes_results_and_ratios_of_its_printed_numbers(tmp_path):
    # Two stages (one on disk, one in memory), 0 and 1 workers: a few seconds.
    done = _quick(tmp_path, "pretraining_dynamic,squad", 120)
    demand = float(re.search(r"demand: ([\d.]+) examples/s", done.stdout).group(1))
    printed = re.findall(r"^(\S+) +workers=(\d+) +([\d.]+) examples/s +ratio=([\d.]+)",
                         done.stdout, re.M)
    assert [(s, int(w)) for s, w, _, _ in printed] == [
        ("pretraining_dynamic", 0), ("pretraining_dynamic", 1), ("squad", 0), ("squad", 1)]
    for _, _, supply, ratio in printed:
        assert float(supply) > 0
        assert float(ratio) == pytest.approx(float(supply) / demand, rel=1e-3, abs=1e-3)
    lines = [json.loads(x) for x in (tmp_path / "data.jsonl").read_text().splitlines()]
    head, records = lines[0], lines[1:]
    assert head["kind"] == "run" and head["demand"]["examples_per_s"] == pytest.approx(demand,
                                                                                      abs=0.06)
    assert [r["examples_per_s"] for r in records] == pytest.approx(
        [float(s) for _, _, s, _ in printed], abs=0.06)
    table = (tmp_path / "data.md").read_text()
    assert table.count("| pretraining_dynamic |") == 2 and table.count("| squad |") == 2
    assert (tmp_path / "data.png").stat().st_size > 1000


def test_demand_is_peak_times_mfu_over_flops_per_sequence():
    from zoo.models import bert

    need = data.demand("TPU v4", 4, 0.5, 128, 20)
    flops = bert.flops_per_token(bert.config_for_size("base", vocab_size=data.VOCAB_SIZE),
                                 128, 20)
    assert need["examples_per_s"] == pytest.approx(4 * 275e12 * 0.5 / (flops * 128))
    # BERT-base is ~110M parameters: 6N FLOPs/token puts seq-128 demand near 7,800 sequences/s.
    assert 7000 < need["examples_per_s"] < 8500


def test_prepare_stage_reports_mb_per_s_and_memory_at_1x_and_8x(tmp_path):
    _quick(tmp_path, "prepare", 120, "--workers", "1")
    records = [json.loads(x) for x in (tmp_path / "data.jsonl").read_text().splitlines()][1:]
    assert [(r["corpus"], r["workers"]) for r in records] == [("8x", 1), ("1x", 1)]
    eight, one = records
    assert eight["corpus_mb"] == pytest.approx(8 * one["corpus_mb"], rel=0.01)
    for r in records:
        assert r["mb_per_s"] == pytest.approx(r["corpus_mb"] / r["seconds"])
        assert r["rss_mb"] > 10 and r["examples"] > 0
    # 8x the text gives ~8x the examples: every piece was prepared.
    assert 7 < eight["examples"] / one["examples"] < 9
    table = (tmp_path / "data.md").read_text()
    assert f"Peak memory at 8x the corpus / at 1x (1 worker): " \
           f"{eight['rss_mb'] / one['rss_mb']:.2f}" in table


def test_tokenize_stage_times_zoo_beside_hugging_face_on_the_same_ids(tmp_path):
    pytest.importorskip("tokenizers", reason="the stage times zoo beside Hugging Face's "
                        "tokenizers, which the parity extra installs "
                        "(pip install -e '.[parity]')")
    done = _quick(tmp_path, "tokenize", 120)
    (rec,) = [json.loads(x) for x in (tmp_path / "data.jsonl").read_text().splitlines()][1:]
    assert rec["stage"] == "tokenize" and rec["same_ids"] is True and rec["sentences"] > 100
    assert min(rec["zoo_cold_s"], rec["zoo_warm_s"], rec["hf_s"]) > 0
    assert f"zoo cold {rec['corpus_mb'] / rec['zoo_cold_s']:.2f} MB/s" in done.stdout
    table = (tmp_path / "data.md").read_text()
    assert "## Tokenizing" in table and "Hugging Face's ids equal zoo's: yes" in table


@pytest.mark.slow
def test_bucket_stage_reads_each_hosts_share_in_place_and_counts_it_from_the_log(tmp_path):
    # A tiny directory, 30 ms per request, 1 and 4 simulated hosts: ~15 s.
    _quick(tmp_path, "bucket", 180)
    records = [json.loads(x) for x in (tmp_path / "data.jsonl").read_text().splitlines()][1:]
    assert [(r["read_from"], r["hosts"]) for r in records] == [
        ("local", 1), ("bucket", 1), ("local", 4), ("bucket", 4)]
    for r in records:
        assert len(r["per_host"]) == r["hosts"] and r["examples_per_s"] > 0
        if r["read_from"] == "local":
            assert r["peak_disk_bytes"] == r["directory_bytes"] > 0
            continue
        assert r["latency_ms"] == 30 and r["peak_disk_bytes"] == 0  # nothing mirrored
        for host in r["per_host"]:
            # Every span of every step the host consumed was one logged ranged GET, and the
            # row bytes scaled to an epoch are its share: no host reads another's rows.
            assert host["missing_spans"] == 0
            assert host["row_bytes_over_share"] == pytest.approx(1.0, abs=0.1)
            # One GET per run a step touches: at most local / run_rows + 2 per step.
            local = r["local_batch"]
            assert host["rows_requests"] <= (2 * host["steps_per_epoch"] + 1) * (
                local / r["run_rows"] + 2)
            # Opening (manifest, listing, headers, word_starts) is a few sequential requests,
            # each waiting the latency.
            assert host["open_requests"] >= 3 and host["first_batch_s"] > 0.09
    assert records[3]["share_bytes"] == pytest.approx(records[1]["share_bytes"] / 4)
    table = (tmp_path / "data.md").read_text()
    assert table.count("| gs:// (30 ms) |") == 2 and table.count("| local disk |") == 2
