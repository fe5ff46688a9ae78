#!/usr/bin/python3
"""Turn text files into tessera token files (HDF5; byte-level or BPE tokenizer).

Usage:
  prepare_data.py [--stdlib] [FILES_OR_DIRS_OR_GLOBS ...] --out-dir DIR [--val-every 20]
                  [--suffixes .py,.txt,.md,.rst] [--log-seconds 2]
                  [--tokenizer byte|bpe|TOKENIZER] [--vocab-size 4096] [--bpe-sample-mb 100]
                  [--character-coverage 0.9995] [--threads N] [--tessera BIN]

Each input file is one document. Directories are searched recursively for files whose suffix is
in --suffixes; files named explicitly (or matched by a glob) are taken whatever their suffix.
--stdlib adds the top-level *.py files of this Python's standard library: tessera's embedded
default corpus, present wherever the project's dependencies are, never downloaded.

Tokenizers:
  byte  (default) a document's bytes are the tokens 0..255, followed by the end-of-text token 256.
  bpe   a sentencepiece BPE model of --vocab-size pieces (256 byte pieces for byte fallback,
        <unk>, the end-of-text <eot> = the model's eos id, the characters covering
        --character-coverage of the text, and merges) is trained on the lines of the training
        documents: all of them up to --bpe-sample-mb MB, else every k-th document, so the sample
        spans the corpus. Training is single-threaded and deterministic: the same input gives the
        same model, byte for byte. Every document is then encoded as a whole (a long one in pieces
        cut after a newline, which no piece contains, so the ids are the same), followed by <eot>.
        Text is read as UTF-8; bytes that are not UTF-8 become U+FFFD (the summary counts such
        documents). Encoding runs on --threads threads (default: every core).
  TOKENIZER  a Hugging Face byte-level BPE (GPT-2, LLaMA 3): a tokenizer.json, GPT-2's vocab.json
        (with merges.txt beside it), or a model directory holding either. config.json and
        tokenizer_config.json beside it name the special tokens (bos, eos, pad), else the tokens
        named <|endoftext|> / <|end_of_text|> and <|begin_of_text|>. Every document is encoded as
        bytes (text that is not UTF-8 included: its invalid bytes are pieces of their own that
        the merges may join, as any bytes; docs/data.md), by
        tessera's own encoder (`tessera data encode --stream`, the one `tessera sample` encodes
        prompts with; --tessera BIN, default bin/tessera of this checkout) on --threads threads,
        preceded by bos when the tokenizer's bos differs from its eos (LLaMA 3) and followed by
        eos. The tokenizer.json (with the special ids) is stored as /tokenizer_model, tokenizer
        "hf-bpe" (see tools/data/hf_tokenizer.py).

Documents are taken in sorted path order. Document i goes to DIR/val.h5 when
i % val_every == val_every - 1, otherwise to DIR/train.h5. Both files hold one contiguous
/tokens dataset (uint16; uint32 above 65536 pieces) and the attributes format, format_version,
tokenizer, vocab_size, eot, num_documents, and the int64 dataset /document_offsets (where each
document's first token is, then the token count); with --tokenizer bpe also the serialized sentencepiece
model in the uint8 dataset /tokenizer_model (see tools/data/tessera_data.py), with a tokenizer.json
its text. Each is written as
FILE.tmp and renamed when complete.

With the byte tokenizer (where a tessera binary is built) and with a TOKENIZER, encoding and
writing are `tessera data prepare`'s (the binary's one encoder and one writer; its progress lines
pass through), given the documents found here as files; inputs whose names the binary reads as
JSON Lines or compressed (.json, .jsonl, .gz, .zst, .parquet) stay with the Python writer, which
makes the same files. For JSON Lines, compressed input and many ranks, run `tessera data prepare`
itself (docs/data.md).

Progress goes to stderr every --log-seconds (0: after every document): documents, MB read, tokens
written, MB/s and tokens/s; then a summary line per phase and one per output file.

Exit status: 0 done, 2 bad input (no input, a path that does not exist, an empty split, a
vocabulary too small for the corpus), 1 I/O error.
"""
import argparse
import glob
import io
import math
import os
import re
import subprocess
import sys
import sysconfig
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tessera_data import (BYTE_EOT, BYTE_VOCAB, EXIT_IO, FORMAT, FORMAT_VERSION,  # noqa: E402
                          SENTENCEPIECE, SENTENCEPIECE_EOT, TOKENIZER_MODEL, ToolError, run_tool,
                          token_dtype)
