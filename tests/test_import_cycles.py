"""No import cycles among the repository's modules (zoo/, benchmarks/, configs/).

The data flow of docs/explanation/architecture.md only reads top to bottom if no module reaches
back to one that imports it. A cycle can hide behind a function-local import or an
`if TYPE_CHECKING:` block and still work at run time, until someone moves an import to the top or
a type checker follows it; so this reads every import statement in the source (the AST, never
importing anything), wherever it sits.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("zoo", "benchmarks", "configs")


def _module_files() -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every .py under the scanned packages."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _imported(name: str, node: ast.ImportFrom | ast.Import, alias: ast.alias,
              modules: dict[str, pathlib.Path]) -> list[str]:
    """The repo modules one imported name loads as its own target."""
    if isinstance(node, ast.Import):
        # `import a.b.c` runs a.b.c (its packages' __init__ files are not edges here: every
        # module would otherwise sit in a cycle with a package __init__ that re-exports it).
        return [alias.name] if alias.name in modules else []
    if node.level:  # relative: from the importing module's package
        package = name.split(".") if name in modules and modules[name].name == "__init__.py" \
            else name.split(".")[:-1]
        base = ".".join(package[:len(package) - node.level + 1]
                        + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    # `from a.b import c`: c is the submodule a.b.c when there is one, else a name in a.b.
    if f"{base}.{alias.name}" in modules:
        return [f"{base}.{alias.name}"]
    return [base] if base in modules else []


def import_graph() -> dict[str, set[str]]:
    modules = _module_files()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        # ast.walk reaches imports inside functions, classes and `if TYPE_CHECKING:` blocks too.
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for alias in node.names:
                    graph[name].update(t for t in _imported(name, node, alias, modules)
                                       if t != name)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path a -> ... -> a) per strongly connected component that has one."""
    # Tarjan's strongly connected components, iterative (a recursive walk of ~500 modules is
    # fine today but should not depend on the recursion limit).
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return [_cycle_in(graph, set(c), c[0]) for c in components]


def _cycle_in(graph: dict[str, set[str]], component: set[str], start: str) -> list[str]:
    # Breadth-first from start back to start inside the component: the shortest cycle through it.
    previous = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    path = [node]
                    while previous[path[-1]] is not None:
                        path.append(previous[path[-1]])
                    return path[::-1] + [start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{start} is in a strongly connected component but on no cycle")


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles (function-local and TYPE_CHECKING imports count):\n" + \
        "\n".join("  " + " -> ".join(c) for c in cycles)


def test_the_walk_sees_local_and_type_checking_imports():
    # The property the cycle test rests on: a cycle made only of a function-local import and a
    # TYPE_CHECKING import is still found.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from zoo import errors\n"
              "def f():\n    from zoo.data.readers import text_files\n    import zoo.paths\n")
    modules = _module_files()
    node_targets = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                node_targets.update(_imported("zoo.retry", node, alias, modules))
    assert node_targets == {"zoo.errors", "zoo.data.readers.text_files", "zoo.paths"}
