#!/usr/bin/python3
"""Token files in the layouts other trainers publish, written here from those layouts (not by
tessera), for the data-format tests.

  write_formats.py good SRC.h5 N OUTDIR   the first N tokens of SRC.h5 as: llm.c shards
      (OUTDIR/shard_00000{0,1,2}.bin), a Megatron dataset (OUTDIR/mega.idx/.bin, one sequence per
      document), raw uint16 and uint32 files, and an HDF5 file with uint32 tokens; prints the
      number of documents
  write_formats.py bad OUTDIR             malformed files, one per case (see bad())

llm.c (dev/data/data_common.py): a header of 256 little-endian int32 -- magic 20240520, version
(1: uint16 GPT-2 tokens, 2: uint32), token count -- then the tokens.
Megatron-LM (megatron/core/datasets/indexed_dataset.py, _IndexWriter): PREFIX.idx holds the magic
b"MMIDIDX\\x00\\x00", version <Q 1, dtype code <B (8 uint16, 4 int32), sequence count <Q,
document count <Q, then sequence lengths int32[], sequence pointers int64[] (byte offsets into
PREFIX.bin) and document indices int64[] (the first sequence of each document, a leading 0, and
the sequence count at the end); PREFIX.bin holds the sequences' tokens back to back.
"""
import struct
import sys

import h5py
import numpy as np

LLMC_MAGIC = 20240520


def write_llmc(path, tokens, version=1, count=None):
    header = np.zeros(256, dtype="<i4")
    header[0], header[1] = LLMC_MAGIC, version
    header[2] = len(tokens) if count is None else count
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2" if version == 1 else "<u4").tobytes())


def write_megatron(prefix, documents, dtype="<u2", code=8, pointer_shift=0):
    sizes = np.array([len(d) for d in documents], dtype="<i4")
    width = np.dtype(dtype).itemsize
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1], dtype=np.int64) * width]).astype("<i8")
    pointers[-1] += pointer_shift
    doc_idx = np.arange(len(documents) + 1, dtype="<i8")
    with open(prefix + ".bin", "wb") as f:
        for d in documents:
            f.write(np.asarray(d, dtype=dtype).tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(sizes.tobytes())
        f.write(pointers.tobytes())
        f.write(doc_idx.tobytes())


def split_documents(tokens, eot):
    """Documents end with the eot token, as tools/data/prepare_data.py writes them."""
    docs, start = [], 0
    for i in np.flatnonzero(tokens == eot):
        docs.append(tokens[start:i + 1])
        start = i + 1
    if start < len(tokens):
        docs.append(tokens[start:])
    return docs


def good(src, n, out):
    with h5py.File(src, "r") as f:
        tokens = f["tokens"][:n].astype(np.uint32)
        eot = int(f.attrs["eot"])
    thirds = [0, n // 3, 2 * n // 3, n]
    for i in range(3):
        write_llmc(f"{out}/shard_{i:06d}.bin", tokens[thirds[i]:thirds[i + 1]])
    docs = split_documents(tokens, eot)
    write_megatron(f"{out}/mega", docs)
    tokens.astype("<u2").tofile(f"{out}/raw16.bin")
    tokens.astype("<u4").tofile(f"{out}/raw32.bin")
    with h5py.File(f"{out}/tok32.h5", "w") as f:
        f.create_dataset("tokens", data=tokens.astype(np.uint32))
        f.attrs["vocab_size"] = np.int64(257)
        f.attrs["eot"] = np.int64(256)
        f.attrs["tokenizer"] = np.bytes_("byte")
    print(len(docs))


def bad(out):
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 200, 5000).astype(np.uint16)
    # llm.c: truncated (the header promises more than the file has), a wrong magic, a header
    # count smaller than the file holds, a header alone, an empty file, an id past the vocabulary
    write_llmc(f"{out}/truncated.bin", tokens, count=6000)
    write_llmc(f"{out}/magic.bin", tokens)
    with open(f"{out}/magic.bin", "r+b") as f:
        f.write(struct.pack("<i", 20240519))
    write_llmc(f"{out}/count.bin", tokens, count=4000)
    with open(f"{out}/header_only.bin", "wb") as f:
        f.write(np.zeros(100, dtype="<i4").tobytes())
    open(f"{out}/empty.bin", "wb").close()
    high = tokens.copy()
    high[3210] = 300
    write_llmc(f"{out}/highid.bin", high)
    # Megatron: the last sequence's pointer runs past the end of the .bin
    docs = [tokens[i:i + 500] for i in range(0, 5000, 500)]
    write_megatron(f"{out}/pastend", docs, pointer_shift=4000)
    # Megatron: a .idx of the wrong magic, and one cut short
    write_megatron(f"{out}/badidx", docs)
    with open(f"{out}/badidx.idx", "r+b") as f:
        f.write(b"MMIDXXX")
    write_megatron(f"{out}/shortidx", docs)
    with open(f"{out}/shortidx.idx", "r+b") as f:
        f.truncate(60)
    # raw: an odd number of bytes for uint16
    with open(f"{out}/odd.raw", "wb") as f:
        f.write(tokens.tobytes() + b"\x01")


if __name__ == "__main__":
    if sys.argv[1] == "good":
        good(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        bad(sys.argv[2])
