"""A corpus cut into pieces that can be read one at a time, in any order, by any process.

Preparing BERT pretraining data on a pod must never hold the corpus whole, and every process
must know which part is its own without reading the rest. A `Piece` is that part: a byte range
of BERT-format text files, a record range of a TFDS split, or a slice of documents already in
memory (the synthetic corpus). `plan_*` cut a corpus into pieces from its size alone (file sizes,
record counts); `read_piece` streams one piece's documents. A piece owns the documents that
*start* inside it, so cutting text files at arbitrary byte offsets still gives every document to
exactly one piece, and the cut never depends on how many processes share the work.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import os
from collections.abc import Iterator, Sequence

from zoo import paths
from zoo.errors import ConfigError, DataError

Document = list[str]
_READ = 1 << 20  # bytes per read while streaming a text file


@dataclasses.dataclass(frozen=True)
class Segment:
    """Bytes [start, stop) of one file: the piece owns documents whose first line starts here."""

    path: str
    start: int
    stop: int


@dataclasses.dataclass(frozen=True)
class Piece:
    """One independently readable part of a corpus.

    kind 'text': `segments` of BERT-format files (one sentence per line, a blank line between
    documents). kind 'tfds': records [start, stop) of TFDS split `split` of `name` in `data_dir`,
    text in feature `text_key`. kind 'documents': the `documents` themselves.
    """

    kind: str
    segments: tuple[Segment, ...] = ()
    name: str = ""
    data_dir: str = ""
    split: str = ""
    text_key: str = ""
    start: int = 0
    stop: int = 0
    documents: tuple[tuple[str, ...], ...] = ()

    def describe(self) -> str:
        """Where the piece lies, for progress lines and error messages."""
        if self.kind == "text":
            return ", ".join(f"{s.path}[{s.start}:{s.stop}]" for s in self.segments)
        if self.kind == "tfds":
            return f"TFDS {self.name!r} split {self.split!r} records [{self.start}:{self.stop}]"
        return f"documents [{self.start}:{self.stop}]"

    @property
    def size(self) -> int:
        """Bytes of text (text pieces), else records or documents: what progress counts."""
        if self.kind == "text":
            return sum(s.stop - s.start for s in self.segments)
        return self.stop - self.start

    def identity(self) -> dict:
        """A JSON-able description that changes when the piece's input changes (plans and cache
        keys): text by path, byte range and modification time, documents by a hash of their
        text, TFDS records by dataset, split and range."""
        if self.kind == "documents":
            h = hashlib.sha256()
            for doc in self.documents:
                for s in doc:
                    h.update(s.encode("utf-8") + b"\n")
                h.update(b"\x00")
            return {"kind": "documents", "start": self.start, "stop": self.stop,
                    "sha256": h.hexdigest()}
        out = dataclasses.asdict(self)
        out.pop("documents")
        if self.kind == "text":  # a file rewritten since (same size or not) is another input
            out["modified"] = [_stat(s.path)[1] for s in self.segments]
        return out


# ---------------------------------------------------------------------------------------------
# Plans.


def plan_text(files: Sequence[str], shard_bytes: int) -> list[Piece]:
    """Pieces of about `shard_bytes` over the concatenated files (small files share a piece).

    The total size is cut into ceil(total / shard_bytes) equal ranges, so no piece is a sliver;
    each range becomes the segments of the files it covers. Only file sizes are read.
    """
    if shard_bytes < 1:
        raise ConfigError(f"config.data.shard_mb must be > 0, got {shard_bytes / 2**20:g}")
    sizes = [(f, _stat(f)[0]) for f in files]
    total = sum(size for _, size in sizes)
    count = max(1, -(-total // shard_bytes))
    bounds = [total * k // count for k in range(count + 1)]
    pieces, offset, file_starts = [], 0, []
    for f, size in sizes:
        file_starts.append((f, offset, offset + size))
        offset += size
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        segments = tuple(Segment(f, max(lo, a) - a, min(hi, b) - a)
                         for f, a, b in file_starts if a < hi and lo < b)
        pieces.append(Piece("text", segments=segments))
    return pieces


# A piece's random B sentences come from its own documents; fewer than this would make NotNext
# pairs from a handful of documents, so small corpora get fewer pieces than asked for.
MIN_DOCUMENTS_PER_PIECE = 16


def _count(items: int, num_pieces: int) -> int:
    return max(1, min(num_pieces, items // MIN_DOCUMENTS_PER_PIECE))


@functools.lru_cache(maxsize=1 << 16)
def _stat(path: str) -> tuple[int, float]:
    """(size in bytes, modification time) of a local file or a bucket object, asked once per
    process (a plan of a large bucket corpus names every file several times)."""
    if paths.is_remote(path):
        info = paths.as_path(path).stat()
        return int(info.length), float(info.mtime or 0)
    info = os.stat(path)
    return info.st_size, info.st_mtime


def plan_documents(documents: Sequence[Sequence[str]], num_pieces: int) -> list[Piece]:
    """Up to `num_pieces` contiguous groups of in-memory documents, each of at least
    MIN_DOCUMENTS_PER_PIECE documents when there are that many."""
    num_pieces = _count(len(documents), num_pieces)
    bounds = [len(documents) * k // num_pieces for k in range(num_pieces + 1)]
    return [Piece("documents", start=a, stop=b,
                  documents=tuple(tuple(d) for d in documents[a:b]))
            for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def plan_tfds(name: str, data_dir: str, split: str, text_key: str, num_records: int,
              num_pieces: int) -> list[Piece]:
    """Up to `num_pieces` contiguous record ranges of a TFDS split of `num_records` records
    (one record is one document: at least MIN_DOCUMENTS_PER_PIECE records each)."""
    num_pieces = _count(num_records, num_pieces)
    bounds = [num_records * k // num_pieces for k in range(num_pieces + 1)]
    return [Piece("tfds", name=name, data_dir=data_dir, split=split, text_key=text_key,
                  start=a, stop=b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


# ---------------------------------------------------------------------------------------------
# Reading.


def read_piece(piece: Piece) -> Iterator[Document]:
    """The piece's documents (lists of stripped sentences), streamed."""
    if piece.kind == "documents":
        yield from (list(d) for d in piece.documents)
    elif piece.kind == "text":
        for segment in piece.segments:
            yield from read_segment(segment)
    elif piece.kind == "tfds":
        yield from _read_tfds(piece)
    else:
        raise ValueError(f"unknown piece kind {piece.kind!r}")


