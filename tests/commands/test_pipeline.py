"""zoo.commands.stages: stages run in order, each from the previous one's params, and a stage that
stopped early (preemption) never hands unfinished params to the next."""

import json

import ml_collections
import pytest

from zoo.commands import jobs, stages


def _pipeline(tiny_lm_config):
    config = ml_collections.ConfigDict()
    config.stages = ["first", "second"]
    config.first = tiny_lm_config(steps=4, eval_every=4, checkpoint_every=4)
    config.second = tiny_lm_config(steps=3, eval_every=3, checkpoint_every=3)
    return config


@pytest.mark.slow
def test_stages_chain_share_the_cache_and_draw_curves(tiny_lm_config, tmp_path, capsys):
    results = stages.train(_pipeline(tiny_lm_config), str(tmp_path))
    out = capsys.readouterr().out
    assert "stage 1/2: first" in out and "stage 2/2: second" in out
    assert f"initialised params from {tmp_path}/first/checkpoints step 4" in out
    assert results["first"]["step"] == 4 and results["second"]["step"] == 3
    assert "unigram_perplexity" in results["second"]  # the task's baseline travels along
    assert json.load(open(tmp_path / "summary.json")) == results
    assert (tmp_path / "curves.png").stat().st_size > 0
    # One tokenizer for both stages, trained once in the shared cache.
    assert len(list((tmp_path / "data").glob("spm-*.model"))) == 1


@pytest.mark.slow
def test_a_preempted_stage_stops_the_pipeline(tiny_lm_config, tmp_path, monkeypatch, capsys):
    real_run = jobs.train

    def preempted_first_stage(config, workdir):
        if workdir.endswith("first"):
            config = ml_collections.ConfigDict(config.to_dict())
            config.train.steps = 2  # as if SIGTERM arrived at step 2 of 4
        return real_run(config, workdir)

    monkeypatch.setattr(jobs, "train", preempted_first_stage)
    results = stages.train(_pipeline(tiny_lm_config), str(tmp_path))
    assert "second" not in results and not (tmp_path / "second").exists()
    assert not (tmp_path / "curves.png").exists()
    assert "stage first stopped before step 4; rerun the same command" in capsys.readouterr().out


def test_a_stage_name_without_its_block_is_named(tiny_lm_config, tmp_path):
    config = _pipeline(tiny_lm_config)
    config.stages = ["first", "third"]
    with pytest.raises(ValueError, match="config.stages names 'third'"):
        stages.train(config, str(tmp_path))
