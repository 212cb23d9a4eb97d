"""Rows of 1-D `.npy` arrays that live in a bucket, read where they lie: ranged GETs of the rows
a process needs, never a copy of the objects.

`RemoteArrays` opens the objects of one directory (one listing for their sizes, one concurrent
batch of GETs for their headers), checks each is whole, and then turns row spans into byte
ranges fetched concurrently (gcsfs `cat_ranges`: one GET per contiguous span), with transient
errors retried (zoo.retry). `ReadAhead` fetches what the next batches need on background
threads: training's order is known ahead, so by the time a step asks for its rows they are
usually here already.
"""

from __future__ import annotations

import concurrent.futures
import io
import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import fsspec
import numpy as np

from zoo.retry import retrying
from zoo.errors import DataError

T = TypeVar("T")
_HEADER_BYTES = 4096  # np.save pads headers to 64 bytes; ours are a few hundred


def _bucket_path(url: str) -> str:
    return url.split("://", 1)[1]


def _corrupt(url: str, detail: str) -> DataError:
    return DataError(
        f"prepared pretraining data: the object {url} {detail}; prepare the directory again "
        "(python -m zoo.commands.prepare) or check that the bucket holds every object the "
        "preparation wrote (a partial copy or a lifecycle rule can remove some)")


class RemoteArrays:
    """The 1-D structured `.npy` objects `urls` (all in one directory), `rows[i]` records of
    `dtype` each, read by row spans."""

    def __init__(self, urls: Sequence[str], rows: Sequence[int], dtype: np.dtype):
        self.urls, self.rows, self.dtype = list(urls), [int(r) for r in rows], np.dtype(dtype)
        self._fs = fsspec.filesystem("gs")
        self.requests = 0  # GETs issued for rows (for tests and benchmarks)
        directory = os.path.dirname(self.urls[0])
        listing = retrying(lambda: self._fs.ls(_bucket_path(directory), detail=True),
                           what=f"listing {directory}")
        sizes = {entry["name"].rstrip("/"): int(entry.get("size") or 0) for entry in listing}
        for url in self.urls:
            if _bucket_path(url) not in sizes:
                raise _corrupt(url, "is missing")
        headers = self._fetch([(i, 0, min(_HEADER_BYTES, sizes[_bucket_path(u)]))
                               for i, u in enumerate(self.urls)], count=False)
        self.offsets = [self._data_offset(i, h, sizes[_bucket_path(u)])
                        for i, (u, h) in enumerate(zip(self.urls, headers))]

    def _data_offset(self, i: int, header: bytes, size: int) -> int:
        url = self.urls[i]
        f = io.BytesIO(header)
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        except (ValueError, SyntaxError) as e:  # short or not an .npy header
            if len(header) == _HEADER_BYTES:  # a long header: fetch it whole
                return self._data_offset(i, self._fetch([(i, 0, 1 << 20)], False)[0], size)
            raise _corrupt(url, f"is not a readable .npy file ({e})") from None
        if shape != (self.rows[i],) or dtype != self.dtype or fortran:
            raise _corrupt(url, f"holds {dtype}{list(shape)}, the manifest says "
                                f"{self.dtype}[{self.rows[i]}]")
        want = f.tell() + self.rows[i] * self.dtype.itemsize
        if size != want:
            raise _corrupt(url, f"is {'truncated' if size < want else 'too long'} ({size:,} "
                                f"bytes, {want:,} expected)")
        return f.tell()

    def _fetch(self, ranges: list[tuple[int, int, int]], count: bool = True) -> list[bytes]:
        """Bytes [start, end) of object i for each (i, start, end), fetched concurrently; the
        ranges that fail transiently are retried (zoo.retry), a missing object or a short
        read is a DataError."""
        out: list[bytes | None] = [None] * len(ranges)

        def attempt():
            todo = [k for k, v in enumerate(out) if v is None]
            if count:
                self.requests += len(todo)
            got = self._fs.cat_ranges([_bucket_path(self.urls[ranges[k][0]]) for k in todo],
                                      [ranges[k][1] for k in todo],
                                      [ranges[k][2] for k in todo], on_error="return")
            failed = None
            for k, value in zip(todo, got):
                if isinstance(value, FileNotFoundError):
                    raise _corrupt(self.urls[ranges[k][0]], "is missing") from None
                if isinstance(value, BaseException):
                    failed = value
                else:
                    out[k] = value
            if failed is not None:
                raise failed

        first = ranges[0] if ranges else (0, 0, 0)
        retrying(attempt, what=f"reading {len(ranges)} byte ranges of {self.urls[first[0]]}"
                                f"{' and others' if len(self.urls) > 1 else ''}")
        for (i, start, end), value in zip(ranges, out):
            if len(value) != end - start:
                raise _corrupt(self.urls[i], f"ended early: bytes {start}-{end} gave "
                                             f"{len(value)}")
        return out

    def read(self, spans: Sequence[tuple[int, int, int]]) -> np.ndarray:
        """Records of rows [lo, hi) of object i for each (i, lo, hi), concatenated in order:
        one GET per span."""
        size = self.dtype.itemsize
        ranges = [(i, self.offsets[i] + lo * size, self.offsets[i] + hi * size)
                  for i, lo, hi in spans if hi > lo]
        data = b"".join(self._fetch(ranges)) if ranges else b""
        return np.frombuffer(data, self.dtype)

    def __repr__(self) -> str:
        return f"RemoteArrays({len(self.urls)} objects under {os.path.dirname(self.urls[0])})"


