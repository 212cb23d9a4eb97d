"""Preparation at scale: what a waiting host costs the bucket per poll."""

import threading
import time

from zoo import paths
from zoo.data.pipelines import pretraining as pt
from zoo.data.pipelines import pretraining_store as store


def test_a_waiting_host_lists_the_markers_once_per_poll_and_reads_none(gcs_knobs, gcs_bucket):
    directory = paths.as_path(f"{gcs_bucket}/prepared/train")
    for shard in range(3):
        store.write_json(directory / store.marker_file(shard), {"rows": 1, "is_next": 0})
        paths.write_atomic(directory / store.shard_file("input_ids", shard), b"rows")
    lines = []
    mark = gcs_knobs.mark()
    thread = threading.Thread(target=pt._wait_for_shards,
                              args=(directory, 4, lines.append, 0.05), daemon=True)
    thread.start()
    deadline = time.time() + 10
    while len(lines) < 3 and time.time() < deadline:
        time.sleep(0.01)
    store.write_json(directory / store.marker_file(3), {"rows": 1, "is_next": 0})
    thread.join(10)
    assert not thread.is_alive(), "the wait did not end when the last marker came"
    polls = [r for r in gcs_knobs.requests(mark) if r["op"] != "write"]
    # each report line is a poll that found a shard missing; the last poll found none missing
    assert [(r["op"], r["prefix"]) for r in polls] == [
        ("list", "prepared/train/shard-")] * (len(lines) + 1)
    assert "waiting for 1 of 4 shards from other processes (e.g. 3)" in lines[0]


def test_markers_are_listed_in_pages_of_names(gcs_knobs, gcs_bucket):
    directory = paths.as_path(f"{gcs_bucket}/prepared/train")
    for shard in (0, 2, 5, 7, 8):
        store.write_json(directory / store.marker_file(shard), {"rows": shard, "is_next": 0})
    mark = gcs_knobs.mark()
    names = paths.list_names(directory, "shard-", page_size=2)
    assert names == [store.marker_file(i) for i in (0, 2, 5, 7, 8)]
    assert len(gcs_knobs.requests(mark)) == 3
    assert store.done_shards(directory) == {0, 2, 5, 7, 8}
    assert store.read_markers(directory, [2, 7]) == {2: {"rows": 2, "is_next": 0},
                                                      7: {"rows": 7, "is_next": 0}}
    assert store.done_shards(paths.as_path(f"{gcs_bucket}/nothing/here")) == set()
