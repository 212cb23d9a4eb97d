"""Where a path the user names (workdir, cache_dir, data_dir, a tokenizer, init_from) becomes an
`etils.epath.Path`, local or `gs://bucket/...`, and the few writes that differ between the two.

Everything below zoo reads and writes such paths through the `epath.Path` this returns:
epath sends `gs://` to gcsfs (TensorFlow is not installed), orbax writes arrays to it through
tensorstore's own GCS driver, and local paths keep `os.path.expanduser` semantics as before.

What differs on GCS, and is handled here:
- No atomic rename: `rename` is a copy then a delete (and gcsfs's moveTo request can cost
  retries on servers without it). But one object upload is atomic: readers see the old object
  or the whole new one. So `write_atomic` uploads the final name directly there, and keeps
  temp-file + `os.replace` locally.
- No append: see zoo.train.metrics for how metrics.jsonl is written.
- Listings are cached by gcsfs per process; another process (a second host, a resumed run)
  writes the same directories, so the cache is turned off: a stale listing would hide a
  checkpoint another host just committed.
- A wrong bucket, no server or no credentials would otherwise surface deep inside a library,
  after minutes of retries; `check_remote` probes once, quickly, and names the config key.
- Requests fail now and then (a 503, a dropped connection): `write_atomic`, `read_bytes` and
  `local_copy` go through zoo.retry on GCS, on top of gcsfs's own per-request retries.
"""

import contextlib
import logging
import os
import shutil
import socket
import tempfile
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import fsspec
from etils import epath

from zoo import errors, retry
from zoo.retry import retrying

# gcsfs registers as both "gs" and "gcs"; fsspec applies conf[protocol] to new instances.
for _protocol in ("gs", "gcs"):
    fsspec.config.conf.setdefault(_protocol, {}).setdefault("use_listings_cache", False)

PathLike = str | os.PathLike
# Seconds a GCS request may wait to connect, and then for each next part of the answer, before
# it fails (and gcsfs, then zoo.retry, try again). gcsfs's default is no timeout at all:
# against an endpoint that takes the connection and never answers, a read waited forever.
# A job sets it with config.train.storage.request_timeout_s (`configure`); the environment
# variable is for commands without a job config (prepare, corpus) and the processes they start.
REQUEST_TIMEOUT_ENV, DEFAULT_REQUEST_TIMEOUT_S = "ZOO_GCS_REQUEST_TIMEOUT_S", 20.0
_request_timeout_set = False
_configured_timeout_s: float | None = None  # config.train.storage.request_timeout_s
# Tensorstore's (orbax's array reads and writes) retries of one request: gcsfs's 6 tries, with
# waits of 1, 2, 4, 8, 8 s. Its own default is 32 retries with waits growing to 32 s: a silent
# bucket held a checkpoint restore ~18 minutes per zoo attempt (measured on the test server).
TENSORSTORE_RETRIES = {"max_retries": 5, "initial_delay": "1s", "max_delay": "8s"}
_TENSORSTORE_SET_BY_ZOO = "ZOO_TENSORSTORE_SET"


def is_remote(path: PathLike) -> bool:
    """True for a URL with a scheme (gs://...), False for a local path."""
    remote = "://" in os.fspath(path)
    if remote and not _request_timeout_set:
        _set_request_timeout()
    return remote


