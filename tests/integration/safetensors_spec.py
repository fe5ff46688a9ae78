#!/usr/bin/python3
"""Byte-level checks of tools/interop/safetensors_io.py against the safetensors format: files built here
by hand, byte by byte, from the format's rules (8-byte little-endian header length, a UTF-8 JSON
header with dtype / shape / data_offsets per tensor and an optional __metadata__ of strings,
padding spaces, a data buffer covered exactly, little-endian row-major values). Prints one
PASS/FAIL line per check; exit 1 on any failure."""
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "interop"))
import safetensors_io as st  # noqa: E402

FAILS = 0


def check(name, ok, detail=""):
    global FAILS
    print(("PASS " if ok else "FAIL ") + name + (f": {detail}" if detail and not ok else ""))
    FAILS += 0 if ok else 1


def file_of(header_text, data, pad=0):
    """A file from header text (str, or bytes as is), padded with spaces, and the data bytes."""
    h = header_text if isinstance(header_text, bytes) else header_text.encode("utf-8")
    h += b" " * pad
    return struct.pack("<Q", len(h)) + h + data


def refused(blob, needle):
    try:
        st.parse_header(blob, "x.safetensors")
    except st.FormatError as e:
        return needle in str(e), str(e)
    return False, "accepted"


# --- the writer, byte for byte -------------------------------------------------------------
# The smallest case: {"test": F32 zeros [2, 2]}. The header is 60 bytes of JSON, padded with 4
# spaces to 64 so that the data starts at byte 72, a multiple of 8.
want = (bytes([64, 0, 0, 0, 0, 0, 0, 0]) +
        b'{"test":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}' + b" " * 4 + bytes(16))
got = st.encode({"test": np.zeros((2, 2), np.float32)})
check("writer: {test: F32 zeros [2,2]} is 8 + 64 + 16 bytes as the format lays them out",
      got == want, f"{got[:80]!r}")

# Mixed types: the 8-byte element first, then 4-byte, then the 2-byte ones by name; metadata
# first; every value little-endian.
tensors = {
    "a": np.array([1.0, -2.0], np.float32),              # 00 00 80 3f, 00 00 00 c0
    "b": np.array([7], np.int64),                         # 07 00 .. 00
    "c": np.array([1.0, 0.5, -0.0], np.float16),          # 00 3c, 00 38, 00 80
    "d": ("BF16", [2], bytes([0x80, 0x3F, 0x00, 0xC0])),  # bf16 1.0, -2.0
}
header = ('{"__metadata__":{"format":"pt"},'
          '"b":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},'
          '"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},'
          '"c":{"dtype":"F16","shape":[3],"data_offsets":[16,22]},'
          '"d":{"dtype":"BF16","shape":[2],"data_offsets":[22,26]}}')
data = (bytes([7, 0, 0, 0, 0, 0, 0, 0]) + bytes([0, 0, 0x80, 0x3F, 0, 0, 0, 0xC0]) +
        bytes([0, 0x3C, 0, 0x38, 0, 0x80]) + bytes([0x80, 0x3F, 0x00, 0xC0]))
want = file_of(header, data, pad=-len(header) % 8)
got = st.encode(tensors, {"format": "pt"})
check("writer: I64, F32, F16, BF16 and __metadata__ byte for byte (order, offsets, padding)",
      got == want, f"\n  got  {got!r}\n  want {want!r}")
check("writer: the header length is a multiple of 8", struct.unpack("<Q", got[:8])[0] % 8 == 0)

# A big-endian array is written little-endian.
got = st.encode({"x": np.array([1, 2], dtype=">i4")})
check("writer: a big-endian int32 array is stored little-endian",
      got.endswith(bytes([1, 0, 0, 0, 2, 0, 0, 0])) and b'"I32"' in got)

# --- the reader, on hand-made files ----------------------------------------------------------
header = ('{"__metadata__":{"source":"hand"},'
          '"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},'
          '"h":{"dtype":"BF16","shape":[2],"data_offsets":[16,20]},'
          '"n":{"dtype":"I64","shape":[],"data_offsets":[20,28]},'
          '"e":{"dtype":"F32","shape":[0,3],"data_offsets":[28,28]},'
          '"m":{"dtype":"BOOL","shape":[2],"data_offsets":[28,30]},'
          '"u":{"dtype":"U8","shape":[1],"data_offsets":[30,31]},'
          '"f":{"dtype":"F16","shape":[1],"data_offsets":[31,33]}}')
data = (struct.pack("<4f", 1.5, -2.0, 3.25, 0.0) + bytes([0x80, 0x3F, 0x00, 0xC0]) +
        struct.pack("<q", -5) + bytes([1, 0]) + bytes([200]) + bytes([0x00, 0x3C]))
path = "spec_read.safetensors"
with open(path, "wb") as f:
    f.write(file_of(header, data, pad=5))   # trailing spaces in the header are allowed
try:
    with st.File(path) as f:
        t = {k: np.array(v.numpy()) for k, v in f.tensors.items()}
        ok = (f.metadata == {"source": "hand"} and
              t["w"].tolist() == [[1.5, -2.0], [3.25, 0.0]] and t["w"].dtype == np.float32 and
              t["h"].tolist() == [1.0, -2.0] and t["h"].dtype == np.float32 and
              t["n"].shape == () and int(t["n"]) == -5 and t["e"].shape == (0, 3) and
              t["m"].tolist() == [True, False] and t["u"].tolist() == [200] and
              t["f"].tolist() == [1.0])
        check("reader: F32 [2,2], BF16 (as float32), I64 scalar, empty [0,3], BOOL, U8, F16, "
              "metadata, padded header", ok, repr(t))
