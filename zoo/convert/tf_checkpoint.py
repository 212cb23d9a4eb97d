"""TensorFlow checkpoints (TensorBundle V2) read without TensorFlow: numpy and the stdlib only.

What `tf.compat.v1.train.Saver` (and google-research/bert) writes under a prefix such as
`bert_model.ckpt`:

* `<prefix>.index`: a LevelDB-format SSTable. Its 48-byte footer holds the block handles of the
  metaindex and index blocks and the magic 0xdb4775248b80fb57; the index block maps separator
  keys to data blocks; every block ends in a 5-byte trailer (compression byte + masked crc32c of
  the block and that byte) and stores its entries with prefix-compressed keys followed by a
  restart array. Keys are tensor names: the key "" holds a BundleHeaderProto (num_shards,
  endianness, version), every other key a BundleEntryProto (dtype, shape, shard_id, offset,
  size, crc32c, slices), both decoded here straight from the protobuf wire format.
* `<prefix>.data-SSSSS-of-NNNNN`: the raw tensor bytes of shard S (C order), at the entry's
  offset and size.

Every block and every tensor is checked against its masked crc32c (computed with numpy over
many lanes side by side: a BERT-base checkpoint verifies in about a second). Tensors are read
into memory whole; `names=` reads a part (say, without the optimizer slots).

Not read: snappy-compressed tables (TensorBundle never compresses; such a file is no
checkpoint of this kind), partitioned variables (entries with slices), resource / variant
tensors, and the older V1 format (a single `model.ckpt` file without `.index`).

Example:
  variables = read_tf_checkpoint("uncased_L-12_H-768_A-12/bert_model.ckpt")
  params = zoo.convert.bert.params_from_tf_variables(variables, config)
"""

import dataclasses
import os
import struct
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from zoo.convert.crc32c import crc32c, unmask
from zoo.errors import DataError, MissingFileError

_MAGIC = 0xDB4775248B80FB57
_FOOTER_SIZE = 48  # two BlockHandles padded to 2 x 20 bytes, then the 8-byte magic
_TRAILER_SIZE = 5  # compression type byte + masked crc32c
_HEADER_KEY = b""
_TENSOR_BUNDLE_VERSION = 1  # what TensorFlow writes (and this reader understands)

# TensorFlow's DataType enum (types.proto) -> numpy dtype; bfloat16 comes from ml_dtypes.
_DTYPES = {
    1: np.float32, 2: np.float64, 3: np.int32, 4: np.uint8, 5: np.int16, 6: np.int8,
    7: object,  # DT_STRING: bytes objects
    8: np.complex64, 9: np.int64, 10: np.bool_, 14: "bfloat16", 17: np.uint16,
    18: np.complex128, 19: np.float16, 22: np.uint32, 23: np.uint64,
}
_DTYPE_NAMES = {11: "qint8", 12: "quint8", 13: "qint32", 15: "qint16", 16: "quint16",
                20: "resource", 21: "variant"}
_DT_STRING = 7


@dataclasses.dataclass(frozen=True)
class _Entry:
    """A BundleEntryProto: where one tensor's bytes lie and what they are."""

    name: str
    dtype: int
    shape: tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: int | None
    sliced: bool


class _Bundle:
    """A parsed .index: the header fields and every tensor's entry, in key order."""

    def __init__(self, index_path: Path):
        self.index_path = index_path
        data = _read_file(index_path, "the checkpoint's index")
        records = _read_table(data, index_path)
        if not records or records[0][0] != _HEADER_KEY:
            raise DataError(
                f"{index_path} is an SSTable without a TensorBundle header (no '' key): not a "
                "TensorFlow V2 checkpoint index; give the prefix of a checkpoint written by "
                "tf.train.Saver / tf.train.Checkpoint"
            )
        self.num_shards, self.big_endian = _parse_header(records[0][1], index_path)
        self.entries: dict[str, _Entry] = {}
        for key, value in records[1:]:
            # Partitioned variables store each slice under a binary key starting with \x00; the
            # full tensor's own entry (with `slices`) is what names and rejects them.
            if key.startswith(b"\x00"):
                continue
            name = key.decode("utf-8", errors="replace")
            self.entries[name] = _parse_entry(name, value, index_path)

    def data_path(self, shard_id: int) -> Path:
        prefix = str(self.index_path)[: -len(".index")]
        return Path(f"{prefix}.data-{shard_id:05d}-of-{self.num_shards:05d}")