def configure(storage: Mapping[str, Any] | None) -> None:
    """A job's bounds on storage (config.train.storage), before its first gs:// request:
    request_timeout_s (each GCS request's connect and read timeout: gcsfs's and tensorstore's)
    and operation_budget_s (zoo.retry starts no attempt of one read, write or listing that
    would end past it). None or a missing key: the defaults ($ZOO_GCS_REQUEST_TIMEOUT_S, else
    20 s; 3 minutes). A value that is not a positive number is a ConfigError naming the key."""
    global _configured_timeout_s
    storage = dict(storage.items()) if storage is not None else {}
    unknown = sorted(set(storage) - {"request_timeout_s", "operation_budget_s"})
    if unknown:
        raise errors.ConfigError(f"config.train.storage.{unknown[0]}: unknown key; the keys "
                                 "are request_timeout_s and operation_budget_s")
    for key, value in storage.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise errors.ConfigError(f"config.train.storage.{key}={value!r} must be a number of "
                                     "seconds > 0")
    timeout = storage.get("request_timeout_s")
    timeout = None if timeout is None else float(timeout)  # None: $ZOO_GCS_..., else 20 s
    retry.configure(budget_s=float(storage.get("operation_budget_s",
                                               retry.Policy.budget_s)))
    changed = timeout != _configured_timeout_s
    _configured_timeout_s = timeout
    if changed and _request_timeout_set:  # a gs:// path was seen already: clients made anew
        _set_request_timeout()
        import gcsfs

        gcsfs.GCSFileSystem.clear_instance_cache()


def request_timeout_s() -> float:
    """config.train.storage.request_timeout_s (`configure`), else $ZOO_GCS_REQUEST_TIMEOUT_S,
    else DEFAULT_REQUEST_TIMEOUT_S."""
    if _configured_timeout_s is not None:
        return _configured_timeout_s
    value = os.environ.get(REQUEST_TIMEOUT_ENV, "")
    try:
        seconds = float(value) if value else DEFAULT_REQUEST_TIMEOUT_S
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise errors.ConfigError(f"{REQUEST_TIMEOUT_ENV}={value!r} must be a number of seconds "
                                 f"> 0 (default {DEFAULT_REQUEST_TIMEOUT_S:g})")
    return seconds


