"""The test bucket's knobs (tests/gcs_server.py, tests/gcs_behaviour.py): latency, the request
log, injected faults and GCS's listing pages, each checked with plain HTTP requests (gcsfs
would retry the faults away, slowly)."""

import http.client
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest


def _upload(gcs, bucket: str, name: str, data: bytes) -> None:
    query = urllib.parse.urlencode({"uploadType": "media", "name": name})
    request = urllib.request.Request(
        f"{gcs.endpoint}/upload/storage/v1/b/{bucket}/o?{query}", data=data, method="POST",
        headers={"Content-Type": "application/octet-stream"})
    urllib.request.urlopen(request, timeout=10).close()


def _get(gcs, bucket: str, name: str, headers=None) -> tuple[int, bytes]:
    url = (f"{gcs.endpoint}/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}"
           "?alt=media")
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                    timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture
def bucket(gcs_knobs):
    name = gcs_knobs.bucket()
    _upload(gcs_knobs, name, "dir/a.json", b"0123456789" * 10)
    _upload(gcs_knobs, name, "dir/b.json", b"b")
    return name


def test_the_log_records_every_request_with_its_object_range_status_and_bytes(gcs_knobs,
                                                                              bucket):
    mark = gcs_knobs.mark()
    assert _get(gcs_knobs, bucket, "dir/a.json", {"Range": "bytes=10-29"}) == (
        206, b"0123456789" * 2)
    _upload(gcs_knobs, bucket, "dir/c.json", b"new")
    read, write = gcs_knobs.requests(since=mark)
    assert read["method"] == "GET" and read["op"] == "read" and read["bucket"] == bucket
    assert read["object"] == "dir/a.json" and read["range"] == "bytes=10-29"
    assert read["status"] == 206 and read["bytes"] == 20 and read["fault"] is None
    assert write["method"] == "POST" and write["op"] == "write"
    assert write["object"] == "dir/c.json" and write["status"] == 200


def test_latency_delays_each_request_but_concurrent_requests_overlap(gcs_knobs, bucket):
    gcs_knobs.latency(0.3)
    start = time.perf_counter()
    _get(gcs_knobs, bucket, "dir/b.json")
    assert time.perf_counter() - start >= 0.3
    start = time.perf_counter()
    threads = [threading.Thread(target=_get, args=(gcs_knobs, bucket, "dir/b.json"))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.perf_counter() - start < 4 * 0.3  # served side by side, not one after another
    gcs_knobs.latency(0)
    start = time.perf_counter()
    _get(gcs_knobs, bucket, "dir/b.json")
    assert time.perf_counter() - start < 0.3


def test_503s_go_to_the_next_matching_requests_only(gcs_knobs, bucket):
    gcs_knobs.fail(503, count=2, object="dir/a.*", method="GET")
    assert _get(gcs_knobs, bucket, "dir/b.json")[0] == 200  # another object
    _upload(gcs_knobs, bucket, "dir/a.json", b"again")  # another method
    first, second, third = (_get(gcs_knobs, bucket, "dir/a.json") for _ in range(3))
    assert first[0] == second[0] == 503 and json.loads(first[1])["error"]["code"] == 503
    assert third == (200, b"again")
    assert gcs_knobs.state()["faults"][0]["count"] == 0
    assert [r["fault"] for r in gcs_knobs.requests()[-3:]] == [503, 503, None]


def test_a_reset_connection_gives_no_answer_at_all(gcs_knobs, bucket):
    gcs_knobs.fail("reset", object="dir/b.json")
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        _get(gcs_knobs, bucket, "dir/b.json")
    assert _get(gcs_knobs, bucket, "dir/b.json") == (200, b"b")


def test_a_dropped_connection_ends_mid_body_and_truncation_passes_silently(gcs_knobs, bucket):
    gcs_knobs.fail("drop", op="read")
    with pytest.raises(http.client.IncompleteRead) as caught:
        _get(gcs_knobs, bucket, "dir/a.json")
    assert len(caught.value.partial) == 50
    gcs_knobs.fail("truncate", op="read")
    assert _get(gcs_knobs, bucket, "dir/a.json") == (200, b"0123456789" * 5)
    assert _get(gcs_knobs, bucket, "dir/a.json") == (200, b"0123456789" * 10)


def test_listings_come_in_pages_as_gcs_sends_them(gcs_knobs, bucket):
    for name in ("dir/c.json", "dir/d.json", "dir/e.json"):
        _upload(gcs_knobs, bucket, name, b"x")
    names, token, pages = [], None, 0
    while True:
        query = {"prefix": "dir/", "maxResults": 2, **({"pageToken": token} if token else {})}
        with urllib.request.urlopen(f"{gcs_knobs.endpoint}/storage/v1/b/{bucket}/o?"
                                    + urllib.parse.urlencode(query), timeout=10) as answer:
            page = json.loads(answer.read())
        names += [item["name"] for item in page["items"]]
        pages += 1
        token = page.get("nextPageToken")
        if not token:
            break
    assert pages == 3 and names == [f"dir/{c}.json" for c in "abcde"]


@pytest.mark.parametrize("rule, field", [
    (dict(fault=999), "fault=999"), (dict(fault="hang"), "fault='hang'"),
    (dict(fault=503, count=0), "count=0"), (dict(fault=503, op="lst"), "op='lst'")])
def test_a_bad_fault_rule_is_refused_naming_the_field(gcs_knobs, rule, field):
    with pytest.raises(ValueError, match=field.replace("(", r"\(")):
        gcs_knobs.fail(**rule)
    with pytest.raises(ValueError, match="latency of 0..60 s"):
        gcs_knobs.latency(-1)
    assert gcs_knobs.state()["faults"] == []
