"""The old import paths of modules issue 31 renamed still import, warn once with a
DeprecationWarning naming the new path, and are the new module itself (zoo.deprecation.moved);
names that moved out of a module that stays are still importable from it."""

import importlib
import subprocess
import sys
import warnings

import pytest

from tests.process_env import process_env

MOVED = {
    "zoo.models.transformer": "zoo.models.encoder_decoder",
    "zoo.commands.pipeline": "zoo.commands.stages",
    # BERT pretraining's data, a sub-package of its own.
    "zoo.data.pipelines.pretraining_batches": "zoo.data.pipelines.pretraining.batches",
    "zoo.data.pipelines.pretraining_data": "zoo.data.pipelines.pretraining.job_data",
    "zoo.data.pipelines.pretraining_examples": "zoo.data.pipelines.pretraining.examples",
    "zoo.data.pipelines.pretraining_records": "zoo.data.pipelines.pretraining.records",
    "zoo.data.pipelines.pretraining_store": "zoo.data.pipelines.pretraining.store",
    "zoo.data.pipelines.run_order": "zoo.data.pipelines.pretraining.run_order",
    "zoo.data.pipelines.range_reader": "zoo.data.pipelines.pretraining.range_reader",
    "zoo.data.pipelines.preparation_progress": "zoo.data.pipelines.pretraining.progress",
    "zoo.data.pipelines.preparation_space": "zoo.data.pipelines.pretraining.free_space",
}


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_the_old_path_imports_the_new_module_and_warns_once(old, new, monkeypatch):
    parent, _, leaf = old.rpartition(".")
    new_module = importlib.import_module(new)
    # A fresh import of the old path (an earlier test may have imported it already).
    monkeypatch.delitem(sys.modules, old, raising=False)
    monkeypatch.delattr(sys.modules[parent], leaf, raising=False)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new}"):
        first = importlib.import_module(old)
    assert first is new_module
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second import is silent
        assert importlib.import_module(old) is new_module
        assert getattr(importlib.import_module(parent), leaf) is new_module


def test_the_old_names_work_through_the_old_paths():
    with warnings.catch_warnings():  # warned or not: whether an earlier test imported them first
        warnings.simplefilter("ignore", DeprecationWarning)
        from zoo.commands import pipeline
        from zoo.models import transformer
    assert callable(pipeline.train) and callable(pipeline.is_pipeline)
    assert transformer.EncoderDecoder.__module__ == "zoo.models.encoder_decoder"
    assert callable(transformer.translate) and callable(transformer.config_for_size)


def test_the_pretraining_package_keeps_what_pretraining_py_exported():
    from zoo.data.pipelines import pretraining as pt
    from zoo.data.pipelines.pretraining import store

    assert callable(pt.prepare) and callable(pt.prepare_cached) and callable(pt.prepare_pieces)
    assert pt.PretrainingSource is store.PretrainingSource
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from zoo.data.pipelines import pretraining_store
    assert pretraining_store.PretrainingSource is pt.PretrainingSource


def test_the_attention_maps_command_still_exports_the_extraction():
    from zoo.commands import attention_maps as command
    from zoo.eval import attention_maps as library

    for name in ("AttentionMaps", "KINDS", "maps_for_model", "bert_maps", "gpt_maps",
                 "gpt_classifier_maps", "translation_maps", "alignment_maps"):
        assert getattr(command, name) is getattr(library, name), name


def test_python_m_at_the_old_path_runs_the_new_module(tmp_path):
    """`python -m zoo.commands.pipeline` runs zoo.commands.stages as __main__ (it has no command
    line of its own, so the run is silent and exits 0), with the warning on stderr."""
    proc = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-m",
                           "zoo.commands.pipeline"], capture_output=True, text=True, timeout=120,
                          env=process_env(1))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "python -m zoo.commands.pipeline is deprecated: run python -m zoo.commands.stages" \
        in proc.stderr, proc.stderr[-3000:]