def list_tf_checkpoint(prefix: str | os.PathLike) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Tensor name -> (shape, numpy dtype) of a TensorFlow checkpoint, from its .index alone.

    Args:
      prefix: the checkpoint prefix (`dir/bert_model.ckpt`), its .index file, or a directory
        holding exactly one checkpoint.

    Returns:
      The tensors in the checkpoint's (sorted) key order; strings have dtype object.

    Raises:
      FileNotFoundError: no .index at `prefix`, or a directory without a checkpoint.
      ValueError: a directory with several checkpoints; the .index is truncated, corrupt or not
        a TensorBundle, or a tensor has a dtype numpy cannot hold.
    """
    bundle = _Bundle(_index_path(prefix))
    return {name: (e.shape, _numpy_dtype(e, bundle.index_path))
            for name, e in bundle.entries.items()}


def read_tf_checkpoint(prefix: str | os.PathLike, names: Iterable[str] | None = None
                       ) -> dict[str, np.ndarray]:
    """Tensor name -> numpy array of a TensorFlow checkpoint, each checked against its crc32c.

    Args:
      prefix: the checkpoint prefix (`dir/bert_model.ckpt`), its .index file, or a directory
        holding exactly one checkpoint.
      names: read only these tensors (e.g. leave out optimizer slots); None reads them all.

    Returns:
      Arrays in the checkpoint's dtypes (bfloat16 as ml_dtypes.bfloat16, strings as object
      arrays of bytes) and shapes, native byte order, in key order.

    Raises:
      FileNotFoundError: the .index or a .data shard is missing, or a directory without a
        checkpoint.
      KeyError: a name in `names` that the checkpoint does not hold.
      ValueError: a directory with several checkpoints, a truncated or corrupt file (the
        message names it), a compressed table, a partitioned (sliced) variable, or a dtype
        numpy cannot hold.
    """
    bundle = _Bundle(_index_path(prefix))
    if names is None:
        wanted = list(bundle.entries)
    else:
        wanted = list(names)
        absent = [n for n in wanted if n not in bundle.entries]
        if absent:
            raise KeyError(f"{bundle.index_path} holds no tensor named {absent[:5]}; "
                           f"list_tf_checkpoint() lists its {len(bundle.entries)} tensors")
    by_shard: dict[int, list[_Entry]] = {}
    for name in wanted:
        entry = bundle.entries[name]
        _numpy_dtype(entry, bundle.index_path)  # unsupported dtypes fail before any reading
        if entry.sliced:
            raise DataError(
                f"{bundle.index_path}: tensor {name!r} is a partitioned variable (stored as "
                "slices), which this reader does not assemble; restore it in TensorFlow and "
                "re-save it unpartitioned, or pass names= without it"
            )
        if not 0 <= entry.shard_id < bundle.num_shards:
            raise DataError(f"{bundle.index_path}: tensor {name!r} names data shard "
                            f"{entry.shard_id} of {bundle.num_shards}; the index is corrupt")
        by_shard.setdefault(entry.shard_id, []).append(entry)
    arrays: dict[str, np.ndarray] = {}
    for shard_id, entries in sorted(by_shard.items()):
        path = bundle.data_path(shard_id)
        if not path.is_file():
            raise MissingFileError(
                f"{path} does not exist: the checkpoint {bundle.index_path.name} has "
                f"{bundle.num_shards} data shard(s) ({bundle.data_path(0).name} ...); copy "
                "every .data-*-of-* file beside the .index"
            )
        with open(path, "rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            for entry in sorted(entries, key=lambda e: e.offset):  # one forward pass
                arrays[entry.name] = _read_tensor(f, file_size, path, entry, bundle)
    return {name: arrays[name] for name in wanted}


# ---- locating the files ------------------------------------------------------------------------


def find_tf_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """The .index files of the TensorFlow checkpoints directly in `directory`, sorted."""
    return sorted(p for p in Path(directory).glob("*.index") if p.is_file())


def _index_path(prefix: str | os.PathLike) -> Path:
    path = Path(prefix)
    if path.is_dir():
        indexes = find_tf_checkpoints(path)
        if not indexes:
            raise MissingFileError(f"{path} holds no TensorFlow checkpoint (no *.index file); "
                                   "give the directory of a checkpoint or its prefix")
        if len(indexes) > 1:
            raise DataError(
                f"{path} holds {len(indexes)} TensorFlow checkpoints "
                f"({', '.join(p.name for p in indexes)}); give the prefix of one, e.g. "
                f"{indexes[-1].with_suffix('')} for {indexes[-1].name}"
            )
        return indexes[0]
    if path.name.endswith(".index") and path.is_file():
        return path
    index = Path(f"{path}.index")
    if index.is_file():
        return index
    hint = (f" {path} itself exists: a V1 checkpoint (one file, no .index), which is not read "
            "here; re-save it with tf.compat.v1.train.Saver (V2, the default)."
            if path.is_file() else
            " Give the prefix (dir/bert_model.ckpt), its .index file, or the directory.")
    raise MissingFileError(f"TensorFlow checkpoint index {index} does not exist.{hint}")


def _read_file(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise MissingFileError(f"{path} does not exist ({what})") from None


# ---- the SSTable -------------------------------------------------------------------------------


def _read_table(data: bytes, path: Path) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of the SSTable in `data`, in order."""
    if len(data) < _FOOTER_SIZE:
        raise DataError(f"{path} is {len(data)} bytes, shorter than an SSTable footer "
                        f"({_FOOTER_SIZE}): truncated or not a checkpoint index; re-copy it")
    footer = data[-_FOOTER_SIZE:]
    magic = struct.unpack("<Q", footer[-8:])[0]
    if magic != _MAGIC:
        raise DataError(
            f"{path} does not end in the SSTable magic number (got {magic:#018x}, want "
            f"{_MAGIC:#018x}): the file is truncated or is not a TensorFlow checkpoint index; "
            "re-copy it"
        )
    pos = 0
    handles = []
    for _ in range(2):  # metaindex, then index
        offset, pos = _varint(footer, pos, path)
        size, pos = _varint(footer, pos, path)
        handles.append((offset, size))
    records = []
    for _, handle in _block_records(data, handles[1], path):
        offset, at = _varint(handle, 0, path)
        size, _ = _varint(handle, at, path)
        records += _block_records(data, (offset, size), path)
    return records


