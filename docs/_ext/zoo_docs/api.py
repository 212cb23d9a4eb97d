"""The Python API pages: one page per package of zoo/, found by walking the tree when the docs
are built (a module renamed or added in zoo/ is documented without editing the docs), each
module through autodoc (its docstring, then its public members' docstrings)."""

import ast
import pathlib


def is_moved_path(source: pathlib.Path) -> bool:
    """A module kept only so an old import path works: it calls zoo.deprecation's notice or
    moved at its top level. Documented where its names live now (importing it would print or
    warn)."""
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        call = node.value if isinstance(node, ast.Expr) else None
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr in ("notice", "moved")
                and isinstance(call.func.value, ast.Name) and call.func.value.id == "deprecation"):
            return True
    return False


def packages(root: pathlib.Path) -> dict[str, list[str]]:
    """{package: [its modules]} for every package under zoo/ (a directory with __init__.py),
    old paths that only forward to moved modules left out."""
    found = {}
    for init in sorted((root / "zoo").rglob("__init__.py")):
        directory = init.parent
        package = ".".join(directory.relative_to(root).parts)
        found[package] = sorted(f"{package}.{p.stem}" for p in directory.glob("*.py")
                                if p.stem != "__init__" and not is_moved_path(p))
    return found


def write_pages(root: pathlib.Path, out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    found = packages(root)
    for package, modules in found.items():
        title = f"``{package}``"
        lines = [title, "=" * len(title), "", f".. automodule:: {package}", ""]
        for module in modules:
            lines += [f".. automodule:: {module}", "   :members:", ""]
        (out / f"{package}.rst").write_text("\n".join(lines), encoding="utf-8")
    index = ["# Python API", "",
             "Generated from the docstrings of every module under `zoo/`, one page per package "
             "(the packages are found by walking the tree when the docs are built). The "
             "[architecture](../../explanation/architecture.md) page says what each package is "
             "for.", "", "```{toctree}", ":maxdepth: 1", ""] + list(found) + ["```", ""]
    (out / "index.md").write_text("\n".join(index), encoding="utf-8")
