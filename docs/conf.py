"""Sphinx configuration of zoo's docs (docs/README: how to build and serve them).

Sphinx + MyST + sphinx-book-theme, the JAX ecosystem's convention (flax, optax, orbax, grain,
jax and MaxText build their docs this way): pages are markdown, the API comes from docstrings
through autodoc, and the pages that must not go stale (config keys, the API's module lists, the
command-line flags, benchmark results) are generated from the code by docs/_ext/zoo_docs at
every build. The build runs with warnings as errors and nitpicky references in the fast test
tier (tests/docs/test_docs_build.py).
"""

import os
import pathlib
import sys

DOCS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))  # zoo, configs and benchmarks, from this checkout
sys.path.insert(0, str(DOCS / "_ext"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

project = "zoo"
author = "the zoo authors"
copyright = "the zoo authors, Apache-2.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "zoo_docs",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "README.md", "_ext"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# References that do not resolve are errors (with -W), ...
nitpicky = True
# ... except Python objects outside zoo (numpy, jax, flax types in signatures), which these
# docs do not link to another project's inventory (the build runs offline).
nitpick_ignore_regex = [(r"py:.*", r"(?!zoo\.).*")]
autodoc_typehints = "none"
autodoc_member_order = "bysource"
# zoo's docstrings are plain text (short Google-style, shapes, formulas such as |i - j|), not
# reStructuredText; docs/_ext/zoo_docs shows each one as written, as wrapping plain text.
zoo_docstrings_verbatim = True

html_theme = "sphinx_book_theme"
html_title = "zoo"
html_theme_options = {"show_toc_level": 2, "home_page_in_toc": True}
# Long code lines and docstrings wrap inside the content column (docs/_static/zoo.css).
html_static_path = ["_static"]
html_css_files = ["zoo.css"]
