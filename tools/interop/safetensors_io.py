#!/usr/bin/python3
"""The safetensors file format, read and written by tessera's own code (no safetensors package).

A file is
  bytes 0..7      N, the header's length in bytes, an unsigned 64-bit little-endian integer;
  bytes 8..8+N    the header: UTF-8 JSON, one object that starts with '{' and may be padded at
                  its end with spaces (0x20); each key a tensor name mapping to
                  {"dtype": "F32", "shape": [rows, cols], "data_offsets": [BEGIN, END]}, and the
                  optional key "__metadata__" mapping to an object of strings to strings;
  bytes 8+N..     the data buffer: each tensor's bytes, little-endian, row-major ('C' order), at
                  [BEGIN, END) of the buffer, END - BEGIN = elements x the dtype's size.

What a reader refuses (each a FormatError naming the file, the tensor and the numbers): a file
shorter than 8 bytes; N larger than the file or than 100 MB (the reference implementation's
bound); a header that is not UTF-8, not JSON, not an object or does not start with '{'; a name
given twice; an entry without dtype/shape/data_offsets, an unknown dtype, a negative or
non-integer dimension; offsets that are not two integers BEGIN <= END, a byte count that
disagrees with dtype x shape, and a buffer not covered exactly (ranges overlapping, a hole between
them, or bytes past the last one); a __metadata__ that is not strings to strings.

The writer (write_file) puts the tensors in the buffer largest element size first, then by name,
and pads the header with spaces to a multiple of 8 bytes, so that every tensor starts at a
multiple of its element size in the file (what a reader that maps the file needs); it writes
__metadata__ first when given.

Used by import_weights.py and export_weights.py; tests/integration/test_safetensors.py checks it
byte by byte against the rules above.
"""
import json
import mmap
import os
import struct

import numpy as np

MAX_HEADER = 100 * 1000 * 1000

# dtype name -> (bytes per element, numpy dtype; None where numpy has none: kept as raw bits).
DTYPES = {
    "BOOL": (1, np.dtype(np.bool_)),
    "U8": (1, np.dtype("<u1")),
    "I8": (1, np.dtype("<i1")),
    "F8_E5M2": (1, None),
    "F8_E4M3": (1, None),
    "U16": (2, np.dtype("<u2")),
    "I16": (2, np.dtype("<i2")),
    "F16": (2, np.dtype("<f2")),
    "BF16": (2, None),
    "U32": (4, np.dtype("<u4")),
    "I32": (4, np.dtype("<i4")),
    "F32": (4, np.dtype("<f4")),
    "U64": (8, np.dtype("<u8")),
    "I64": (8, np.dtype("<i8")),
    "F64": (8, np.dtype("<f8")),
}
_NUMPY_TO_DTYPE = {np.dtype(v[1]).str: k for k, v in DTYPES.items() if v[1] is not None}
_NUMPY_TO_DTYPE[np.dtype(np.bool_).str] = "BOOL"


class FormatError(Exception):
    """A malformed or unreadable safetensors file: the message is one line."""


