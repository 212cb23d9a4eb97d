"""What makes the test server (tests/gcs_server.py) behave like a bucket seen from a VM rather
than a polite local emulator. Runs inside the server's child process; the test process turns
the knobs over HTTP (`/_zoo/...`, never logged, never delayed, never failed):

- latency: every request waits this long before it is served (a VM sees ~30 ms from a
  regional bucket), so code that makes one request per marker shows up as slow, as it would.
  Requests are served by one thread each (the emulator alone serves them one at a time), and
  only the emulator's own work is serialized (its storage is not thread-safe): N concurrent
  requests cost one latency, not N.
- faults, consumed in order by the requests they match (method, op, object-name glob):
    an HTTP status (429, 500, 503, ...)  answered instead of serving the request (nothing
                                          is written or read)
    "reset"     the connection is closed before any response: the request may be lost
    "drop"      served, but the connection closes after the headers and half the body (the
                client sees fewer bytes than Content-Length promised)
    "truncate"  served with the body cut to half and a Content-Length that matches it: a
                short answer only a checksum or a parser can catch
    "silent"    the request is read and never answered: the connection stays open, nothing
                is sent (a bucket behind a black hole, an overloaded front end), for
                SILENT_S or until the client hangs up
- pagination: an object listing returns at most maxResults (<= 1,000, GCS's page) entries and a
  nextPageToken, as GCS does; the emulator returns everything in one page, which would hide
  that a listing of 5,000 markers is 5 requests.
- the request log: one JSON line per request (seq, t, method, op, bucket, object, prefix,
  range, upload type, status, bytes sent, fault), written before the response's body is sent, so a client
  that has its answer finds its request logged.
"""

import base64
import fnmatch
import io
import json
import os
import re
import socket
import threading
import time
import urllib.parse
from http import HTTPStatus

FAULTS = ("reset", "drop", "truncate", "silent")  # besides HTTP error statuses
SILENT_S = 600.0
OPS = ("list", "read", "stat", "write", "delete", "copy", "bucket", "other")
PAGE = 1000  # GCS's largest objects.list page
_ERROR_STATUSES = {s.value for s in HTTPStatus if s.value >= 400}

_NAME_IN_BODY = re.compile(rb'"name"\s*:\s*("(?:[^"\\]|\\.)*")')


class Knobs:
    """The server's state the test process turns: latency, fault rules, the log."""

    def __init__(self, log_path: str | None, latency_s: float = 0.0):
        self.lock = threading.Lock()  # the rules, the log and its sequence number
        self.storage_lock = threading.Lock()  # the emulator's handlers, one at a time
        self.latency_s = latency_s
        self.rules: list[dict] = []
        self.seq = 0
        self.uploads: dict[str, str] = {}  # resumable upload id -> object name
        self._log = open(log_path, "a", buffering=1) if log_path else None

    def take_fault(self, info: dict):
        """The fault of the first rule matching this request (consuming one of its count)."""
        with self.lock:
            for rule in self.rules:
                if rule["count"] > 0 and _matches(rule, info):
                    rule["count"] -= 1
                    return rule["fault"]
        return None

    def record(self, info: dict, status, sent: int, fault) -> None:
        with self.lock:
            self.seq += 1
            if self._log:
                self._log.write(json.dumps({
                    "seq": self.seq, "t": round(time.time(), 4), **info, "status": status,
                    "bytes": sent, "fault": fault}) + "\n")


def check_rule(rule: dict) -> dict:
    """A fault rule as the control endpoint takes it; ValueError naming the bad field."""
    fault = rule.get("fault")
    if not (fault in FAULTS or fault in _ERROR_STATUSES):
        raise ValueError(f"fault={fault!r}: give an HTTP error status (429, 503, ...) or one "
                         f"of {FAULTS}")
    count = rule.get("count", 1)
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"count={count!r}: give how many requests to fail, an int >= 1")
    op = rule.get("op")
    if op is not None and op not in OPS:
        raise ValueError(f"op={op!r}: give one of {OPS} or None for any")
    unknown = set(rule) - {"fault", "count", "object", "method", "op"}
    if unknown:
        raise ValueError(f"unknown fault rule fields {sorted(unknown)}; the fields are fault, "
                         "count, object (a glob), method, op")
    return {"fault": fault, "count": count, "object": rule.get("object"),
            "method": (rule.get("method") or "").upper() or None, "op": op}


def _matches(rule: dict, info: dict) -> bool:
    if rule["method"] and rule["method"] != info["method"]:
        return False
    if rule["op"] and rule["op"] != info["op"]:
        return False
    return not rule["object"] or fnmatch.fnmatchcase(info["object"] or "", rule["object"])