class ReadAhead(Generic[T]):
    """`get(k)` is `fetch(k)`, while the next `depth` keys this consumer will ask for
    (k + stride, k + 2 * stride, ...) are fetched on background threads.

    At most 2 * depth results are held (the ones fetched ahead, and a few a concurrent
    consumer skipped past: grain's two reader threads ask for neighbouring keys at once), so
    memory stays bounded by the caller's choice of depth. `held_bytes` / `peak_bytes` count
    the fetched results waiting in it (`nbytes` of each), so a caller can check its bound. The
    threads are daemons: a finished (or dying) training process never waits for reads ahead.
    """

    def __init__(self, fetch: Callable[[int], T], depth: int, stride: int = 1,
                 threads: int | None = None, nbytes: Callable[[T], int] = lambda _: 0):
        self._fetch, self.depth, self._stride, self._nbytes = fetch, depth, max(1, stride), nbytes
        # One thread per key read ahead: a fetch is a wait on the bucket's latency, not work,
        # so `depth` batches in flight give depth x the feed of one. With 2 threads a host
        # read 7,155 examples/s at 30 ms a request (benchmarks.data, stage bucket), half what
        # BERT-base on a TPU v4 host needs twice over.
        threads = threads or max(1, depth)
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._sizes: dict[int, int] = {}  # key -> bytes of a fetched result still held
        self.held_bytes = self.peak_bytes = 0
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = threads
        for _ in range(threads):
            threading.Thread(target=self._work, name="zoo-read-ahead", daemon=True).start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            key, future = item
            if future.set_running_or_notify_cancel():
                try:
                    result = self._fetch(key)
                except BaseException as e:  # noqa: BLE001 - handed to the consumer
                    future.set_exception(e)
                    continue
                with self._lock:
                    if self._pending.get(key) is future:  # not dropped while it was read
                        self._sizes[key] = self._nbytes(result)
                        self.held_bytes += self._sizes[key]
                        self.peak_bytes = max(self.peak_bytes, self.held_bytes)
                future.set_result(result)

    def _drop(self, key: int) -> concurrent.futures.Future | None:
        future = self._pending.pop(key, None)
        self.held_bytes -= self._sizes.pop(key, 0)
        return future

    def get(self, key: int) -> T:
        with self._lock:
            future = self._drop(key)
            for j in range(1, self.depth + 1):
                ahead = key + j * self._stride
                if ahead not in self._pending:
                    self._pending[ahead] = concurrent.futures.Future()
                    self._queue.put((ahead, self._pending[ahead]))
            # Left behind by a jump (a restored position) or by a consumer running ahead.
            while len(self._pending) > 2 * self.depth:
                self._drop(max(self._pending, key=lambda k: abs(k - key))).cancel()
        return future.result() if future is not None else self._fetch(key)

    def close(self) -> None:
        with self._lock:
            for future in self._pending.values():
                future.cancel()
            self._pending.clear()
            self._sizes.clear()
            self.held_bytes = 0
        for _ in range(self._threads):
            self._queue.put(None)