def _block_records(data: bytes, handle: tuple[int, int], path: Path) -> list[tuple[bytes, bytes]]:
    """The (key, value) entries of the block at `handle` (offset, size without trailer)."""
    offset, size = handle
    end = offset + size + _TRAILER_SIZE
    if end > len(data) - _FOOTER_SIZE:
        raise DataError(f"{path}: a block at bytes {offset}..{end} runs past the table's end "
                        f"({len(data) - _FOOTER_SIZE}): the file is truncated or corrupt; "
                        "re-copy it")
    block = data[offset: offset + size]
    compression = data[offset + size]
    stored = struct.unpack("<I", data[offset + size + 1: end])[0]
    if unmask(stored) != crc32c(data[offset: offset + size + 1]):
        raise DataError(f"{path}: the block at byte {offset} fails its crc32c check: the file "
                        "is corrupt; re-copy it")
    if compression != 0:
        what = "snappy" if compression == 1 else f"type {compression}"
        raise DataError(f"{path}: the block at byte {offset} is {what}-compressed; "
                        "TensorFlow checkpoint indexes are uncompressed, so this is not one "
                        "(or was rewritten by another tool)")
    if size < 4:
        raise DataError(f"{path}: the block at byte {offset} is too short ({size} bytes)")
    num_restarts = struct.unpack("<I", block[-4:])[0]
    limit = size - 4 - 4 * num_restarts  # entries end where the restart array begins
    if limit < 0:
        raise DataError(f"{path}: the block at byte {offset} has a corrupt restart array")
    records = []
    pos, key = 0, b""
    while pos < limit:
        shared, pos = _varint(block, pos, path)
        unshared, pos = _varint(block, pos, path)
        value_size, pos = _varint(block, pos, path)
        if shared > len(key) or pos + unshared + value_size > limit:
            raise DataError(f"{path}: a corrupt entry in the block at byte {offset}")
        key = key[:shared] + block[pos: pos + unshared]
        pos += unshared
        records.append((key, block[pos: pos + value_size]))
        pos += value_size
    return records