def read_segment(segment: Segment) -> Iterator[Document]:
    """Documents whose first line starts at a byte offset in [segment.start, segment.stop).

    A document starts at a non-blank line that opens the file or follows a blank line (as
    zoo.data.readers.text_files.read_text_corpus reads a whole file); the last one may run
    past `stop`, to its end.
    """
    with paths.open_read(segment.path) as f:
        pos = segment.start
        if pos > 0:
            # Start at the first line beginning at or after `start`; remember whether the line
            # before it was blank (then that line may open a document of ours).
            f.seek(pos - 1)
            pos += len(f.readline()) - 1
            previous_blank = _line_before_is_blank(f, pos)
        else:
            previous_blank = True
        lines = _lines(f, pos, segment.path)
        current: Document = []
        for offset, line in lines:
            if not line:
                if current:
                    yield current
                    current = []
                previous_blank = True
                continue
            if current:
                current.append(line)
            elif previous_blank and offset < segment.stop:
                current = [line]  # a document of ours starts here
            elif offset >= segment.stop:
                return  # past our range, between or inside later documents
            previous_blank = False
        if current:
            yield current


def _lines(f: io.BufferedReader | paths.RetryingReader, pos: int, path: str) -> Iterator[tuple[int, str]]:
    """(byte offset, stripped line) from `pos` on, decoding each line as UTF-8."""
    f.seek(pos)
    first = pos == 0
    for raw in f:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(
                f"{path}: invalid UTF-8 byte 0x{raw[e.start]:02x} at byte offset "
                f"{pos + e.start}; the corpus must be UTF-8 text (re-encode it, e.g. "
                "`iconv -t UTF-8`)") from None
        if first:
            line, first = line.removeprefix("\ufeff"), False
        yield pos, line.strip()
        pos += len(raw)


def _line_before_is_blank(f: io.BufferedReader | paths.RetryingReader, pos: int) -> bool:
    """Whether the line ending just before byte `pos` (a line start) is blank (or absent)."""
    if pos == 0:
        return True
    end, chunks = pos - 1, []  # bytes [.., end) precede that line's '\n'
    start, newline = 0, -1
    while end > 0:
        start = max(0, end - 4096)
        f.seek(start)
        chunk = f.read(end - start)
        newline = chunk.rfind(b"\n")
        chunks.append(chunk[newline + 1:])
        if newline >= 0:
            break
        end = start
    line = b"".join(reversed(chunks)).decode("utf-8", errors="replace")
    if start == 0 and newline < 0:
        line = line.removeprefix("\ufeff")
    return not line.strip()


def _read_tfds(piece: Piece) -> Iterator[Document]:
    # Imported here: TFDS takes ~0.5 s to import, which only jobs reading it should pay.
    from zoo.data.readers import tfds_source

    builder = tfds_source.open_builder(piece.name, piece.data_dir)
    source = tfds_source.open_split(builder, piece.name, piece.split)
    where = f"TFDS dataset {piece.name!r} split {piece.split!r}"
    yield from tfds_source.documents_of_records(source, piece.start, piece.stop,
                                                piece.text_key, where)
