"""The console line of a preparation, one per finished shard, read like training's
(zoo.train.metrics.Progress): a bar, shards done of this process's share, input done,
examples/s and MB/s since the start, worker count, ETA.

    [#######.............] shards 3/8 | 1.2 of 3.4 MB | 2,345 examples/s, 0.41 MB/s | 4 workers | ETA 0:00:05

The ETA divides the input left by the input rate so far: pieces differ in size, so shards
left x time per shard would be off by the spread of the sizes.
"""

from __future__ import annotations

import datetime
import time


class Progress:
    def __init__(self, shards: int, total_size: int, unit: str, workers: int):
        """`total_size` in the pieces' unit: bytes of text ('MB' shown) or records."""
        self.shards, self.total, self.unit, self.workers = shards, total_size, unit, workers
        self._scale = 1e6 if unit == "MB" else 1
        self._start = time.perf_counter()
        self.done = self.size = self.rows = 0

    def update(self, size: int, rows: int) -> str:
        """Counts one finished shard of `size` input and `rows` examples; returns the line."""
        self.done, self.size, self.rows = self.done + 1, self.size + size, self.rows + rows
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        rate = self.size / elapsed
        eta = datetime.timedelta(seconds=round((self.total - self.size) / max(rate, 1e-9)))
        filled = int(20 * self.size / max(self.total, 1))
        digits = 1 if self.unit == "MB" else 0
        done, total = self.size / self._scale, self.total / self._scale
        return (f"[{'#' * filled}{'.' * (20 - filled)}] shards {self.done}/{self.shards} | "
                f"{done:,.{digits}f} of {total:,.{digits}f} {self.unit} | "
                f"{self.rows / elapsed:,.0f} examples/s, {rate / self._scale:,.2f} {self.unit}/s"
                f" | {self.workers} worker{'s' * (self.workers > 1)} | ETA {eta}")
