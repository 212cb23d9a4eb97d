"""Jobs of several stages run as one: each stage is a whole job config (a config.<stage> block)
trained by the one loop in <workdir>/<stage>, starting from the previous stage's params. The
Quickstart's main job is a pipeline: pretrain tiny BERT, then fine-tune it on SQuAD.

Rerunning the command resumes: a finished stage only re-reports its final eval, an interrupted
one continues from its last checkpoint. At the end, <workdir>/curves.png draws every stage's
training curves and <workdir>/summary.json holds every stage's final eval.
"""

import json

import jax
import ml_collections

from zoo import paths
from zoo.checkpoints.checkpoint import Checkpointer
from zoo.commands import curves, jobs
from zoo.errors import ConfigError


def is_pipeline(config: ml_collections.ConfigDict) -> bool:
    return "stages" in config


def _stage_configs(config: ml_collections.ConfigDict, workdir: str
                   ) -> list[tuple[str, ml_collections.ConfigDict]]:
    """Each stage's config with the pipeline's wiring filled in: one shared data cache (so the
    fine-tuning stage reuses the pretraining tokenizer), and init_from the previous stage."""
    stages, previous = [], None
    for name in config.stages:
        if name not in config:
            raise ConfigError(f"config.stages names {name!r} but the config has no "
                              f"config.{name} block; stages must be among {sorted(config.keys())}")
        stage = ml_collections.ConfigDict(config[name].to_dict())
        if not stage.data.get("cache_dir", ""):
            stage.data.cache_dir = paths.join(workdir, "data")
        if previous is not None and not stage.train.init_from:
            stage.train.init_from = paths.join(workdir, previous)
        stages.append((name, stage))
        previous = name
    return stages


def train(config: ml_collections.ConfigDict, workdir: str) -> dict[str, dict[str, float]]:
    """Trains every stage in order; returns {stage: its final eval summary}."""
    stages = _stage_configs(config, workdir)
    results = {}
    for i, (name, stage) in enumerate(stages, 1):
        _banner(f"stage {i}/{len(stages)}: {name} ({stage.task}) in {paths.join(workdir, name)}")
        stage_dir = paths.join(workdir, name)
        results[name] = jobs.train(stage, stage_dir)
        if _last_step(stage_dir) != stage.train.steps:
            # Preempted (SIGTERM): the next stage must not start from unfinished params.
            _banner(f"stage {name} stopped before step {stage.train.steps}; rerun the same "
                    "command to resume")
            return results
        summary_path = paths.as_path(stage_dir) / "summary.json"
        if jax.process_index() == 0 and summary_path.exists():
            # the final eval plus the task's baselines
            results[name] = json.loads(summary_path.read_text())
    _finish(workdir, stages, results)
    return results


def _last_step(stage_dir: str) -> int | None:
    # The checkpoint, not a file process 0 writes: every process sees the same answer.
    checkpointer = Checkpointer(stage_dir)
    step = checkpointer.latest_step()
    checkpointer.close()
    return step


def evaluate_all(config: ml_collections.ConfigDict, workdir: str) -> dict[str, dict]:
    """eval.py for a pipeline: evaluates every stage's latest checkpoint."""
    results = {}
    for name, stage in _stage_configs(config, workdir):
        _banner(f"evaluating {name} ({stage.task})")
        results[name] = jobs.evaluate(stage, paths.join(workdir, name))
    return results


def _banner(text: str) -> None:
    if jax.process_index() == 0:
        print(f"\n=== {text} ===", flush=True)


def _finish(workdir: str, stages, results) -> None:
    if jax.process_index() != 0:
        return
    paths.write_atomic(paths.join(workdir, "summary.json"), json.dumps(results, indent=2))
    path = paths.join(workdir, "curves.png")
    curves.plot_training_curves([(name, paths.join(workdir, name)) for name, _ in stages],
                                path)
    _banner("done")
    for name, summary in results.items():
        # The numbers only: the goodput account is a dict (its line was printed by the stage).
        shown = ", ".join(f"{k} {v:.4g}" for k, v in summary.items()
                          if isinstance(v, (int, float)))
        print(f"{name}: {shown}", flush=True)
    print(f"training curves: {path}", flush=True)