def _set_request_timeout() -> None:
    """The request timeout for every gs:// client made from now on, set at the first gs://
    path (so a local run never imports aiohttp):
    - gcsfs's requests_timeout: aiohttp's connect and read timeouts (not a total, which would
      cut a long download short);
    - tensorstore's curl transport (read from the environment when it is first made): the
      connect timeout, and a transfer below 1 byte/s for that long is abandoned; its retries
      bounded (TENSORSTORE_RETRIES) in the context orbax gives every array read and write.
    An environment variable the user set is left as it is."""
    global _request_timeout_set
    import aiohttp
    from orbax.checkpoint._src.serialization import tensorstore_utils

    seconds = request_timeout_s()
    timeout = aiohttp.ClientTimeout(sock_connect=seconds, sock_read=seconds)
    for protocol in ("gs", "gcs"):
        fsspec.config.conf[protocol]["requests_timeout"] = timeout
    whole = str(max(1, round(seconds)))
    # A process zoo starts inherits what zoo set here; its own timeout must win over that,
    # but not over a value the user set: the names zoo set are listed beside them.
    ours = set(filter(None, os.environ.get(_TENSORSTORE_SET_BY_ZOO, "").split(",")))
    for name, value in (("TENSORSTORE_CURL_CONNECT_TIMEOUT_SECONDS", whole),
                        ("TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS", whole),
                        ("TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES", "1")):
        if name not in os.environ or name in ours:
            os.environ[name] = value
            ours.add(name)
    os.environ[_TENSORSTORE_SET_BY_ZOO] = ",".join(sorted(ours))
    # orbax copies these dicts into a new tensorstore context for each read and write.
    for context in (tensorstore_utils._BASE_TS_CONTEXT,
                    tensorstore_utils._DEFAULT_OCDBT_TS_CONTEXT):
        context.setdefault("gcs_request_retries", dict(TENSORSTORE_RETRIES))
    if not errors.debugging():
        # gcsfs (its last try) and fsspec's read-ahead log a failed request at ERROR with a
        # traceback; zoo.retry then tries again or gives up with one line naming the object,
        # which is what the user sees.
        for name in ("gcsfs", "fsspec.prefetcher"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    _request_timeout_set = True


def as_path(path: PathLike) -> epath.Path:
    """The one way a user's path becomes a Path: gs://... as given, a local path with ~ expanded
    and made absolute (orbax and error messages want absolute local paths)."""
    text = os.fspath(path)
    if is_remote(text):
        return epath.Path(text)
    return epath.Path(os.path.abspath(os.path.expanduser(text)))


def join(path: PathLike, *parts: str) -> str:
    """`os.path.join` for a path that may be gs://...: a string, for config values and
    messages."""
    return os.fspath(as_path(path).joinpath(*parts)) if parts else os.fspath(as_path(path))


def write_atomic(path: PathLike, data: bytes | str) -> None:
    """Writes `data` to `path` so a reader (or a process killed mid-write) sees either nothing,
    the old content, or all of the new, never a part. Creates the parent directory."""
    path = as_path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    if is_remote(path):
        # One object upload: it appears whole or not at all, so a retry cannot leave a part.
        # gcsfs's pipe_file sends up to 50 MB as one request (epath's write_bytes opens a
        # resumable upload: two requests, each a round trip, for every marker).
        retrying(lambda: fsspec.filesystem("gs").pipe_file(os.fspath(path), raw),
                 what=f"writing {path}")
        return
    fd, tmp = tempfile.mkstemp(dir=os.fspath(path.parent), prefix=path.name + ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.chmod(tmp, 0o644)  # mkstemp makes the file owner-only; results are for sharing
        os.replace(tmp, os.fspath(path))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_once(path: str, write: Callable[[str], None]) -> str:
    """Returns `path`, first calling write(tmp) and renaming tmp to it if it does not exist yet:
    a prepared data file (e.g. a synthetic split) is made once per cache, and an interrupted
    write leaves no partial file that a later run would trust. `tmp` keeps the extension, for
    writers that choose the format by it. In a bucket, `write` still gets a local file, and
    the finished file is uploaded as one object (which appears whole or not at all)."""
    if is_remote(path):
        if not as_path(path).exists():
            with tempfile.TemporaryDirectory(prefix="zoo-") as tmp:
                local = os.path.join(tmp, as_path(path).name)
                write(local)
                with open(local, "rb") as f:
                    write_atomic(path, f.read())
        return path
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        root, ext = os.path.splitext(path)
        tmp = f"{root}.tmp-{os.getpid()}{ext}"
        write(tmp)
        os.replace(tmp, path)
    return path


def read_bytes(path: PathLike) -> bytes:
    """`path`'s bytes; from GCS through zoo.retry (a marker, a manifest, a plan)."""
    path = as_path(path)
    if not is_remote(path):
        return path.read_bytes()
    # One request (epath's read_bytes asks for the object's metadata first: two round trips).
    return retrying(lambda: fsspec.filesystem("gs").cat_file(os.fspath(path)),
                    what=f"reading {path}")


def open_read(path: PathLike):
    """`path` opened for reading bytes: a local file as it is; a gs:// one as a RetryingReader,
    so a corpus streamed from a bucket rides out a passing failure and gives up on a silent
    bucket with one error naming the file (zoo.retry), never a raw fsspec timeout."""
    if not is_remote(path):
        return open(as_path(path), "rb")
    return RetryingReader(os.fspath(as_path(path)))


class RetryingReader:
    """A gs:// object read sequentially (read, readline, iteration, seek, tell) in chunks of
    CHUNK bytes, split into lines here: fsspec's own readline fetches a whole block from its
    cache per line (a 1 MB corpus took 7 s to iterate from the test server). Each chunk that
    fails with a passing error is tried again (zoo.retry) on the object opened anew at the
    same offset, so a failure mid-line loses nothing and repeats nothing."""

    CHUNK = 1 << 20

    def __init__(self, path: str):
        self.path, self._file = path, None
        self._pos = 0  # the reader's offset: of _buffer[_at]
        self._buffer, self._at = b"", 0  # bytes read ahead, from _pos - _at on

    def _read_raw(self, size: int) -> bytes:
        """`size` bytes (-1: all) of the object after the ones buffered."""
        offset = self._pos + len(self._buffer) - self._at

        def attempt() -> bytes:
            if self._file is None:
                self._file = fsspec.filesystem("gs").open(self.path, "rb")
            try:
                self._file.seek(offset)
                return self._file.read(size)
            except Exception:
                self._drop()  # the next attempt opens it again
                raise

        return retrying(attempt, what=f"reading {self.path}")

    def _take(self, end: int) -> bytes:
        data = self._buffer[self._at:end]
        self._at, self._pos = end, self._pos + len(data)
        return data

    def _more(self, size: int) -> bool:
        chunk = self._read_raw(size)
        self._buffer, self._at = self._buffer[self._at:] + chunk, 0
        return bool(chunk)

    def read(self, size: int = -1) -> bytes:
        if size < 0:
            self._more(-1)
            return self._take(len(self._buffer))
        while len(self._buffer) - self._at < size and self._more(
                max(self.CHUNK, size - len(self._buffer) + self._at)):
            pass
        return self._take(min(len(self._buffer), self._at + size))

    def readline(self) -> bytes:
        searched = self._at
        while (newline := self._buffer.find(b"\n", searched)) < 0:
            searched = len(self._buffer) - self._at  # offset into the buffer _more makes
            if not self._more(self.CHUNK):
                return self._take(len(self._buffer))
        return self._take(newline + 1)

    def seek(self, pos: int) -> int:
        self._pos, self._buffer, self._at = pos, b"", 0
        return pos

    def tell(self) -> int:
        return self._pos

    def __iter__(self):
        return self

    def __next__(self) -> bytes:
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def _drop(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            with contextlib.suppress(Exception):
                file.close()

    def close(self) -> None:
        self._drop()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def list_names(directory: PathLike, prefix: str = "", page_size: int = 1000) -> list[str]:
    """The names of the files directly in `directory` that start with `prefix` (none when it
    does not exist). On GCS: one listing request per `page_size` names (GCS's largest page is
    1,000), each asking for the names alone, and nothing else: a glob through gcsfs lists
    every object of the directory with its metadata, then asks again when none matched."""
    directory = as_path(directory)
    if not is_remote(directory):
        try:
            return sorted(n for n in os.listdir(directory) if n.startswith(prefix))
        except FileNotFoundError:
            return []
    bucket = bucket_of(directory)
    key = os.fspath(directory).split("://", 1)[1][len(bucket):].strip("/")
    key = f"{key}/" if key else ""
    fs = fsspec.filesystem("gs")

    def page(token):
        return fs.call("GET", "b/{}/o", bucket, prefix=key + prefix, delimiter="/",
                       maxResults=page_size, pageToken=token,
                       fields="items(name),nextPageToken", json_out=True)

    names, token = [], None
    while True:
        answer = retrying(lambda: page(token), what=f"listing {directory}/{prefix}*")
        names += [item["name"][len(key):] for item in answer.get("items", [])]
        token = answer.get("nextPageToken")
        if not token:
            return sorted(names)


@contextlib.contextmanager
def local_copy(path: PathLike) -> Iterator[str]:
    """A local filename holding `path`'s bytes, for libraries that only open local files
    (sentencepiece): the file itself when local, a temporary copy of the object otherwise."""
    path = as_path(path)
    if not is_remote(path):
        yield os.fspath(path)
        return
    with tempfile.TemporaryDirectory(prefix="zoo-") as tmp:
        local = os.path.join(tmp, path.name)
        download(path, local)
        yield local


@contextlib.contextmanager
def local_tree(path: PathLike, names: Iterable[str] | None = None) -> Iterator[str]:
    """A local directory holding `path`'s files: the directory itself when local, else a
    temporary download (for readers built on local files: a Hugging Face or google-research
    checkpoint read by zoo.convert.hf) of `names` (files under `path`), or of every object under it
    when None. Each file is streamed through a RetryingReader, so a passing failure costs a
    chunk, not the file, and a silent bucket ends in one error naming the object."""
    if not is_remote(path):
        yield os.fspath(as_path(path))
        return
    with tempfile.TemporaryDirectory(prefix="zoo-") as tmp:
        local = os.path.join(tmp, as_path(path).name)
        os.makedirs(local)
        if names is None:
            root = os.fspath(path).split("://", 1)[1].rstrip("/")
            names = [name[len(root):].lstrip("/") for name in fsspec.filesystem("gs").find(root)]
        for name in names:
            download(join(path, name), os.path.join(local, name))
        yield local


def download(path: PathLike, local: str) -> None:
    """Copies the file `path` (local or gs://) to the local file `local`, making its folder."""
    os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
    with open_read(path) as src, open(local, "wb") as dst:
        shutil.copyfileobj(src, dst, RetryingReader.CHUNK)


def move_tree(src: PathLike, dst: PathLike) -> None:
    """Moves the directory `src` to `dst` (which must not exist; both local or both in GCS):
    one atomic rename locally; on
    GCS, which has no directories and no rename, each object is copied, then `src` deleted (a
    process killed between the two leaves both, never neither)."""
    src, dst = as_path(src), as_path(dst)
    if not is_remote(src):
        os.replace(os.fspath(src), os.fspath(dst))
        return
    # fsspec's find lists every object below a prefix in one request (epath's walk and rglob
    # give paths without their gs:// or refuse `**`); its names carry no scheme.
    root = os.fspath(src).split("://", 1)[1].rstrip("/")
    for name in fsspec.filesystem("gs").find(root):
        target = dst / name[len(root):].lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(as_path("gs://" + name).read_bytes())
    src.rmtree()


def bucket_of(path: PathLike) -> str:
    """The bucket of a gs:// path ('gs://b/x/y' -> 'b')."""
    return os.fspath(path).split("://", 1)[1].split("/", 1)[0]


def check_remote(path: PathLike, key: str) -> None:
    """For a gs:// path: a UserError at once, naming `key`, when its bucket cannot be reached
    (no such bucket, no server, no credentials). Local paths are left to their own checks.

    gcsfs retries a refused connection for over a minute (6 tries, backoff fixed when the class
    is defined); a plain TCP connection to the endpoint first makes a wrong
    STORAGE_EMULATOR_HOST or an offline machine fail in seconds."""
    text = os.fspath(path)
    if not is_remote(text):
        return
    if not text.startswith("gs://"):
        raise errors.ConfigError(
            f"{key}={text}: only local paths and gs://bucket/... are supported")
    bucket = bucket_of(text)
    endpoint = os.environ.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com"
    _check_connects(endpoint, f"{key}={text}")
    try:
        found = epath.Path(f"gs://{bucket}").exists()
    except Exception as e:  # noqa: BLE001 - google-auth and HTTP errors all mean "no access"
        reason = " ".join(errors.message(e).split())[:300]
        raise errors.UserError(
            f"{key}={text}: cannot use bucket {bucket} at {endpoint} ({type(e).__name__}: "
            f"{reason}); check your credentials (`gcloud auth application-default login` or "
            f"GOOGLE_APPLICATION_CREDENTIALS) and that they may read and write the bucket") from e
    if not found:
        raise errors.MissingFileError(
            f"{key}={text}: bucket {bucket} does not exist at {endpoint} (or these credentials "
            f"cannot see it); create it (`gcloud storage buckets create gs://{bucket}`) or fix "
            f"the name")


def _check_connects(endpoint: str, where: str, timeout_s: float = 10.0) -> None:
    url = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout_s).close()
    except OSError as e:
        hint = ("is the emulator running? (STORAGE_EMULATOR_HOST is set)"
                if os.environ.get("STORAGE_EMULATOR_HOST") else "is this machine online?")
        raise errors.UserError(
            f"{where}: cannot connect to {url.hostname}:{port} for Google Cloud Storage "
            f"({e.strerror or e}); {hint}") from e
