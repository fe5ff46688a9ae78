#!/usr/bin/python3
"""Turn text files into tessera token files (HDF5, byte-level tokenizer).

Usage:
  prepare_data.py [--stdlib] [FILES_OR_DIRS_OR_GLOBS ...] --out-dir DIR [--val-every 20]
                  [--suffixes .py,.txt,.md,.rst]

Each input file is one document: its bytes are the tokens 0..255, followed by the end-of-text
token 256. Directories are searched recursively for files whose suffix is in --suffixes; files
named explicitly (or matched by a glob) are taken whatever their suffix. --stdlib adds the top-level
*.py files of this Python's standard library: tessera's embedded default corpus, present wherever
the project's dependencies are, never downloaded.

Documents are taken in sorted path order. Document i goes to DIR/val.h5 when
i % val_every == val_every - 1, otherwise to DIR/train.h5. Both files hold one contiguous
/tokens dataset (uint16) and the attributes format, format_version, tokenizer, vocab_size, eot,
num_documents (see tools/tessera_data.py). Each is written as FILE.tmp and renamed when complete.

Exit status: 0 done, 2 bad input (no input, a path that does not exist, an empty split),
1 I/O error.
"""
import argparse
import glob
import os
import sys
import sysconfig
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tessera_data import (BYTE_EOT, BYTE_VOCAB, EXIT_IO, FORMAT, FORMAT_VERSION,  # noqa: E402
                          ToolError, run_tool, token_dtype)

FLUSH_BYTES = 32 << 20      # tokens gathered in memory before one write to the dataset
LOG_SECONDS = 2.0
ALIGN = 4096                # objects start on 4 KiB boundaries: O_DIRECT reads the tokens in place


def stdlib_files():
    """The *.py files directly in the standard library directory."""
    d = sysconfig.get_paths()["stdlib"]
    try:
        names = os.listdir(d)
    except OSError as e:
        raise ToolError(f"{d}: cannot list the Python standard library ({e.strerror})", EXIT_IO)
    files = [os.path.join(d, n) for n in names if n.endswith(".py")]
    files = [p for p in files if os.path.isfile(p)]
    if not files:
        raise ToolError(f"{d}: no .py files in the Python standard library directory")
    return files


def walk_dir(d, suffixes):
    out = []
    for root, dirs, names in os.walk(d, onerror=_walk_error):
        dirs.sort()
        for n in names:
            p = os.path.join(root, n)
            if os.path.splitext(n)[1] in suffixes and os.path.isfile(p):
                out.append(p)
    return out


def _walk_error(e):
    raise ToolError(f"{e.filename}: cannot list directory ({e.strerror})", EXIT_IO)


def collect(inputs, use_stdlib, suffixes):
    """Sorted, de-duplicated absolute paths of every document."""
    paths = stdlib_files() if use_stdlib else []
    for arg in inputs:
        if os.path.isdir(arg):
            paths += walk_dir(arg, suffixes)
        elif os.path.isfile(arg):
            paths.append(arg)
        elif os.path.exists(arg):
            raise ToolError(f"{arg}: not a regular file or directory")
        elif glob.has_magic(arg):
            matches = sorted(glob.glob(arg, recursive=True))
            if not matches:
                raise ToolError(f"{arg}: the pattern matches nothing")
            for m in matches:
                paths += walk_dir(m, suffixes) if os.path.isdir(m) else [m] if os.path.isfile(m) else []
        else:
            raise ToolError(f"{arg}: no such file or directory")
    return sorted({os.path.abspath(p) for p in paths})


