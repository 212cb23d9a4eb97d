"""zoo's Sphinx extension: the pages that must never go stale are generated from the code at
build time, into docs/generated/ (ignored by git), before Sphinx reads any source:

- generated/configs/: every config key of every job in configs/, its default and its meaning
  (meanings from docs/config_keys.yaml; configs.py);
- generated/api/: one autodoc page per package, the modules found by walking zoo/ (api.py);
- generated/cli/: the command-line programs' flags, read from their source (cli.py);
- generated/benchmarks/: every results/<machine>/*.md page with its plots (benchmarks.py).
"""

import pathlib
import shutil

from zoo_docs import api, benchmarks, cli, configs

DOCS = pathlib.Path(__file__).resolve().parents[2]
ROOT = DOCS.parent
GENERATED = DOCS / "generated"


def generate(out: pathlib.Path = GENERATED) -> None:
    """Writes every generated page under `out` (emptied first)."""
    if out.exists():
        shutil.rmtree(out)
    configs.write_pages(ROOT, out / "configs")
    api.write_pages(ROOT, out / "api")
    cli.write_pages(ROOT, out / "cli")
    benchmarks.write_pages(ROOT, out / "benchmarks")
    _write_sharding_rules(out / "sharding_rules.inc")


def _write_sharding_rules(path: pathlib.Path) -> None:
    """DEFAULT_RULES as a table, included by explanation/sharding.md (.inc: not a page)."""
    from zoo.train.partitioning import DEFAULT_RULES

    lines = ["| logical axis | mesh axes |", "|---|---|"]
    for logical, mesh in DEFAULT_RULES:
        axes = ", ".join(f"`{a}`" for a in ((mesh,) if isinstance(mesh, str) else mesh or ()))
        lines.append(f"| `{logical}` | {axes or 'not sharded (replicated)'} |")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _on_builder_inited(app) -> None:
    generate(pathlib.Path(app.srcdir) / "generated")


def _verbatim_docstring(app, what, name, obj, options, lines) -> None:
    """Shows a docstring as written: zoo's are plain text (shapes, formulas, indented command
    lines), which reStructuredText would misread as markup. A plain-text block (not Python: no
    keyword colouring of prose) of class zoo-docstring, which wraps (docs/_static/zoo.css)."""
    if app.config.zoo_docstrings_verbatim and any(line.strip() for line in lines):
        text = [line.rstrip() for line in lines]
        lines[:] = ([".. code-block:: text", "   :class: zoo-docstring", ""]
                    + ["   " + line if line else "" for line in text] + [""])


def setup(app):
    app.add_config_value("zoo_docstrings_verbatim", True, "env")
    app.connect("builder-inited", _on_builder_inited)
    app.connect("autodoc-process-docstring", _verbatim_docstring)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