def describe(handler, method: str, knobs: Knobs) -> dict:
    """method, op, bucket, object, prefix and range of the request `handler` is serving. Reads
    an upload's body (to find the object's name) and puts it back for the emulator."""
    url = urllib.parse.urlsplit(handler.path)
    query = urllib.parse.parse_qs(url.query)
    path, upload = url.path, url.path.startswith("/upload/")
    for prefix in ("/upload", "/download", "/storage/v1"):
        path = path[len(prefix):] if path.startswith(prefix + "/") else path
    bucket = name = None
    op = "other"
    parts = path.split("/", 3)  # "/b/<bucket>/o/<object>" -> ["", "b", bucket, "o/<object>"]
    if parts[:2] == ["", "b"]:
        bucket = parts[2] if len(parts) > 2 else None
        rest = parts[3] if len(parts) > 3 else ""
        if rest == "o":
            op = "write" if upload or method == "POST" else "list"
        elif rest.startswith("o/"):
            name = urllib.parse.unquote(rest[2:])
            for verb in ("/copyTo/", "/rewriteTo/"):
                if verb in name:
                    name, op = name.split(verb)[0], "copy"
            if op != "copy":
                op = {"DELETE": "delete", "PATCH": "other", "POST": "other"}.get(
                    method, "read" if query.get("alt") == ["media"]
                    or url.path.startswith("/download/") else "stat")
        else:
            op = "bucket"
    elif path.count("/") >= 2 and method in ("GET", "PUT"):  # the XML API: /bucket/object
        bucket, _, name = path[1:].partition("/")
        op = "read" if method == "GET" else "write"
    if op == "write":
        name = query.get("name", [None])[0] or _name_in_body(handler) or knobs.uploads.get(
            query.get("upload_id", [""])[0])
    return {"method": method, "op": op, "bucket": bucket, "object": name,
            "prefix": query.get("prefix", [None])[0], "range": handler.headers.get("Range"),
            "upload": query.get("uploadType", [None])[0]}


def _name_in_body(handler):
    body = _read_body(handler)
    found = _NAME_IN_BODY.search(body[:8192])
    return json.loads(found.group(1)) if found else None


def _read_body(handler) -> bytes:
    """The request body, read once and put back (as a plain Content-Length body) for the
    emulator's own reader."""
    length = handler.headers.get("Content-Length")
    if length:
        body = handler.rfile.read(int(length))
    elif (handler.headers.get("Transfer-Encoding") or "").lower() == "chunked":
        body = b""
        while size := int(handler.rfile.readline().strip() or b"0", 16):
            body += handler.rfile.read(size)
            handler.rfile.readline()
        handler.rfile.readline()
        del handler.headers["Transfer-Encoding"]
        handler.headers["Content-Length"] = str(len(body))
    else:
        return b""
    handler.rfile = io.BytesIO(body)
    return body


def paginate(request, response) -> None:
    """Cuts an object listing the emulator answered whole into GCS's pages."""
    listing = json.loads(response._content)
    entries = sorted([(item["name"], "items", item) for item in listing.get("items") or []]
                     + [(p, "prefixes", p) for p in listing.get("prefixes") or []],
                     key=lambda e: e[0])
    token = request.query.get("pageToken", [""])[0]
    after = base64.urlsafe_b64decode(token).decode() if token else None
    if after is not None:
        entries = [e for e in entries if e[0] > after]
    size = min(int(request.query.get("maxResults", [PAGE])[0]), PAGE)
    page = {"kind": "storage#objects", "items": [], "prefixes": []}
    for _, kind, entry in entries[:size]:
        page[kind].append(entry)
    if len(entries) > size:
        page["nextPageToken"] = base64.urlsafe_b64encode(entries[size - 1][0].encode()).decode()
    response.json(page)


