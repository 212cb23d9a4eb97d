"""Goodput: where a run's wall time went, across its restarts.

Every second from a process's start to its end is either productive (the train loop stepping)
or lost, by bucket, in the spirit of MaxText's ml-goodput-measurement:

  startup     process start to the loop's first step: imports, joining the other processes,
              building the task and its data, initialising the state (restore and compile not
              included)
  restore     reading the checkpoint a restarted run resumes from (or init_from's weights)
  compile     the first train step's call: tracing and compiling it (the calls after return
              as soon as the step is dispatched)
  data_wait   waiting for the next batch (the iterator and its transfer to the devices)
  eval        evaluations, their compiles included, and the samples printed at the end
  checkpoint  the loop blocked in a save (the async part of a save overlaps the steps), and
              the final wait for it
  wasted      steps a killed run had done after its last checkpoint: done again after the
              restart (the killed run's productive time past the restored step)
  recovery    from the killed run's last record to the restarted process's start (the rest of
              the killed run, and the time until it was started again)

goodput = productive / total. Process 0 keeps the running account in <workdir>/goodput.json,
written at every log line, so a killed run leaves its last one; the next run reads it, adds
its own, and ends with the whole run's account there (`account()`: wall_s, productive_s,
goodput, lost_s by bucket, runs), in TensorBoard ('goodput/...') and in one line:
`goodput 93.1% of 412 s: compile 2.0%, data_wait 1.4%, ...`, and summary.json's "goodput"
entry beside the final eval (whose entries stay equal bit for bit across a resume). The cost
per step is four clock reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

import jax

from zoo import paths

BUCKETS = ("startup", "restore", "compile", "data_wait", "eval", "checkpoint", "wasted",
           "recovery")
FILE = "goodput.json"


def process_start_time() -> float:
    """This process's start on the wall clock, to 10 ms on Linux (its start in clock ticks
    since boot, /proc/self/stat, against CLOCK_BOOTTIME), else now."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - max(0.0, age)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


class Goodput:
    """The account of one process's run, added to the earlier runs' (goodput.json)."""

    def __init__(self, workdir: str):
        self.path = paths.join(workdir, FILE)
        self.writes = jax.process_index() == 0
        self.started = process_start_time()
        self.lost = dict.fromkeys(BUCKETS, 0.0)
        self.earlier = {"wall_s": 0.0, "lost": dict.fromkeys(BUCKETS, 0.0), "runs": 0,
                        "productive_at": {}}
        if paths.as_path(self.path).exists():
            try:
                found = json.loads(paths.read_bytes(self.path))
                found["lost"] = found["lost_s"]
                self.earlier.update({k: found[k] for k in self.earlier})
                self.earlier["last_wall"] = float(found["last_wall"])
            except (ValueError, KeyError, TypeError):
                pass  # an account cut short: start a new one (the run itself is unaffected)
        self.productive_at = dict(self.earlier["productive_at"])

    @contextlib.contextmanager
    def timed(self, bucket: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.lost[bucket] += time.perf_counter() - start

    def resumed(self, step: int) -> None:
        """The run restored `step`: what an earlier run did after it is wasted, and the time
        from that run's last record to this process's start is recovery."""
        if "last_wall" not in self.earlier:
            return
        self.lost["recovery"] += max(0.0, self.started - self.earlier["last_wall"])
        productive_then = self.earlier["wall_s"] - sum(self.earlier["lost"].values())
        at_step = self.productive_at.get(str(step), productive_then)
        self.lost["wasted"] += max(0.0, productive_then - at_step)
        self.productive_at = {s: v for s, v in self.productive_at.items() if int(s) <= step}

    def loop_started(self) -> None:
        """The train loop is about to take its first step: the time before it that no other
        bucket holds is startup."""
        self.lost["startup"] += max(0.0, time.time() - self.started - self.lost["restore"])

    def account(self) -> dict:
        """The whole run so far: wall_s, productive_s, goodput, lost_s by bucket."""
        now = time.time()
        earlier_lost = self.earlier["lost"]
        lost = {b: earlier_lost.get(b, 0.0) + self.lost[b] for b in BUCKETS}
        # wasted and recovery are moved out of the earlier runs' productive time / added to it.
        wall = self.earlier["wall_s"] + (now - self.started) + self.lost["recovery"]
        productive = max(0.0, wall - sum(lost.values()))
        return {"wall_s": wall, "productive_s": productive,
                "goodput": productive / wall if wall > 0 else 0.0, "lost_s": lost,
                "runs": self.earlier["runs"] + 1}

    def checkpointed(self, step: int) -> None:
        """Checkpoint `step` was saved: the productive time up to it is kept, so a restart
        from it knows what was done after it."""
        self.productive_at[str(step)] = self.account()["productive_s"]

    def write(self, step: int, account: dict | None = None) -> None:
        """goodput.json, the running account (process 0): `account`, or the account now."""
        if not self.writes:
            return
        account = account or self.account()
        paths.write_atomic(self.path, json.dumps({
            **account, "productive_at": self.productive_at, "last_wall": time.time(),
            "last_step": step}, indent=1))

    @staticmethod
    def line(account: dict) -> str:
        """`goodput 93.1%: compile 2.0%, data_wait 1.4%, ...` (buckets of 0.1% and more)."""
        wall = max(account["wall_s"], 1e-9)
        parts = [f"{b} {100 * s / wall:.1f}%" for b, s in sorted(
            account["lost_s"].items(), key=lambda kv: -kv[1]) if s / wall >= 0.001]
        return (f"goodput {100 * account['goodput']:.1f}% of {account['wall_s']:.0f} s"
                + (": " + ", ".join(parts) if parts else ""))
