"""The docs site builds with warnings as errors and its links resolve (docs/README.md has the
command to build and serve it). Sphinx runs nitpicky (conf.py): a cross-reference to a page,
heading or zoo object that does not exist is a warning, so an error here; every relative link
of the markdown pages (and of README.md) must name a file that exists."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# [text](target) and ![alt](target), not inside inline code; the target up to a space or ")".
LINK = re.compile(r"!?\[[^\]`]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _relative_links(page: pathlib.Path):
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http(s):, mailto:, an anchor on the same page
        yield target.split("#", 1)[0]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("html")
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q", "-E",
         str(DOCS), str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
    return run, out


@pytest.mark.slow
def test_the_docs_build_without_a_warning(built):
    run, out = built
    assert run.returncode == 0 and not run.stderr.strip(), run.stderr[-5000:]
    for page in ("index", "generated/configs/index", "generated/configs/bert_pretrain",
                 "generated/api/zoo.nn", "generated/cli/index", "changelog"):
        assert (out / f"{page}.html").exists(), page


@pytest.mark.slow
def test_every_relative_link_in_the_pages_and_the_readme_resolves(built):
    pages = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts) + [ROOT / "README.md"]
    broken = [f"{page.relative_to(ROOT)}: {target}" for page in pages
              for target in _relative_links(page)
              if target and not (page.parent / target).exists()]
    assert not broken, "relative links to nothing:\n" + "\n".join(broken)


def test_the_link_check_catches_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[a](missing.md) `[b](in-code.md)` [c](https://example.com) [d](#here)\n")
    assert list(_relative_links(page)) == ["missing.md"]


@pytest.mark.slow
def test_generated_pages_fit_the_content_column(built):
    """What clipped at 1280 px: the config reference's three-column table (its meaning column cut
    off), docstrings as Python-highlighted literal blocks that never wrap, long code lines. Now
    the keys are definition-list entries, docstrings plain text, and every page loads zoo.css,
    which wraps code and literal blocks and keeps a wide table scrolling inside the column."""
    _, out = built
    css = (out / "_static" / "zoo.css").read_text(encoding="utf-8")
    assert "white-space: pre-wrap" in css and "overflow-x: auto" in css
    pages = sorted(out.rglob("*.html"))
    assert pages and all("_static/zoo.css" in p.read_text(encoding="utf-8") for p in pages
                         if p.parent.name != "_static"), "a page without zoo.css"
    configs = sorted((out / "generated" / "configs").glob("*.html"))
    assert configs and not [p.name for p in configs if "<table" in p.read_text(encoding="utf-8")]
    bert = (out / "generated" / "configs" / "bert_pretrain.html").read_text(encoding="utf-8")
    assert "<dt><code" in bert and "data.seq_len" in bert
    api = sorted((out / "generated" / "api").glob("zoo*.html"))
    assert api
    for page in api:
        html = page.read_text(encoding="utf-8")
        assert "highlight-python" not in html and "highlight-default" not in html, page.name
    assert "zoo-docstring" in (out / "generated" / "api" / "zoo.nn.html").read_text(
        encoding="utf-8")
