"""zoo.train.goodput's arithmetic on a known history (the kill-and-resume test,
tests/train/test_resume.py, checks it on real processes): what an earlier run did after the
restored checkpoint moves from productive to wasted, the gap between the runs is recovery, and
productive + every bucket = the wall time of all runs."""

import json

import pytest

from zoo.train import goodput


def _earlier(workdir, **fields):
    record = {"wall_s": 100.0, "productive_s": 70.0, "goodput": 0.7, "runs": 1,
              "lost_s": dict(dict.fromkeys(goodput.BUCKETS, 0.0), startup=20.0, compile=10.0),
              "productive_at": {"40": 30.0, "80": 60.0}, "last_wall": 1000.0, "last_step": 95}
    record.update(fields)
    (workdir / goodput.FILE).write_text(json.dumps(record))


def test_a_resume_counts_the_redone_steps_and_the_gap(tmp_path):
    _earlier(tmp_path)
    account = goodput.Goodput(str(tmp_path))
    account.started = 1030.0  # relaunched 30 s after the killed run's last record
    account.resumed(80)
    assert account.lost["wasted"] == pytest.approx(70.0 - 60.0)  # steps 81-95, done again
    assert account.lost["recovery"] == pytest.approx(30.0)
    assert account.productive_at == {"40": 30.0, "80": 60.0}
    whole = account.account()
    assert whole["runs"] == 2
    assert whole["wall_s"] == pytest.approx(whole["productive_s"] + sum(whole["lost_s"].values()))
    assert whole["lost_s"]["startup"] == pytest.approx(20.0)  # the earlier run's, kept
    account.resumed(40)  # (a resume from an older checkpoint drops the later marks)
    assert set(account.productive_at) == {"40"}


def test_a_damaged_account_starts_afresh(tmp_path):
    (tmp_path / goodput.FILE).write_text("{cut sho")
    account = goodput.Goodput(str(tmp_path))
    account.resumed(10)  # no earlier run known: nothing wasted, no recovery
    assert account.lost["wasted"] == account.lost["recovery"] == 0.0
    assert account.account()["runs"] == 1


def test_the_line_lists_the_buckets_largest_first():
    line = goodput.Goodput.line({"wall_s": 200.0, "goodput": 0.9, "lost_s": dict(
        dict.fromkeys(goodput.BUCKETS, 0.0), compile=12.0, data_wait=8.0, eval=0.05)})
    assert line == "goodput 90.0% of 200 s: compile 6.0%, data_wait 4.0%"
