"""The Python API pages: one page per package of zoo/, found by walking the tree when the docs
are built (a module renamed or added in zoo/ is documented without editing the docs), each
module through autodoc (its docstring, then its public members' docstrings)."""

import pathlib


def packages(root: pathlib.Path) -> dict[str, list[str]]:
    """{package: [its modules]} for every package under zoo/ (a directory with __init__.py)."""
    found = {}
    for init in sorted((root / "zoo").rglob("__init__.py")):
        directory = init.parent
        package = ".".join(directory.relative_to(root).parts)
        found[package] = sorted(f"{package}.{p.stem}" for p in directory.glob("*.py")
                                if p.stem != "__init__")
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
