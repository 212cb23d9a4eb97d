"""benchmarks.machine: the interval of a ratio timed in turns, and the wait for an idle
machine before each turn."""

import math
import random
import subprocess
import sys
import time

import pytest

from benchmarks import machine


def test_the_interval_is_the_order_statistics_a_binomial_count_gives():
    # 20 turns: P(Binomial(20, 1/2) <= 5) = 0.0207, so [r_(6), r_(15)] covers the median with
    # 1 - 2 * 0.0207 = 0.959; [r_(7), r_(14)] would cover 0.885, under 90%.
    ours = [1.0 + i / 10 for i in range(20)]
    random.Random(0).shuffle(ours)
    out = machine.ratio_interval(ours, [1.0] * 20)
    assert (out["low"], out["high"], out["turns"]) == (1.5, 2.4, 20)
    assert out["ratio"] == pytest.approx(1.95)
    assert out["coverage"] == pytest.approx(1 - 2 * sum(math.comb(20, i) for i in range(6)) / 2**20)


def test_too_few_turns_give_the_whole_range_and_say_how_little_it_covers():
    out = machine.ratio_interval([3.0, 1.0, 2.0], [1.0, 1.0, 2.0])
    assert (out["low"], out["ratio"], out["high"]) == (1.0, 1.0, 3.0)
    assert out["coverage"] == pytest.approx(0.75)  # 1 - 2 / 2^3


def test_the_interval_holds_the_true_median_as_often_as_it_says():
    """Per-turn ratios drawn from a skewed distribution whose median is 1: over many runs of 15
    turns the interval holds 1 at least as often as its stated coverage (the order-statistic
    interval is exact for any continuous distribution)."""
    rng = random.Random(1)
    held, coverage = 0, None
    for _ in range(3000):
        ratios = [math.exp(rng.gauss(0, 0.1)) ** 3 for _ in range(15)]
        out = machine.ratio_interval(ratios, [1.0] * 15)
        coverage = out["coverage"]
        held += out["low"] <= 1.0 <= out["high"]
    assert coverage >= 0.9
    assert held / 3000 >= coverage - 0.02


def test_sides_of_different_lengths_are_an_error():
    with pytest.raises(ValueError, match="one per turn"):
        machine.ratio_interval([1.0, 2.0], [1.0])


def _spinning_child(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time\nend = time.time() + {seconds}\n"
                             "while time.time() < end: pass"])


def test_the_wait_covers_another_process_still_spinning():
    """A peer process (HF's Flax step, in its own venv) whose threads keep running after its
    step: the next side's timed step starts only when it has stopped."""
    child = _spinning_child(0.4)
    try:
        time.sleep(0.05)  # started and spinning
        waited = machine.wait_until_idle((child.pid,), quiet_s=0.05)  # a loaded box too
        assert waited >= 0.2, waited  # it waited for the spin, not just its own process
        child.wait(timeout=5)
    finally:
        child.kill()


def test_the_wait_is_bounded():
    child = _spinning_child(30)
    try:
        time.sleep(0.05)
        start = time.perf_counter()
        machine.wait_until_idle((child.pid,), limit_s=0.3)
        assert time.perf_counter() - start < 1.5
        assert child.poll() is None  # still spinning: the wait gave up, as bounded
    finally:
        child.kill()
        child.wait()
