"""benchmarks.compile's readiness rows for several slices, without compiling anything (the
compiles are the tpu_compiler tests' in tests/train)."""

from benchmarks import compile as bench_compile

_ROW = {"recipe": "BERT-large phase 2", "fits": True, "total_gib": 8.9, "hbm_gib": 16.0,
        "executed_flops": 1.0e12, "sent_mib": 5769.0, "comm_ms": 30.0,
        "compute_ms_at_50pct_mfu": 10.0}


def test_a_slice_name_may_count_slices():
    two = bench_compile._slice("2xv5e-256")
    assert (two.name, two.num_slices, two.devices) == ("v5e-256", 2, 512)
    assert bench_compile._slice("v4-32").num_slices == 1


def test_each_slice_runs_the_recipes_batch():
    config, _ = bench_compile._recipe_job("BERT-base phase 1", bench_compile._slice("2xv5e-16"))
    assert config.data.batch_size == 2 * bench_compile.RECIPES["BERT-base phase 1"][3]


def test_overrides_reach_the_model_and_other_sections():
    config, _ = bench_compile._job("bert", "tiny", 64, 8, {"remat": "full",
                                                           "train.dropout_rng": "threefry"})
    assert (config.model.remat, config.train.dropout_rng) == ("full", "threefry")


def test_the_table_gives_what_crosses_slices_and_a_dash_on_one_slice():
    rows = [dict(_ROW, slice="v5e-256", batch=256),
            dict(_ROW, slice="2xv5e-256", batch=512, dcn_mib=23.1, dcn_ms=7.7)]
    one, two = bench_compile.readiness_markdown(rows).splitlines()[2:]
    assert "| 2xv5e-256 | 512 | yes |" in two and "| 23 | 7.7 |" in two
    assert "| - | - |" in one
    assert two.endswith("| 3.77 |")  # (30.0 + 7.7) / 10.0: ICI and DCN as if not overlapped
