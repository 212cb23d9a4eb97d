"""Whether a local disk has room for a preparation, checked before it starts: a disk that fills
after hours of tokenizing costs the hours, and leaves the disk full for everything else.

The estimate is made from the corpus size alone, before any tokenizer exists: tokens from
bytes of text, examples from tokens, bytes from the stored record's size
(zoo.data.pipelines.pretraining.records.record_dtype, so it follows the format). It errs
towards needing more: 0.3 tokens per byte (English text with a ~30k vocabulary gives ~0.25),
examples 80% full (short documents and short_seq_prob leave padding). A bucket has no
free-space figure and is not checked; nor are TFDS and synthetic sources, whose size is not
known in bytes.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Mapping, Sequence

from zoo import paths
from zoo.data.pipelines.pretraining.examples import Settings
from zoo.data.pipelines.pretraining.records import record_dtype
from zoo.data.readers.corpus_pieces import Piece
from zoo.errors import UserError

TOKENS_PER_BYTE = 0.3
FILL = 0.8  # tokens of an example that are not padding


def example_bytes(settings: Settings, vocab_size: int) -> int:
    """Bytes one stored example takes on disk: its format-3 record."""
    return record_dtype(settings, vocab_size).itemsize


def estimate(text_bytes: int, settings: Settings, vocab_size: int) -> tuple[int, int]:
    """(examples, bytes) a preparation of `text_bytes` of text is expected to write."""
    per_pass = text_bytes * TOKENS_PER_BYTE / (FILL * max(settings.max_seq_length - 3, 1))
    examples = math.ceil(per_pass * settings.dupe_factor)
    return examples, examples * example_bytes(settings, vocab_size)


def check_free_space(directory, key: str, pieces: Mapping[str, Sequence[Piece]],
                     settings: Mapping[str, Settings], vocab_size: int) -> None:
    """A UserError naming `directory`, `key` and the keys that shrink the data when the splits'
    `pieces` need more room than the disk under `directory` has free. What the directory holds
    already (a preparation being resumed) counts as written."""
    if paths.is_remote(directory):
        return
    text = {split: sum(p.size for p in ps) for split, ps in pieces.items()
            if ps and all(p.kind == "text" for p in ps)}
    if not text:
        return
    total = sum(estimate(size, settings[split], vocab_size)[1] for split, size in text.items())
    directory = os.fspath(paths.as_path(directory))
    needed = total - bytes_under(directory)
    existing = directory
    while not os.path.exists(existing):  # the nearest ancestor that exists holds the disk
        existing = os.path.dirname(existing)
    free = shutil.disk_usage(existing).free
    if needed <= free:
        return
    train = settings.get("train") or next(iter(settings.values()))
    raise UserError(
        f"{key}={directory}: preparing needs about {_gb(needed)} more ({_gb(sum(text.values()))}"
        f" of text at seq_len {train.max_seq_length}, dupe_factor {train.dupe_factor}, "
        f"{example_bytes(train, vocab_size):,} bytes per example), but its disk has {_gb(free)} free. Free "
        f"space, give {key} a directory on a larger disk (or a gs:// bucket), or prepare less: "
        "config.data.dupe_factor, config.data.seq_len, config.data.dynamic_masking=True (no "
        "stored masks), fewer config.data.train_files")


def bytes_under(directory: str) -> int:
    """Bytes of the files below `directory` (0 when it does not exist)."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass  # a temporary file renamed away while walking
    return total


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB"