def _varint(buf: bytes, pos: int, path: Path) -> tuple[int, int]:
    """(value, next position) of the base-128 varint at buf[pos]."""
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise DataError(f"{path}: a varint runs past its record: the file is corrupt")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


# ---- protobuf wire format ----------------------------------------------------------------------


def _fields(buf: bytes, path: Path) -> list[tuple[int, int | bytes]]:
    """(field number, value) pairs of a serialized message: varints and fixed ints as int,
    length-delimited fields as bytes."""
    fields = []
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos, path)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            value, pos = _varint(buf, pos, path)
        elif wire_type == 1:
            value, pos = struct.unpack("<Q", buf[pos: pos + 8])[0], pos + 8
        elif wire_type == 2:
            size, pos = _varint(buf, pos, path)
            value, pos = buf[pos: pos + size], pos + size
        elif wire_type == 5:
            value, pos = struct.unpack("<I", buf[pos: pos + 4])[0], pos + 4
        else:
            raise DataError(f"{path}: protobuf wire type {wire_type} in an index record: the "
                            "file is corrupt or not a TensorBundle")
        if pos > len(buf):
            raise DataError(f"{path}: a protobuf field runs past its record: corrupt index")
        fields.append((number, value))
    return fields


def _signed(value: int) -> int:
    """int32/int64 fields are varints of the two's complement 64-bit value."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _parse_header(buf: bytes, path: Path) -> tuple[int, bool]:
    """BundleHeaderProto: (num_shards, big_endian); the version must be one we read."""
    num_shards, big_endian, min_consumer, bad = 1, False, 0, []
    for number, value in _fields(buf, path):
        if number == 1:
            num_shards = _signed(value)
        elif number == 2:
            big_endian = value == 1
        elif number == 3:  # VersionDef: producer 1, min_consumer 2, bad_consumers 3
            for n, v in _fields(value, path):
                if n == 2:
                    min_consumer = v
                elif n == 3:
                    bad.append(v)
    if min_consumer > _TENSOR_BUNDLE_VERSION or _TENSOR_BUNDLE_VERSION in bad:
        raise DataError(f"{path}: checkpoint format version needs a reader of version "
                        f">= {min_consumer}; this one reads version {_TENSOR_BUNDLE_VERSION}")
    if num_shards < 1:
        raise DataError(f"{path}: the header says {num_shards} data shards: corrupt index")
    return num_shards, big_endian


def _parse_entry(name: str, buf: bytes, path: Path) -> _Entry:
    """BundleEntryProto: dtype 1, shape 2, shard_id 3, offset 4, size 5, crc32c 6, slices 7."""
    kw = {"dtype": 0, "shape": (), "shard_id": 0, "offset": 0, "size": 0, "crc32c": None,
          "sliced": False}
    for number, value in _fields(buf, path):
        if number == 1:
            kw["dtype"] = value
        elif number == 2:  # TensorShapeProto: dim 2 (Dim: size 1), unknown_rank 3
            dims = []
            for n, v in _fields(value, path):
                if n == 2:
                    sizes = [_signed(s) for k, s in _fields(v, path) if k == 1]
                    dims.append(sizes[0] if sizes else 0)
                elif n == 3 and v:
                    raise DataError(f"{path}: tensor {name!r} has an unknown rank")
            kw["shape"] = tuple(dims)
        elif number in (3, 4, 5):
            kw[{3: "shard_id", 4: "offset", 5: "size"}[number]] = _signed(value)
        elif number == 6:
            kw["crc32c"] = value
        elif number == 7:
            kw["sliced"] = True
    if any(d < 0 for d in kw["shape"]) or kw["offset"] < 0 or kw["size"] < 0:
        raise DataError(f"{path}: tensor {name!r} has a negative dimension, offset or size: "
                        "corrupt index")
    return _Entry(name=name, **kw)


# ---- tensors -----------------------------------------------------------------------------------


def _numpy_dtype(entry: _Entry, path: Path) -> np.dtype:
    dtype = _DTYPES.get(entry.dtype)
    if dtype is None:
        what = _DTYPE_NAMES.get(entry.dtype, f"enum {entry.dtype}")
        raise DataError(f"{path}: tensor {entry.name!r} has TensorFlow dtype {what}, which has "
                        "no numpy equivalent; pass names= without it")
    if dtype == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise ImportError(f"{path}: tensor {entry.name!r} is bfloat16, which numpy reads "
                              "through ml_dtypes (pip install ml_dtypes)") from None
        dtype = ml_dtypes.bfloat16
    return np.dtype(dtype)


def _read_tensor(f, file_size: int, path: Path, entry: _Entry, bundle: _Bundle) -> np.ndarray:
    if entry.offset + entry.size > file_size:
        raise DataError(
            f"{path} is {file_size} bytes but tensor {entry.name!r} lies at bytes "
            f"{entry.offset}..{entry.offset + entry.size}: the shard is truncated; re-copy it"
        )
    f.seek(entry.offset)
    buf = bytearray(entry.size)
    f.readinto(buf)
    if entry.dtype == _DT_STRING:
        return _strings(buf, entry, path)
    if entry.crc32c is not None and crc32c(buf) != unmask(entry.crc32c):
        raise DataError(f"{path}: tensor {entry.name!r} fails its crc32c check: the data "
                        "file is corrupt; re-copy it")
    dtype = _numpy_dtype(entry, bundle.index_path)
    count = int(np.prod(entry.shape, dtype=np.int64))
    if count * dtype.itemsize != entry.size:
        raise DataError(
            f"{path}: tensor {entry.name!r} ({dtype}, shape {entry.shape}) needs "
            f"{count * dtype.itemsize} bytes but its entry says {entry.size}: corrupt index"
        )
    array = np.frombuffer(buf, dtype=dtype.newbyteorder(">" if bundle.big_endian else "<"))
    return array.astype(dtype, copy=False).reshape(entry.shape)


def _strings(buf: bytearray, entry: _Entry, path: Path) -> np.ndarray:
    """A DT_STRING tensor: varint64 lengths, a masked crc32c of those lengths, then the bytes of
    every element back to back. TensorFlow checksums each length as a fixed-width uint32 (uint64
    past 4 GiB), not as the varint it writes: the entry's crc32c covers those widths, the length
    checksum and the bytes."""
    count = int(np.prod(entry.shape, dtype=np.int64))
    data = bytes(buf)
    pos, lengths = 0, []
    for _ in range(count):
        n, pos = _varint(data, pos, path)
        lengths.append(n)
    if pos + 4 + sum(lengths) != len(data):
        raise DataError(f"{path}: string tensor {entry.name!r} has {len(data)} bytes, not the "
                        f"{pos + 4 + sum(lengths)} its lengths say: corrupt file; re-copy it")
    widths = b"".join(struct.pack("<I" if n <= 0xFFFFFFFF else "<Q", n) for n in lengths)
    length_check = data[pos: pos + 4]
    crc = crc32c(widths)
    if unmask(struct.unpack("<I", length_check)[0]) != crc:
        raise DataError(f"{path}: string tensor {entry.name!r} fails its length checksum: "
                        "corrupt file; re-copy it")
    pos += 4
    if entry.crc32c is not None and crc32c(data[pos:], crc32c(length_check, crc)) != unmask(
            entry.crc32c):
        raise DataError(f"{path}: string tensor {entry.name!r} fails its crc32c check: "
                        "corrupt file; re-copy it")
    out = np.empty(count, dtype=object)
    for i, n in enumerate(lengths):
        out[i] = data[pos: pos + n]
        pos += n
    return out.reshape(entry.shape)
