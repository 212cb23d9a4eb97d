"""Checksums of a checkpoint's files, so silent corruption is caught before a run trusts it.

Orbax notices a truncated or missing file (tensorstore fails to read it) but not flipped bytes:
a damaged chunk restores as different numbers and training carries on from them. So every
checkpoint directory gets a CRC-32 of each file, written inside the temporary directory just
before orbax commits it (the commit makes files and checksums appear together), and a restore
compares them first. CRC-32 because it is a media-error check, not a security one, and reading
a multi-GiB checkpoint through zlib.crc32 costs about as much as copying it.

Checkpoints in a gs:// workdir get none: GCS keeps a CRC32C of every object and checks it on
upload, and recording ours would read the whole checkpoint back over the network after each
save. A record that is there (a checkpoint copied up from a disk) is still checked on restore.
"""

import json
import os
import re
import zlib

from zoo import paths

FILENAME = "zoo_checksums.json"
_CHUNK = 1 << 22
# Orbax writes these after the hook that records checksums (commit markers, the commit time).
_REWRITTEN_AT_COMMIT = ("commit_success.txt", "_CHECKPOINT_METADATA")


def _crc32(path) -> str:
    crc = 0
    with paths.as_path(path).open("rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def _files(directory: str) -> list[str]:
    found = []
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, directory)
            if rel != FILENAME and name not in _REWRITTEN_AT_COMMIT:
                found.append(rel)
    return sorted(found)


def write(directory: str) -> None:
    """Records the size and CRC-32 of every file under `directory` in FILENAME."""
    table = {rel: {"bytes": os.path.getsize(os.path.join(directory, rel)),
                   "crc32": _crc32(os.path.join(directory, rel))}
             for rel in _files(directory)}
    tmp = os.path.join(directory, FILENAME + ".tmp")
    with open(tmp, "w") as f:
        json.dump(table, f, indent=0, sort_keys=True)
    os.replace(tmp, os.path.join(directory, FILENAME))


def owner(rel: str, count: int) -> int:
    """Which of `count` processes checks the file `rel`: the one that wrote it (orbax's OCDBT
    keeps each process's chunks under ocdbt.process_<i>/), the rest spread by name."""
    match = re.search(r"(?:^|/)ocdbt\.process_(\d+)/", rel)
    return (int(match.group(1)) if match else zlib.crc32(rel.encode())) % count


def problems(directory: str, share: tuple[int, int] = (0, 1)) -> list[str] | None:
    """What differs from the recorded checksums ([] = intact), or None when `directory` has no
    record (a checkpoint written before checksums existed, by a synchronous save, or to gs://).

    `share` = (index, count): of a multi-process restore, this process checks only the files
    `owner` gives it, so the processes of a pod read the checkpoint once between them, not once
    each (the restore gathers every process's verdict: damage anywhere is damage for all)."""
    index, count = share
    root = paths.as_path(directory)
    record = root / FILENAME
    if not record.exists():
        return None
    try:
        table = json.loads(record.read_text())
    except (OSError, ValueError) as e:
        return [f"{FILENAME} is unreadable ({e})"]
    found = []
    for rel, expected in sorted(table.items()):
        if owner(rel, count) != index:
            continue
        path = root / rel
        if not path.exists():
            found.append(f"{rel} is missing")
        elif (size := path.stat().length) != expected["bytes"]:
            found.append(f"{rel} has {size} bytes, {expected['bytes']} written")
        elif _crc32(path) != expected["crc32"]:
            found.append(f"{rel} has a different CRC-32 than when it was written")
    return found


def write_newest_pending(checkpoint_dir: str) -> None:
    """Writes checksums into the newest orbax temporary step directory of `checkpoint_dir`: the
    one being committed. (Orbax's post-finalization hook takes no arguments; saves run one at a
    time, so the newest temporary directory is the one in flight, and stale ones left by a
    killed run are older.)"""
    if paths.is_remote(checkpoint_dir):
        return  # see the module docstring
    pending = [os.path.join(checkpoint_dir, name) for name in os.listdir(checkpoint_dir)
               if ".orbax-checkpoint-tmp" in name]
    if pending:
        write(max(pending, key=os.path.getmtime))