import hf_tokenizer  # noqa: E402

FLUSH_BYTES = 32 << 20      # tokens gathered in memory before one write to the dataset
LOG_SECONDS = 2.0
ALIGN = 4096                # objects start on 4 KiB boundaries: O_DIRECT reads the tokens in place
ENCODE_BATCH_CHARS = 1 << 20   # BPE: text per thread handed to sentencepiece at once
CHUNK_CHARS = 1 << 14          # BPE: a longer document is encoded in pieces cut after a newline
                               # (sentencepiece is several times slower on long strings)
BPE_SEED = 1337
DOCUMENT_OFFSETS = "document_offsets"


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


class Progress:
    """Lines on stderr every `every` seconds (0: at every update) while a phase runs: documents
    and MB done of the total, tokens written, MB/s and tokens/s (not when the phase makes no
    tokens); then one summary line."""

    def __init__(self, phase, total_documents, total_bytes, every, counts_tokens=True):
        self.phase, self.total_documents, self.total_mb = phase, total_documents, total_bytes / 1e6
        self.every, self.counts_tokens = every, counts_tokens
        self.t0 = self.last = time.time()
        self.documents = self.bytes = self.tokens = 0

    def _rates(self, now):
        dt = max(now - self.t0, 1e-9)
        return self.bytes / 1e6 / dt, self.tokens / dt

    def update(self, documents, nbytes, tokens):
        self.documents, self.bytes, self.tokens = documents, nbytes, tokens
        now = time.time()
        if now - self.last < self.every:
            return
        self.last = now
        mbs, toks = self._rates(now)
        made = f"{tokens} tokens, " if self.counts_tokens else ""
        rate = f", {toks:.0f} tokens/s" if self.counts_tokens else ""
        print(f"prepare_data: {self.phase}: {documents}/{self.total_documents} documents, "
              f"{nbytes / 1e6:.1f}/{self.total_mb:.1f} MB, {made}{mbs:.1f} MB/s{rate}",
              file=sys.stderr, flush=True)

    def summary(self, extra=""):
        now = time.time()
        mbs, toks = self._rates(now)
        made = f", {self.tokens} tokens" if self.counts_tokens else ""
        rate = f", {toks:.0f} tokens/s" if self.counts_tokens else ""
        print(f"prepare_data: {self.phase} done: {self.documents} documents, "
              f"{self.bytes / 1e6:.1f} MB{made} in {now - self.t0:.2f} s ({mbs:.1f} MB/s{rate}){extra}",
              file=sys.stderr, flush=True)


def create_token_file(tmp, tokenizer, vocab_size, eot, num_documents):
    """An empty token file at tmp with the root attributes, in the order tessera_data.py lists."""
    import h5py

    try:
        f = h5py.File(tmp, "w", alignment_threshold=1, alignment_interval=ALIGN)
    except OSError as e:
        raise ToolError(f"{tmp}: cannot create ({e})", EXIT_IO) from None
    a = f.attrs
    a["format"] = np.bytes_(FORMAT)
    a["format_version"] = np.int64(FORMAT_VERSION)
    a["tokenizer"] = np.bytes_(tokenizer)
    a["vocab_size"] = np.int64(vocab_size)
    a["eot"] = np.int64(eot)
    a["num_documents"] = np.int64(num_documents)
    return f


def write_document_offsets(f, starts, num_tokens):
    """/document_offsets: int64, entry d = index in /tokens of document d's first token (its bos
    if any), then the token count; `tessera data prepare` writes the same."""
    assert len(starts) == f.attrs["num_documents"], (len(starts), f.attrs["num_documents"])
    f.create_dataset(DOCUMENT_OFFSETS, data=np.array(starts + [num_tokens], dtype=np.int64),
                     track_times=False)


