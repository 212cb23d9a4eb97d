"""The layers of docs/explanation/architecture.md, read from every import statement (the AST,
function-local imports included: tests/test_import_cycles.py builds the graph): the tasks and
the trainer stand side by side on the task contract, neither importing the other."""

from tests.test_import_cycles import import_graph


def _imports_of(package: str, graph: dict[str, set[str]]) -> dict[str, set[str]]:
    return {module: targets for module, targets in graph.items()
            if module == package or module.startswith(package + ".")}


def _reaching(importers: dict[str, set[str]], package: str) -> list[str]:
    return sorted(f"{module} -> {target}" for module, targets in importers.items()
                  for target in targets if target == package or target.startswith(package + "."))


def test_tasks_and_the_trainer_import_neither_each_other_nor_the_commands():
    graph = import_graph()
    tasks, train = _imports_of("zoo.tasks", graph), _imports_of("zoo.train", graph)
    assert not _reaching(tasks, "zoo.train"), _reaching(tasks, "zoo.train")
    assert not _reaching(train, "zoo.tasks"), _reaching(train, "zoo.tasks")
    for importers in (tasks, train):
        assert not _reaching(importers, "zoo.commands"), _reaching(importers, "zoo.commands")
    # A pretrained directory's reader is handed to the trainer (zoo.train.init_from), which
    # stands on no conversion code.
    assert not _reaching(train, "zoo.convert"), _reaching(train, "zoo.convert")


def test_the_contract_and_the_layers_below_it_import_no_task_trainer_or_command():
    graph = import_graph()
    for package in ("zoo.contract", "zoo.checkpoints", "zoo.models", "zoo.nn", "zoo.data",
                    "zoo.eval", "zoo.convert", "zoo.decoding"):
        importers = _imports_of(package, graph)
        assert importers, f"{package}: no such package"
        for above in ("zoo.tasks", "zoo.train", "zoo.commands"):
            assert not _reaching(importers, above), _reaching(importers, above)


def test_zoo_has_few_loose_modules_and_the_trainer_few_loose_files():
    from tests.test_import_cycles import ROOT

    loose = sorted(p.name for p in (ROOT / "zoo").glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= 5, loose
    train = sorted(p.name for p in (ROOT / "zoo" / "train").iterdir() if p.is_file())
    assert len(train) <= 15, train