class SplitWriter:
    """One output file: a contiguous /tokens dataset of known size, filled in order."""

    def __init__(self, path, num_tokens, num_documents):
        import h5py

        self.path, self.tmp = path, path + ".tmp"
        self.num_tokens, self.num_documents = num_tokens, num_documents
        self.pos, self.pending, self.pending_bytes = 0, [], 0
        self.t0 = time.time()
        try:
            self.f = h5py.File(self.tmp, "w", alignment_threshold=1, alignment_interval=ALIGN)
        except OSError as e:
            raise ToolError(f"{self.tmp}: cannot create ({e})", EXIT_IO) from None
        a = self.f.attrs
        a["format"] = np.bytes_(FORMAT)
        a["format_version"] = np.int64(FORMAT_VERSION)
        a["tokenizer"] = np.bytes_("byte")
        a["vocab_size"] = np.int64(BYTE_VOCAB)
        a["eot"] = np.int64(BYTE_EOT)
        a["num_documents"] = np.int64(num_documents)
        # No chunks, no filters: tessera reads the raw bytes at the dataset's file offset.
        self.ds = self.f.create_dataset("tokens", shape=(num_tokens,), dtype=token_dtype(BYTE_VOCAB),
                                        track_times=False)

    def add(self, data):
        # data: the document's bytes; its tokens are the byte values, then EOT.
        self.pending.append(data)
        self.pending_bytes += len(data) + 1
        if self.pending_bytes >= FLUSH_BYTES:
            self.flush()

    def flush(self):
        if not self.pending:
            return
        buf = np.empty(self.pending_bytes, dtype=self.ds.dtype)
        at = 0
        for data in self.pending:
            buf[at:at + len(data)] = np.frombuffer(data, dtype=np.uint8)
            buf[at + len(data)] = BYTE_EOT
            at += len(data) + 1
        self.ds[self.pos:self.pos + at] = buf
        self.pos += at
        self.pending, self.pending_bytes = [], 0

    def close(self):
        self.flush()
        assert self.pos == self.num_tokens, (self.pos, self.num_tokens)
        self.f.close()
        self.seconds = time.time() - self.t0

    def discard(self):
        try:
            self.f.close()
        except Exception:
            pass
        try:
            os.remove(self.tmp)
        except OSError:
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="*", metavar="FILES_OR_DIRS_OR_GLOBS")
    ap.add_argument("--stdlib", action="store_true", help="add the standard library's top-level *.py files")
    ap.add_argument("--out-dir", required=True, help="where train.h5 and val.h5 are written")
    ap.add_argument("--val-every", type=int, default=20, 
                    help="every N-th document goes to val.h5 (default 20)")
    ap.add_argument("--suffixes", default=".py,.txt,.md,.rst",
                    help="file suffixes taken from directories (default .py,.txt,.md,.rst)")
    args = ap.parse_args()

    if args.val_every < 2:
        raise ToolError(f"--val-every {args.val_every}: must be at least 2 (else train.h5 would be empty)")
    suffixes = {s if s.startswith(".") else "." + s for s in args.suffixes.split(",") if s.strip()}
    if not args.inputs and not args.stdlib:
        raise ToolError("no input: give files, directories or globs, or --stdlib")
    paths = collect(args.inputs, args.stdlib, suffixes)
    if not paths:
        raise ToolError("no input documents found (directories are searched for "
                        f"{','.join(sorted(suffixes))})")

    sizes = []
    for p in paths:
        try:
            sizes.append(os.stat(p).st_size)
        except OSError as e:
            raise ToolError(f"{p}: cannot stat ({e.strerror})", EXIT_IO)
    is_val = [i % args.val_every == args.val_every - 1 for i in range(len(paths))]
    n_val = sum(is_val)
    n_train = len(paths) - n_val
    if n_val == 0 or n_train == 0:
        raise ToolError(f"{len(paths)} documents with --val-every {args.val_every} leave the "
                        f"{'val' if n_val == 0 else 'train'} split empty: give more files or a "
                        "smaller --val-every")

    try:
        os.makedirs(args.out_dir, exist_ok=True)
    except OSError as e:
        raise ToolError(f"{args.out_dir}: cannot create directory ({e.strerror})", EXIT_IO)
    tokens = {False: 0, True: 0}
    for s, v in zip(sizes, is_val):
        tokens[v] += s + 1
    writers = {}
    try:
        writers[False] = SplitWriter(os.path.join(args.out_dir, "train.h5"), tokens[False], n_train)
        writers[True] = SplitWriter(os.path.join(args.out_dir, "val.h5"), tokens[True], n_val)
        total_mb = sum(sizes) / 1e6
        t0 = last_log = time.time()
        done_bytes = 0
        for i, (p, size, v) in enumerate(zip(paths, sizes, is_val)):
            try:
                with open(p, "rb") as fh:
                    data = fh.read()
            except OSError as e:
                raise ToolError(f"{p}: cannot read ({e.strerror})", EXIT_IO)
            if len(data) != size:
                raise ToolError(f"{p}: changed size while being read ({size} -> {len(data)} bytes)", EXIT_IO)
            writers[v].add(data)
            done_bytes += size
            now = time.time()
            if now - last_log >= LOG_SECONDS:
                last_log = now
                mb = done_bytes / 1e6
                print(f"prepare_data: {i + 1}/{len(paths)} files, {mb:.1f}/{total_mb:.1f} MB, "
                      f"{mb / max(now - t0, 1e-9):.1f} MB/s", file=sys.stderr)
        for v in (False, True):
            writers[v].close()
        # Rename only when both files are complete: a killed run leaves at most *.tmp files.
        for v in (False, True):
            os.replace(writers[v].tmp, writers[v].path)
    except BaseException:
        for w in writers.values():
            w.discard()
        raise
    for v in (False, True):
        w = writers[v]
        print(f"prepare_data: {w.path}: {w.num_documents} documents, {w.num_tokens} tokens, "
              f"{w.seconds:.2f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_tool(main)
