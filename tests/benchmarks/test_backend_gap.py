"""benchmarks.backend_gap: its minimal jax.numpy BERT does the work zoo's BERT does (the same
FLOPs in XLA's cost analysis, forward and gradient, and logits of the same shape), so the
columns compare code, not models; and a small run writes its report."""

import json

import pytest

from benchmarks import backend_gap


@pytest.mark.slow
@pytest.mark.parametrize("size", ["tiny", "mini"])
def test_the_minimal_bert_does_zoos_work(size):
    sides = backend_gap.jax_sides(size, backend_gap.inputs(backend_gap.SIZES[size][3]))
    flops = {}
    for name, (forward, gradient, params) in sides.items():
        assert forward(params).shape == (backend_gap.BATCH, 2)
        flops[name] = [f.lower(params).compile().cost_analysis()["flops"]
                       for f in (forward, gradient)]
    for zoo, minimal in zip(flops["zoo"], flops["minimal"]):
        assert minimal == pytest.approx(zoo, rel=0.03), flops


@pytest.mark.slow
def test_a_run_writes_its_report(tmp_path, monkeypatch):
    monkeypatch.setattr(backend_gap, "SIZES", {"tiny": (1, 2, 32, 64)})
    assert backend_gap.main(["--sizes", "tiny", "--repeats", "1", "--out", str(tmp_path)]) == 0
    lines = [json.loads(line) for line in open(tmp_path / "backend_gap.jsonl")]
    assert set(lines[1]["gradient_ms"]) == {"zoo", "minimal", "hf"}
    assert "| tiny | gradient |" in (tmp_path / "backend_gap.md").read_text()
    assert backend_gap.main(["--sizes", "huge"]) == 2