def discard(f, *paths):
    """Closes f (if open) and removes the partial files."""
    try:
        if f is not None:
            f.close()
    except Exception:
        pass
    for p in paths:
        try:
            os.remove(p)
        except OSError:
            pass


class SplitWriter:
    """Byte tokenizer: one output file, a contiguous /tokens dataset of known size filled in order."""

    def __init__(self, path, num_tokens, num_documents):
        self.path, self.tmp = path, path + ".tmp"
        self.num_tokens, self.num_documents = num_tokens, num_documents
        self.pos, self.pending, self.pending_bytes = 0, [], 0
        self.starts = []
        self.t0 = time.time()
        self.f = create_token_file(self.tmp, "byte", BYTE_VOCAB, BYTE_EOT, num_documents)
        # No chunks, no filters: tessera reads the raw bytes at the dataset's file offset.
        self.ds = self.f.create_dataset("tokens", shape=(num_tokens,), dtype=token_dtype(BYTE_VOCAB),
                                        track_times=False)

    def add(self, data):
        # data: the document's bytes; its tokens are the byte values, then EOT.
        self.starts.append(self.pos + self.pending_bytes)
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
        write_document_offsets(self.f, self.starts, self.num_tokens)
        self.f.close()
        self.seconds = time.time() - self.t0

    def discard(self):
        discard(self.f, self.tmp)


class EncodedSplitWriter:
    """BPE tokenizer: one output file whose token count is known only at the end. The ids go to
    PATH.tokens.tmp as they come; close() copies them into a contiguous /tokens dataset and adds
    /tokenizer_model."""

    def __init__(self, path, num_documents, vocab_size, eot, model, tokenizer=SENTENCEPIECE, bos=-1):
        self.path, self.tmp, self.raw = path, path + ".tmp", path + ".tokens.tmp"
        self.num_documents, self.vocab_size, self.eot, self.model = num_documents, vocab_size, eot, model
        self.tokenizer, self.bos, self.at_start = tokenizer, bos, True
        self.dtype = token_dtype(vocab_size)
        self.num_tokens = 0
        self.starts = []
        self.f = None
        self.t0 = time.time()
        try:
            self.fh = open(self.raw, "wb")
        except OSError as e:
            raise ToolError(f"{self.raw}: cannot create ({e.strerror})", EXIT_IO) from None

    def add(self, ids, end_of_document):
        if self.at_start:
            self.starts.append(self.num_tokens)
        head = 1 if self.bos >= 0 and self.at_start else 0
        a = np.empty(head + len(ids) + (1 if end_of_document else 0), dtype=self.dtype)
        if head:
            a[0] = self.bos
        a[head:head + len(ids)] = ids
        if end_of_document:
            a[-1] = self.eot
        self.at_start = end_of_document
        self.fh.write(a.tobytes())
        self.num_tokens += a.size

    def close(self):
        self.fh.close()
        self.f = create_token_file(self.tmp, self.tokenizer, self.vocab_size, self.eot, self.num_documents)
        ds = self.f.create_dataset("tokens", shape=(self.num_tokens,), dtype=self.dtype, track_times=False)
        ids = np.memmap(self.raw, dtype=self.dtype, mode="r") if self.num_tokens else np.empty(0, self.dtype)
        assert ids.size == self.num_tokens, (ids.size, self.num_tokens)
        step = FLUSH_BYTES // ids.itemsize
        for at in range(0, self.num_tokens, step):
            ds[at:at + step] = ids[at:at + step]
        del ids
        write_document_offsets(self.f, self.starts, self.num_tokens)
        self.f.create_dataset(TOKENIZER_MODEL, data=np.frombuffer(self.model, dtype=np.uint8),
                              track_times=False)
        self.f.close()
        os.remove(self.raw)
        self.seconds = time.time() - self.t0

    def discard(self):
        try:
            self.fh.close()
        except Exception:
            pass
        discard(self.f, self.tmp, self.raw)