def send(handler, response, knobs: Knobs) -> None:
    """The emulator's Response.close, with the fault applied and the request logged."""
    content = response._content
    content = content.encode("utf-8") if isinstance(content, str) else (content or b"")
    fault = getattr(handler, "zoo_fault", None)
    info = getattr(handler, "zoo_info", None)
    location = response._headers.get("Location", "")
    if info and info["object"] and "upload_id=" in location:
        upload_id = urllib.parse.parse_qs(urllib.parse.urlsplit(location).query)["upload_id"]
        knobs.uploads[upload_id[0]] = info["object"]
    declared = len(content)
    if fault in ("drop", "truncate"):
        content = content[:len(content) // 2]
        declared = len(content) if fault == "truncate" else declared
    if info:
        knobs.record(info, response.status.value, len(content), fault)
    handler.send_response(response.status.value, response.status.phrase)
    for key, value in response._headers.items():
        handler.send_header(key, value)
    handler.send_header("Content-Length", str(declared))
    handler.end_headers()
    handler.wfile.write(content)
    if fault == "drop":
        handler.wfile.flush()
        hang_up(handler)


def hang_up(handler) -> None:
    handler.close_connection = True
    try:
        handler.connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def wait_for_hang_up(handler, seconds: float) -> None:
    """Sends nothing until the client closes the connection (or `seconds` pass)."""
    handler.close_connection = True
    handler.connection.settimeout(seconds)
    try:
        while handler.connection.recv(65536):
            pass  # a client that sends more is still not answered
    except OSError:
        pass


def control(handler, method: str, knobs: Knobs) -> None:
    """The test process's endpoints: GET /_zoo/state; POST /_zoo/latency {"seconds": s};
    POST /_zoo/faults {rule}; DELETE /_zoo/faults."""
    status, answer = 200, {}
    try:
        body = json.loads(_read_body(handler) or b"{}")
        if handler.path == "/_zoo/latency" and method == "POST":
            seconds = body.get("seconds")
            if not isinstance(seconds, (int, float)) or not 0 <= seconds <= 60:
                raise ValueError(f"seconds={seconds!r}: give a latency of 0..60 s")
            knobs.latency_s = float(seconds)
        elif handler.path == "/_zoo/faults" and method == "POST":
            rule = check_rule(body)
            with knobs.lock:
                knobs.rules.append(rule)
        elif handler.path == "/_zoo/faults" and method == "DELETE":
            with knobs.lock:
                knobs.rules.clear()
        elif handler.path != "/_zoo/state":
            raise ValueError(f"no control endpoint {method} {handler.path}")
        with knobs.lock:
            answer = {"latency_s": knobs.latency_s, "faults": [dict(r) for r in knobs.rules],
                      "requests": knobs.seq}
    except ValueError as e:
        status, answer = 400, {"error": str(e)}
    raw = json.dumps(answer).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(raw)))
    handler.end_headers()
    handler.wfile.write(raw)


def install(knobs: Knobs) -> None:
    """Wraps the emulator's request handling (before its server starts)."""
    from http import server as http_server

    from gcp_storage_emulator.handlers import objects

    ls = objects.ls

    def ls_in_pages(request, response, storage, *args, **kwargs):
        ls(request, response, storage, *args, **kwargs)
        if response.status.value == 200:
            paginate(request, response)

    # Before the server module is imported: its routing table holds the function itself.
    objects.ls = ls_in_pages
    from gcp_storage_emulator import server

    def handle(self, method):
        if self.path.startswith("/_zoo/"):
            return control(self, method, knobs)
        self.zoo_info = info = describe(self, method, knobs)
        if knobs.latency_s:
            time.sleep(knobs.latency_s)
        self.zoo_fault = fault = knobs.take_fault(info)
        if fault == "reset":
            knobs.record(info, None, 0, fault)
            return hang_up(self)
        if fault == "silent":
            knobs.record(info, None, 0, fault)
            return wait_for_hang_up(self, SILENT_S)
        if isinstance(fault, int):
            response = server.Response(self)
            response.status = HTTPStatus(fault)
            response.json({"error": {"code": fault, "message": f"injected {fault}",
                                     "errors": [{"reason": "backendError"}]}})
            return response.close()
        with knobs.storage_lock:
            server.Router(self).handle(method)

    for method in ("GET", "POST", "PUT", "DELETE", "PATCH"):
        setattr(server.RequestHandler, f"do_{method}",
                lambda self, m=method: handle(self, m))
    server.Response.close = lambda response: send(response._handler, response, knobs)

    class Server(http_server.ThreadingHTTPServer):
        # socketserver listens with a backlog of 5: a client opening 16 connections at once
        # (gcsfs's cat_ranges for one batch's runs) had the rest of its SYNs dropped and
        # retransmitted after 1 s, so 16 concurrent 5 KB GETs took ~1 s with no latency set.
        request_queue_size = 1024

    def run(self):  # APIThread.run with a thread per request (see the module docstring)
        self._httpd = Server(
            (self._host, self._port),
            lambda *a, **k: server.RequestHandler(self._storage, *a, **k))
        self._httpd.daemon_threads = True
        self.is_running.set()
        self._httpd.serve_forever()

    server.APIThread.run = run


def from_environment() -> Knobs:
    return Knobs(os.environ.get("ZOO_GCS_REQUEST_LOG"),
                 float(os.environ.get("ZOO_GCS_LATENCY_S", "0")))
