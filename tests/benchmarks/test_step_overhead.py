"""benchmarks.step_overhead: a small CPU run times every program and writes its report; the TPU
compiler's counts tell the dropout generators apart (threefry's rounds are u32 arithmetic, rbg's
bits one rng-bit-generator op, no dropout neither)."""

import json

import pytest

from benchmarks import step_overhead
from tests.libtpu import needs_libtpu


@pytest.mark.slow
def test_a_cpu_run_times_every_program_and_writes_its_report(tmp_path):
    argv = ["--no-tpu", "--models", "gpt", "--sizes", "tiny", "--seq-lens", "32",
            "--rounds", "1", "--out", str(tmp_path)]
    assert step_overhead.main(argv) == 0
    rows = [json.loads(line) for line in open(tmp_path / "step_overhead.jsonl")]
    programs = {"forward", "grad"}
    programs |= {f"step: {name}" for name in step_overhead.STEP_VARIANTS}
    assert {r["program"] for r in rows} == programs
    assert all(r["median_s"] > 0 for r in rows)
    report = (tmp_path / "step_overhead.md").read_text()
    assert "| gpt | tiny | 32 |" in report


def test_an_unknown_model_is_one_line(tmp_path, capsys):
    assert step_overhead.main(["--no-tpu", "--models", "lstm", "--out", str(tmp_path)]) == 2
    assert "--models: unknown model 'lstm'" in capsys.readouterr().err


def test_instruction_kinds_count_fused_bodies_and_u32_arithmetic():
    hlo = """
  %xor.1 = u32[4,128]{1,0} xor(u32[4,128]{1,0} %a, u32[4,128]{1,0} %b)
  ROOT %add.2 = f32[4]{0} add(f32[4]{0} %c, f32[4]{0} %d), metadata={op_name="x"}
  %rng = (u32[4]{0}, u32[8,8]{1,0}) rng-bit-generator(u32[4]{0} %key), algorithm=rng_default
  %t = f32[8,4]{0,1} transpose(f32[4,8]{1,0} %e), dimensions={1,0}
"""
    kinds = step_overhead._instruction_kinds(hlo)
    assert kinds["xor"] == 1 and kinds["u32 arithmetic"] == 1
    assert kinds["add"] == 1 and kinds["transpose"] == 1
    assert kinds["rng-bit-generator"] == 1


@needs_libtpu
def test_the_tpu_compiler_tells_the_generators_apart(monkeypatch):
    # Tiny BERT (its job trains without dropout: given BERT's 0.1 here), so the compiles are
    # quick.
    dropout = {"dropout_rate": 0.1, "attention_dropout_rate": 0.1}
    for generator in ("threefry", "rbg"):
        monkeypatch.setitem(step_overhead.TPU_VARIANTS, generator, (generator, dropout))
    rows = {v: step_overhead.compile_tpu("bert", "tiny", 64, 8, "v5e-1", v)
            for v in ("threefry", "rbg", "no dropout")}
    assert rows["rbg"]["rng-bit-generator"] > 0 == rows["threefry"]["rng-bit-generator"]
    # threefry's rounds are about twice the u32 instructions of rbg's (BERT-base: 2,035 vs 1,060)
    assert rows["threefry"]["u32 arithmetic"] > 1.5 * rows["rbg"]["u32 arithmetic"]
    assert rows["no dropout"]["u32 arithmetic"] < rows["rbg"]["u32 arithmetic"]
    assert rows["no dropout"]["rng-bit-generator"] == 0