def read_document(path, size):
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as e:
        raise ToolError(f"{path}: cannot read ({e.strerror})", EXIT_IO)
    if len(data) != size:
        raise ToolError(f"{path}: changed size while being read ({size} -> {len(data)} bytes)", EXIT_IO)
    return data


def decode_text(data):
    """(text, valid): the document as UTF-8, invalid bytes replaced by U+FFFD."""
    try:
        return data.decode("utf-8"), True
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace"), False


def text_chunks(text):
    """text cut after newlines into pieces of about CHUNK_CHARS (sentencepiece encodes each the
    same as it would the whole: no piece holds a newline, training saw none)."""
    if len(text) <= CHUNK_CHARS:
        return [text]
    out, at = [], 0
    while len(text) - at > CHUNK_CHARS:
        cut = text.rfind("\n", at, at + CHUNK_CHARS)
        if cut < 0:
            cut = text.find("\n", at + CHUNK_CHARS)
            if cut < 0:
                break
        out.append(text[at:cut + 1])
        at = cut + 1
    out.append(text[at:])
    return out


BPE_OPTIONS = dict(
    model_type="bpe",
    byte_fallback=True,                  # every byte is a piece: any text is encodable
    normalization_rule_name="identity",  # no NFKC: decode(encode(text)) == text
    remove_extra_whitespaces=False,      # keep indentation and runs of spaces
    add_dummy_prefix=False,              # no space added before the text
    allow_whitespace_only_pieces=True,   # "▁▁▁▁" indentation pieces
    split_digits=True,
    unk_id=0, eos_id=SENTENCEPIECE_EOT, bos_id=-1, pad_id=-1,
    unk_piece="<unk>", eos_piece="<eot>",
    hard_vocab_limit=False,              # a small corpus may stop short of vocab_size
    num_threads=1, shuffle_input_sentence=False, input_sentence_size=0,
    max_sentence_length=1 << 16,
    minloglevel=2,
)


def train_bpe(paths, sizes, vocab_size, sample_mb, coverage, log_seconds):
    """The serialized sentencepiece BPE model trained on the lines of (a sample of) paths."""
    import sentencepiece as spm

    total = sum(sizes)
    cap = int(sample_mb * 1e6)
    stride = max(1, math.ceil(total / cap)) if cap > 0 else 1
    picked = list(range(0, len(paths), stride))
    sample_bytes = min(total, cap) if cap > 0 else total
    progress = Progress("BPE training" + (f" (1 in {stride} training documents)" if stride > 1 else ""),
                        len(picked), sum(sizes[i] for i in picked), log_seconds, counts_tokens=False)
    print(f"prepare_data: training a {vocab_size}-piece BPE tokenizer on about "
          f"{sample_bytes / 1e6:.1f} MB of {len(paths)} training documents", file=sys.stderr, flush=True)

    def lines():
        done = nbytes = 0
        for i in picked:
            text, _ = decode_text(read_document(paths[i], sizes[i]))
            for line in text.split("\n"):
                if cap > 0 and nbytes >= cap:     # a huge document: only its first part
                    break
                nbytes += len(line) + 1
                if line:
                    yield line
            done += 1
            progress.update(done, min(nbytes, progress.total_mb * 1e6), 0)
            if cap > 0 and nbytes >= cap:
                break

    spm.set_random_generator_seed(BPE_SEED)
    model = io.BytesIO()
    t0 = time.time()
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=lines(), model_writer=model, vocab_size=vocab_size,
                                       character_coverage=coverage, **BPE_OPTIONS)
    except RuntimeError as e:
        msg = str(e)
        m = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", msg)
        if m:
            raise ToolError(f"--vocab-size {vocab_size} is too small for this corpus: sentencepiece needs "
                            f"at least {int(m.group(2))} (256 byte pieces, <unk>, <eot> and the "
                            f"characters that cover {coverage} of the text): give a larger --vocab-size "
                            "or a smaller --character-coverage") from None
        raise ToolError(f"sentencepiece BPE training failed: {msg.splitlines()[-1] if msg else e}") from None
    progress.summary()
    blob = model.getvalue()
    sp = spm.SentencePieceProcessor(model_proto=blob)
    print(f"prepare_data: BPE tokenizer: {sp.get_piece_size()} pieces (asked for {vocab_size}), "
          f"eot {sp.eos_id()}, model {len(blob)} bytes, trained in {time.time() - t0:.2f} s",
          file=sys.stderr, flush=True)
    return blob, sp