class Tensor:
    """One tensor of a file: its dtype name, shape and bytes (a view of the mapped file)."""

    def __init__(self, dtype, shape, data):
        self.dtype, self.shape, self.data = dtype, tuple(shape), data

    def numpy(self):
        """The values: numpy of the stored type; BF16 as float32 (exact), F8 types as raw uint8."""
        size, np_type = DTYPES[self.dtype]
        if self.dtype == "BF16":
            bits = np.frombuffer(self.data, dtype="<u2").astype(np.uint32) << 16
            return bits.view(np.float32).reshape(self.shape)
        if np_type is None:
            return np.frombuffer(self.data, dtype=np.uint8).reshape(self.shape)
        return np.frombuffer(self.data, dtype=np_type).reshape(self.shape)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _unique_object(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise FormatError(f"the header names '{k}' twice")
        seen[k] = v
    return seen


def parse_header(blob, where="safetensors"):
    """Parses and checks the header of the file's bytes `blob` (anything indexable by slices:
    bytes, mmap). Returns (tensors: {name: (dtype, shape, begin, end)} with offsets into the
    data buffer, metadata dict or None, buffer start)."""
    size = len(blob)
    if size < 8:
        raise FormatError(f"{where}: {size} bytes: too short for the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > MAX_HEADER:
        raise FormatError(f"{where}: header length {n} (bytes 0-7) exceeds the {MAX_HEADER}-byte limit")
    if 8 + n > size:
        raise FormatError(f"{where}: header length {n} (bytes 0-7) runs past the end of the file "
                          f"({size} bytes): truncated?")
    raw = bytes(blob[8:8 + n])
    if not raw.startswith(b"{"):
        raise FormatError(f"{where}: the header does not start with '{{'")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(f"{where}: the header is not UTF-8 (byte {8 + e.start})") from None
    try:
        header = json.loads(text, object_pairs_hook=_unique_object)
    except FormatError as e:
        raise FormatError(f"{where}: {e}") from None
    except json.JSONDecodeError as e:
        raise FormatError(f"{where}: the header is not valid JSON: {e.msg} at header byte {e.pos}") from None
    if not isinstance(header, dict):
        raise FormatError(f"{where}: the header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise FormatError(f"{where}: __metadata__ must map strings to strings")
    buffer_bytes = size - 8 - n
    tensors = {}
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise FormatError(f"{where}: tensor '{name}': an entry needs exactly dtype, shape and "
                              f"data_offsets, got {sorted(info) if isinstance(info, dict) else info!r}")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPES:
            raise FormatError(f"{where}: tensor '{name}': unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise FormatError(f"{where}: tensor '{name}': shape {shape!r} is not a list of "
                              "non-negative integers")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(
                isinstance(o, int) and not isinstance(o, bool) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise FormatError(f"{where}: tensor '{name}': data_offsets {offsets!r} are not "
                              "[BEGIN, END] with 0 <= BEGIN <= END")
        want = _numel(shape) * DTYPES[dtype][0]
        if offsets[1] - offsets[0] != want:
            raise FormatError(f"{where}: tensor '{name}': data_offsets {offsets} hold "
                              f"{offsets[1] - offsets[0]} bytes, {dtype} {shape} needs {want}")
        tensors[name] = (dtype, tuple(shape), offsets[0], offsets[1])
    # The buffer is covered exactly: sorted by BEGIN, each range starts where the previous ended.
    end = 0
    for name, (_, _, begin, stop) in sorted(tensors.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if begin != end:
            what = "overlaps the previous tensor" if begin < end else f"leaves a hole at bytes {end}-{begin}"
            raise FormatError(f"{where}: tensor '{name}': data_offsets [{begin}, {stop}] {what}")
        end = stop
    if end != buffer_bytes:
        if end > buffer_bytes:
            raise FormatError(f"{where}: the tensors need a {end}-byte data buffer, the file has "
                              f"{buffer_bytes} bytes after the header: truncated?")
        raise FormatError(f"{where}: {buffer_bytes - end} bytes after the last tensor's data "
                          f"(buffer {buffer_bytes} bytes, tensors end at {end})")
    return tensors, metadata, 8 + n


class File:
    """A safetensors file opened for reading: .tensors {name: Tensor}, .metadata (dict or None).
    The tensors are views of the mapped file: close() (or `with`) only after the last use."""

    def __init__(self, path):
        self.path = path
        self._file = open(path, "rb")
        try:
            size = os.fstat(self._file.fileno()).st_size
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
            entries, self.metadata, start = parse_header(self._map, path)
        except BaseException:
            self._file.close()
            raise
        view = memoryview(self._map)
        self.tensors = {name: Tensor(dtype, shape, view[start + b:start + e])
                        for name, (dtype, shape, b, e) in entries.items()}

    def close(self):
        self.tensors = {}
        if isinstance(self._map, mmap.mmap):
            try:
                self._map.close()
            except BufferError:  # a caller still holds a view: the map goes with it
                pass
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_file(path):
    """{name: numpy array (a copy)} and the metadata of a safetensors file."""
    with File(path) as f:
        return {name: np.array(t.numpy()) for name, t in f.tensors.items()}, f.metadata


def dtype_name(array):
    """The safetensors dtype of a numpy array (little-endian, or native on a little-endian host)."""
    key = array.dtype.newbyteorder("<").str
    if key not in _NUMPY_TO_DTYPE:
        raise FormatError(f"no safetensors dtype for numpy {array.dtype}")
    return _NUMPY_TO_DTYPE[key]


def _layout(tensors, metadata):
    """(header bytes, [data chunk per tensor in buffer order]) of a file holding `tensors`."""
    entries = []
    for name, value in tensors.items():
        if name == "__metadata__":
            raise FormatError("'__metadata__' cannot name a tensor")
        if isinstance(value, tuple):
            dtype, shape, data = value
            data = memoryview(bytes(data))
        else:
            array = np.ascontiguousarray(value)
            dtype, shape = dtype_name(array), array.shape
            array = np.ascontiguousarray(array.astype(array.dtype.newbyteorder("<"), copy=False))
            data = memoryview(array.reshape(-1).view(np.uint8)) if array.size else memoryview(b"")
        if dtype not in DTYPES:
            raise FormatError(f"tensor '{name}': unknown dtype {dtype!r}")
        if data.nbytes != _numel(shape) * DTYPES[dtype][0]:
            raise FormatError(f"tensor '{name}': {data.nbytes} bytes for {dtype} {list(shape)}")
        entries.append((name, dtype, [int(d) for d in shape], data))
    # Largest element first, then by name: every tensor starts at a multiple of its element size.
    entries.sort(key=lambda e: (-DTYPES[e[1]][0], e[0]))
    header, offset = {}, 0
    if metadata is not None:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise FormatError("__metadata__ must map strings to strings")
        header["__metadata__"] = dict(metadata)
    for name, dtype, shape, data in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + data.nbytes]}
        offset += data.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text, [e[3] for e in entries]


def encode(tensors, metadata=None):
    """The bytes of a safetensors file holding `tensors` ({name: numpy array, or (dtype name,
    shape, raw little-endian bytes)} for types numpy lacks, e.g. BF16) and `metadata`."""
    head, chunks = _layout(tensors, metadata)
    return b"".join([head] + [bytes(c) for c in chunks])


def write_file(path, tensors, metadata=None):
    """Writes the file encode() describes to path, tensor by tensor (through path.tmp and a
    rename, so a failed write leaves no file). Returns its size in bytes."""
    head, chunks = _layout(tensors, metadata)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(head)
            for c in chunks:
                f.write(c)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return len(head) + sum(c.nbytes for c in chunks)