except st.FormatError as e:
    check("reader: hand-made file", False, str(e))
finally:
    os.remove(path)

# --- what the format forbids -------------------------------------------------------------------
good = '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
cases = [
    ("shorter than 8 bytes", b"\x05\x00\x00", "too short for the 8-byte header length"),
    ("header length past the end", struct.pack("<Q", 100) + b"{}", "runs past the end of the file"),
    ("header length over 100 MB", struct.pack("<Q", 200_000_000) + b"{}", "exceeds the"),
    ("header not starting with {", file_of(" " + good, bytes(8)), "does not start with '{'"),
    ("header not UTF-8", file_of(b'{"\xff":1}', b""), "not UTF-8"),
    ("header not JSON", file_of('{"a":', b""), "not valid JSON"),
    ("a header that is a JSON list", file_of('[1]', b""), "does not start with '{'"),
    ("a name twice", file_of('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                             '"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', bytes(8)),
     "names 'a' twice"),
    ("an entry without data_offsets", file_of('{"a":{"dtype":"F32","shape":[2]}}', bytes(8)),
     "needs exactly dtype, shape and data_offsets"),
    ("an unknown dtype", file_of(good.replace("F32", "F33"), bytes(8)), "unknown dtype 'F33'"),
    ("a negative dimension", file_of(good.replace("[2]", "[-2]"), bytes(8)), "non-negative integers"),
    ("a fractional dimension", file_of(good.replace("[2]", "[2.0]"), bytes(8)), "non-negative integers"),
    ("offsets END < BEGIN", file_of(good.replace("[0,8]", "[8,0]"), bytes(8)), "0 <= BEGIN <= END"),
    ("offsets of three numbers", file_of(good.replace("[0,8]", "[0,4,8]"), bytes(8)), "BEGIN, END"),
    ("bytes disagree with dtype x shape", file_of(good.replace("[0,8]", "[0,12]"), bytes(12)),
     "hold 12 bytes, F32 [2] needs 8"),
    ("a hole in the buffer", file_of('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                                     '"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}',
                                     bytes(12)), "leaves a hole at bytes 4-8"),
    ("overlapping tensors", file_of('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                                    '"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}',
                                    bytes(8)), "overlaps the previous tensor"),
    ("bytes after the last tensor", file_of(good, bytes(9)), "1 bytes after the last tensor"),
    ("data truncated", file_of(good, bytes(7)), "truncated?"),
    ("__metadata__ not strings", file_of('{"__metadata__":{"n":1}}', b""), "strings to strings"),
    ("an entry that is not an object", file_of('{"a":[1,2]}', b""), "needs exactly dtype"),
    ("an entry that is a number", file_of('{"a":1}', b""), "needs exactly dtype"),
]
for name, blob, needle in cases:
    ok, msg = refused(blob, needle)
    ok = ok and "\n" not in msg
    check(f"reader refuses {name}, in one line ({msg})" if ok else f"reader refuses {name}", ok, msg)

# The writer's own refusals.
try:
    st.encode({"__metadata__": np.zeros(1, np.float32)})
    check("writer refuses a tensor named __metadata__", False)
except st.FormatError:
    check("writer refuses a tensor named __metadata__", True)
try:
    st.encode({"x": np.zeros(1, np.complex64)})
    check("writer refuses a dtype the format lacks (complex64)", False)
except st.FormatError:
    check("writer refuses a dtype the format lacks (complex64)", True)

# --- round trip over every numpy-backed dtype, alignment of every tensor ------------------------
rng = np.random.default_rng(1)
arrays = {}
for dname, (size, np_type) in st.DTYPES.items():
    if np_type is None:
        continue
    if np_type == np.bool_:
        arrays[dname.lower()] = rng.integers(0, 2, (3, 5)).astype(np.bool_)
    elif np_type.kind == "f":
        arrays[dname.lower()] = rng.standard_normal((3, 5)).astype(np_type)
    else:
        info = np.iinfo(np_type)
        arrays[dname.lower()] = rng.integers(info.min, info.max, (3, 5), dtype=np_type, endpoint=True)
arrays["odd"] = np.arange(3, dtype=np.uint8)           # 3 bytes: must not misalign the others
arrays["big"] = np.arange(7, dtype=np.float64)
blob = st.encode(arrays, {"k": "v"})
entries, meta, start = st.parse_header(blob)
back = {k: np.frombuffer(blob[start + b:start + e], dtype=arrays[k].dtype.newbyteorder("<")).reshape(s)
        for k, (_, s, b, e) in entries.items()}
check("round trip: every dtype, values and shapes", all(np.array_equal(back[k], arrays[k]) for k in arrays)
      and meta == {"k": "v"})
check("alignment: every tensor starts at a multiple of its element size in the file",
      all((start + b) % st.DTYPES[d][0] == 0 for d, _, b, _ in entries.values()))
print(f"safetensors spec: {FAILS} failed")
sys.exit(1 if FAILS else 0)