def encode_bpe(sp, paths, sizes, is_val, writers, threads, log_seconds):
    """Encodes every document into its split's writer, in order, followed by <eot>. Returns the
    Progress and what its summary line should add."""
    progress = Progress("encode", len(paths), sum(sizes), log_seconds)
    pending = []          # (chunk text, writer, end of document, input bytes of the chunk)
    pending_chars = 0
    state = {"documents": 0, "bytes": 0, "tokens": 0, "not_utf8": 0}

    def flush():
        nonlocal pending, pending_chars
        if not pending:
            return
        ids = sp.encode([c[0] for c in pending], num_threads=threads)
        for (_, w, end, nbytes), one in zip(pending, ids):
            w.add(one, end)
            state["tokens"] += len(one) + (1 if end else 0)
            state["bytes"] += nbytes
            state["documents"] += end
        pending, pending_chars = [], 0
        progress.update(state["documents"], state["bytes"], state["tokens"])

    for p, size, v in zip(paths, sizes, is_val):
        text, valid = decode_text(read_document(p, size))
        state["not_utf8"] += not valid
        chunks = text_chunks(text)
        left = size
        for k, chunk in enumerate(chunks):
            last = k == len(chunks) - 1
            nbytes = left if last else min(left, len(chunk.encode("utf-8")))
            left -= nbytes
            pending.append((chunk, writers[v], last, nbytes))
            pending_chars += len(chunk)
            if pending_chars >= ENCODE_BATCH_CHARS * threads:
                flush()
        if log_seconds <= 0:
            flush()
    flush()
    bad = state["not_utf8"]
    return progress, (f"; {bad} documents were not valid UTF-8 (their invalid bytes became U+FFFD)"
                      if bad else "")


def encode_hf(tok, tessera, blob_path, paths, sizes, is_val, writers, threads, log_seconds):
    """Encodes every document with tessera's byte-level BPE encoder into its split's writer, in
    order. Returns the Progress and what its summary line should add."""
    progress = Progress("encode", len(paths), sum(sizes), log_seconds)
    with open(blob_path, "wb") as f:
        f.write(tok.blob)
    try:
        encoder = hf_tokenizer.Encoder(tessera, blob_path, threads)
        documents = (read_document(p, size) for p, size in zip(paths, sizes))
        nbytes = tokens = 0
        for i, ids in enumerate(encoder.run(documents)):
            writers[is_val[i]].add(ids, True)
            nbytes += sizes[i]
            tokens += len(ids) + 1 + (tok.bos is not None and tok.bos != tok.eot)
            progress.update(i + 1, nbytes, tokens)
    finally:
        os.remove(blob_path)
    print(f"prepare_data: tessera {encoder.summary}", file=sys.stderr, flush=True)
    return progress, ""


# Names `tessera data prepare` reads as JSON Lines or decompresses, where this tool takes every
# file as one document of its bytes: such inputs stay with the Python writer.
READ_OTHERWISE = re.compile(r"\.(jsonl|json|parquet)(\.gz|\.zst)?$|\.(gz|zst)$")
ARG_BYTES = 1 << 20         # paths handed to the binary on its command line, at most


def tessera_binary(explicit):
    """The tessera binary (--tessera, $TESSERA, bin/tessera of this checkout) or None."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = explicit or os.environ.get("TESSERA") or os.path.join(root, "bin", "tessera")
    return path if os.access(path, os.X_OK) else None


def prepare_with_tessera(args, tessera, tokenizer, paths, sizes):
    """Encodes and writes both files with `tessera data prepare` (the binary's one encoder and one
    writer; the files are those the Python writer makes, /document_offsets included). Its
    progress lines pass through. Returns the Progress to summarize, or None where it cannot take
    these inputs (a name it reads otherwise, too many paths, a binary without `data prepare`)."""
    if any(READ_OTHERWISE.search(os.path.basename(p)) for p in paths) or \
            sum(len(p) + 1 for p in paths) > ARG_BYTES:
        return None
    progress = Progress("encode" if tokenizer != "byte" else "byte tokens", len(paths), sum(sizes),
                        args.log_seconds)
    cmd = [tessera, "data", "prepare", *paths, "--out-dir", args.out_dir, "--tokenizer", tokenizer,
           "--val-every", str(args.val_every), "--threads", str(args.threads),
           "--log-seconds", str(args.log_seconds)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    last = None
    for line in proc.stderr:
        if last is not None:
            sys.stderr.write(last)
            sys.stderr.flush()
        last = line.decode("utf-8", "replace")
    rc = proc.wait()
    if rc != 0:
        if tokenizer == "byte" and last and "unknown subcommand 'prepare'" in last:
            return None             # an older build: the Python writer writes
        raise ToolError((last or f"tessera data prepare: exit {rc}").strip(), rc if rc in (1, 2) else EXIT_IO)
    if last:
        sys.stderr.write(last)
    import h5py
    for v in ("train", "val"):
        with h5py.File(os.path.join(args.out_dir, v + ".h5"), "r") as f:
            progress.documents += int(f.attrs["num_documents"])
            progress.tokens += f["tokens"].shape[0]
    progress.bytes = sum(sizes)
    return progress


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="*", metavar="FILES_OR_DIRS_OR_GLOBS")
    ap.add_argument("--stdlib", action="store_true", help="add the standard library's top-level *.py files")
    ap.add_argument("--out-dir", required=True, help="where train.h5 and val.h5 are written")
    ap.add_argument("--val-every", type=int, default=20, 
                    help="every N-th document goes to val.h5 (default 20)")
    ap.add_argument("--suffixes", default=".py,.txt,.md,.rst",
                    help="file suffixes taken from directories (default .py,.txt,.md,.rst)")
    ap.add_argument("--tokenizer", default="byte", metavar="byte|bpe|TOKENIZER",
                    help="byte (default): a token per byte; bpe: a sentencepiece BPE model trained here; "
                         "TOKENIZER: a Hugging Face byte-level BPE (tokenizer.json, vocab.json with "
                         "merges.txt, or a directory holding them)")
    ap.add_argument("--tessera", default=None,
                    help="TOKENIZER: the tessera binary that encodes (default: $TESSERA, else bin/tessera)")
    ap.add_argument("--vocab-size", type=int, default=None,
                    help="bpe: pieces in the vocabulary, <unk>, <eot> and 256 byte pieces included "
                         "(default 4096)")
    ap.add_argument("--bpe-sample-mb", type=float, default=100.0,
                    help="bpe: train on at most this many MB of the training documents (default 100; "
                         "0 = all)")
    ap.add_argument("--character-coverage", type=float, default=0.9995,
                    help="bpe: characters covering this fraction of the text get a piece of their own; "
                         "rarer ones are spelled in byte pieces (default 0.9995)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="bpe: encoding threads (default: every core; the ids do not depend on it)")
    ap.add_argument("--log-seconds", type=float, default=LOG_SECONDS,
                    help="seconds between progress lines on stderr (default 2; 0 = every document)")
    args = ap.parse_args()

    if args.val_every < 2:
        raise ToolError(f"--val-every {args.val_every}: must be at least 2 (else train.h5 would be empty)")
    if args.tokenizer != "bpe" and args.vocab_size is not None:
        raise ToolError(f"--vocab-size {args.vocab_size}: only for --tokenizer bpe (the byte tokenizer's "
                        f"vocabulary is {BYTE_VOCAB}, a tokenizer file's is its own)")
    hf = None
    if args.tokenizer not in ("byte", "bpe"):
        if args.threads < 1:
            raise ToolError("--threads must be >= 1")
        hf = hf_tokenizer.load(args.tokenizer)
        tessera = hf_tokenizer.find_tessera(args.tessera)
        hf_tokenizer.check_with_tessera(hf, tessera)
        print(f"prepare_data: tokenizer {args.tokenizer} ({hf.source}, {hf.kind}): {hf.vocab_size} ids, "
              f"eos {hf.eot}, bos {hf.bos}, pad {hf.pad}", file=sys.stderr, flush=True)
    vocab_size = 4096 if args.vocab_size is None else args.vocab_size
    if args.tokenizer == "bpe":
        if not 258 < vocab_size <= 1 << 31:
            raise ToolError(f"--vocab-size {vocab_size}: a BPE vocabulary holds the 256 byte pieces, "
                            "<unk> and <eot>, so it must be above 258")
        if args.bpe_sample_mb < 0 or not 0 < args.character_coverage <= 1 or args.threads < 1:
            raise ToolError("--bpe-sample-mb must be >= 0, --character-coverage in (0, 1], --threads >= 1")
        try:
            import sentencepiece  # noqa: F401
        except ImportError:
            raise ToolError("--tokenizer bpe needs the Python sentencepiece module "
                            "(Debian: apt-get install python3-sentencepiece)") from None
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
    out = {v: os.path.join(args.out_dir, "val.h5" if v else "train.h5") for v in (False, True)}
    if args.tokenizer != "bpe":
        binary = tessera if hf is not None else tessera_binary(args.tessera)
        progress = None
        if binary is not None:
            tokenizer = "byte"
            if hf is not None:
                tokenizer = os.path.join(args.out_dir, ".tokenizer.tmp.json")
                with open(tokenizer, "wb") as f:
                    f.write(hf.blob)
            try:
                progress = prepare_with_tessera(args, binary, tokenizer, paths, sizes)
            finally:
                if hf is not None:
                    os.remove(tokenizer)
        if progress is not None:
            progress.summary(" (tessera data prepare)")
            for v, n in (("train", n_train), ("val", n_val)):
                print(f"prepare_data: {out[v == 'val']}: {n} documents", file=sys.stderr)
            return 0
    writers = {}
    try:
        if hf is not None:
            bos = hf.bos if hf.bos is not None and hf.bos != hf.eot else -1
            for v, n in ((False, n_train), (True, n_val)):
                writers[v] = EncodedSplitWriter(out[v], n, hf.vocab_size, hf.eot, hf.blob,
                                                hf_tokenizer.HF_BPE, bos)
            blob_path = os.path.join(args.out_dir, ".tokenizer.tmp.json")
            progress, extra = encode_hf(hf, tessera, blob_path, paths, sizes, is_val, writers,
                                        args.threads, args.log_seconds)
        elif args.tokenizer == "bpe":
            train = [i for i, v in enumerate(is_val) if not v]
            model, sp = train_bpe([paths[i] for i in train], [sizes[i] for i in train], vocab_size,
                                  args.bpe_sample_mb, args.character_coverage, args.log_seconds)
            for v, n in ((False, n_train), (True, n_val)):
                writers[v] = EncodedSplitWriter(out[v], n, sp.get_piece_size(), sp.eos_id(), model)
            progress, extra = encode_bpe(sp, paths, sizes, is_val, writers, args.threads, args.log_seconds)
        else:
            tokens = {False: 0, True: 0}
            for s, v in zip(sizes, is_val):
                tokens[v] += s + 1
            writers[False] = SplitWriter(out[False], tokens[False], n_train)
            writers[True] = SplitWriter(out[True], tokens[True], n_val)
            progress = Progress("byte tokens", len(paths), sum(sizes), args.log_seconds)
            done_bytes = done_tokens = 0
            for i, (p, size, v) in enumerate(zip(paths, sizes, is_val)):
                writers[v].add(read_document(p, size))
                done_bytes += size
                done_tokens += size + 1
                progress.update(i + 1, done_bytes, done_tokens)
            extra = ""
        for v in (False, True):
            writers[v].close()
        progress.summary(extra)
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
