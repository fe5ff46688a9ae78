#!/usr/bin/python3
"""tessera's token files and sample order, in Python: the one place the tools define them.

tessera (C++) must produce exactly the same order; the functions here are the specification the
parity test holds it to. Imported by prepare_data.py, reference_gpt.py and compare_parity.py.

Token file (HDF5): dataset /tokens, 1-D uint16 (uint32 when vocab_size > 65536), contiguous;
root attributes format="tessera-tokens", format_version=1, tokenizer, vocab_size, eot,
num_documents. Documents follow each other, each ended by the eot token. The tokenizer is
  "byte"           token = byte value 0..255, eot = 256, vocab_size = 257;
  "sentencepiece"  a sentencepiece model (BPE, byte fallback, identity normalization, no dummy
                   prefix: decode(encode(text)) == text for UTF-8 text) serialized as a ModelProto
                   in the 1-D uint8 dataset /tokenizer_model; vocab_size = its piece count, eot =
                   its eos id. tessera encodes prompts and decodes samples with the same model and
                   copies it into every checkpoint (/tokenizer/model).

Sample order: with T = seq_len and N tokens there are n = (N - 1) // T windows; window w is
tokens[w*T : w*T + T + 1]. Global sample g is in epoch g // n at position g % n and uses window
permute(g % n, n, seed, g // n), a seeded bijection of [0, n) (4-round Feistel + cycle walking).
Training step s takes global samples [next_sample + s*B, next_sample + (s+1)*B) in micro-batches
of b consecutive samples; validation takes windows 0, 1, 2, ... of the val file in order.

Usage:
  tessera_data.py selftest
  tessera_data.py order --n N [--seed S] [--epoch E] [--count K]   # windows for positions 0..K-1
  tessera_data.py info FILE.h5                                       # describe a token file
  tessera_data.py decode FILE.h5 [--start S] [--count N]             # tokens S..S+N-1 as text
"""
import argparse
import math
import os
import sys

import numpy as np

FORMAT = "tessera-tokens"
FORMAT_VERSION = 1
BYTE_VOCAB = 257
BYTE_EOT = 256
SENTENCEPIECE = "sentencepiece"
SENTENCEPIECE_EOT = 1                  # the eos id prepare_data.py gives its BPE models (<eot>)
TOKENIZER_MODEL = "tokenizer_model"    # the dataset holding a sentencepiece model

MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


# ---------------------------------------------------------------------------------------------
# Errors: every tool prints one line "tool: file: reason" and exits 2 (bad input) or 1 (I/O).

EXIT_IO = 1
EXIT_BAD_INPUT = 2


class ToolError(Exception):
    """A problem the user can fix; `code` is the exit status (2 bad input, 1 I/O)."""

    def __init__(self, message, code=EXIT_BAD_INPUT):
        super().__init__(message)
        self.code = code


def run_tool(main):
    """Calls main() and turns user errors into one stderr line and an exit status, no traceback."""
    prog = os.path.basename(sys.argv[0]) or "tessera-tool"
    try:
        code = main()
    except ToolError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        code = e.code
    except OSError as e:
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"{prog}: {where}{e.strerror or e}", file=sys.stderr)
        code = EXIT_IO
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        code = 130
    sys.exit(code or 0)


def open_h5(path, mode="r"):
    """h5py.File with the path in the error message (h5py's own often lacks it)."""
    import h5py

    if mode == "r" and not os.path.exists(path):
        raise ToolError(f"{path}: no such file", EXIT_IO)
    try:
        return h5py.File(path, mode)
    except OSError as e:
        code = EXIT_BAD_INPUT if "signature" in str(e) else EXIT_IO
        raise ToolError(f"{path}: cannot open as HDF5 ({e})", code) from None


def attr_str(attrs, key, where):
    """A string attribute, whether h5py hands back bytes, numpy bytes or str."""
    if key not in attrs:
        raise ToolError(f"{where}: missing attribute '{key}'")
    v = attrs[key]
    if isinstance(v, np.ndarray):
        v = v.reshape(-1)[0] if v.size == 1 else v
    if isinstance(v, (bytes, np.bytes_)):
        return bytes(v).decode("utf-8", errors="replace").rstrip("\0")
    if isinstance(v, str):
        return v
    raise ToolError(f"{where}: attribute '{key}' is not a string")


def attr_int(attrs, key, where, default=None):
    """An integer attribute (scalar or 1-element array)."""
    if key not in attrs:
        if default is not None:
            return default
        raise ToolError(f"{where}: missing attribute '{key}'")
    v = np.asarray(attrs[key])
    if v.size != 1 or not np.issubdtype(v.dtype, np.integer):
        raise ToolError(f"{where}: attribute '{key}' is not an integer")
    return int(v.reshape(-1)[0])


# ---------------------------------------------------------------------------------------------
# Token files.

def token_dtype(vocab_size):
    return np.uint16 if vocab_size <= 65536 else np.uint32


def read_token_file(path):
    """Returns (tokens as a 1-D numpy array, dict of root attributes). Validates the format."""
    with open_h5(path) as f:
        fmt = attr_str(f.attrs, "format", path)
        if fmt != FORMAT:
            raise ToolError(f"{path}: format is '{fmt}', expected '{FORMAT}'")
        version = attr_int(f.attrs, "format_version", path)
        if version != FORMAT_VERSION:
            raise ToolError(f"{path}: format_version {version} is not supported (expected {FORMAT_VERSION})")
        meta = {
            "tokenizer": attr_str(f.attrs, "tokenizer", path),
            "vocab_size": attr_int(f.attrs, "vocab_size", path),
            "eot": attr_int(f.attrs, "eot", path),
            "num_documents": attr_int(f.attrs, "num_documents", path),
        }
        meta["tokenizer_model"] = bytes(f[TOKENIZER_MODEL][...].tobytes()) if TOKENIZER_MODEL in f else None
        if meta["tokenizer"] == SENTENCEPIECE and meta["tokenizer_model"] is None:
            raise ToolError(f"{path}: tokenizer '{SENTENCEPIECE}' without its model /{TOKENIZER_MODEL}")
        if "tokens" not in f:
            raise ToolError(f"{path}: no dataset /tokens")
        ds = f["tokens"]
        if ds.ndim != 1 or ds.dtype not in (np.dtype(np.uint16), np.dtype(np.uint32)):
            raise ToolError(f"{path}: /tokens must be 1-D uint16 or uint32, is {ds.dtype} {ds.shape}")
        tokens = ds[...]
    if tokens.size and int(tokens.max()) >= meta["vocab_size"]:
        raise ToolError(f"{path}: token {int(tokens.max())} >= vocab_size {meta['vocab_size']}")
    return tokens, meta


def decode_tokens(meta, ids, where="token file"):
    """Text of token ids with the file's tokenizer (eot decodes to nothing; a byte file's bytes
    are read as UTF-8 with U+FFFD for what is not)."""
    ids = [int(i) for i in ids]
    if meta["tokenizer"] == "byte":
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
    if meta["tokenizer"] == SENTENCEPIECE:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_proto=meta["tokenizer_model"])
        return sp.decode([i for i in ids if i != meta["eot"]])
    raise ToolError(f"{where}: tokenizer '{meta['tokenizer']}' cannot be decoded here")


def num_windows(num_tokens, seq_len):
    """n = (N - 1) // T: every window has T inputs and T targets (T + 1 tokens)."""
    return max(0, (num_tokens - 1) // seq_len)


# ---------------------------------------------------------------------------------------------
# The permutation. Scalar versions are the literal specification; the numpy versions must agree.

def mix64(x):
    """splitmix64 finaliser on a Python int in [0, 2^64)."""
    x = ((x ^ (x >> 30)) * _M1) & MASK
    x = ((x ^ (x >> 27)) * _M2) & MASK
    return x ^ (x >> 31)


def _feistel_params(n, seed, epoch):
    bits = max(2, (n - 1).bit_length())
    half = (bits + 1) // 2
    key = mix64(((seed & MASK) * _GOLDEN + epoch + 1) & MASK)
    return half, (1 << half) - 1, key


def permute(j, n, seed, epoch):
    """Window of position j in epoch `epoch`: a bijection of [0, n) (Feistel + cycle walking)."""
    if not 0 <= j < n:
        raise ValueError(f"permute: j={j} outside [0, {n})")
    half, hmask, key = _feistel_params(n, seed, epoch)
    x = j
    while True:
        left, right = x >> half, x & hmask
        for r in range(4):
            f = mix64(right ^ ((key + r) & MASK)) & hmask
            left, right = right, left ^ f
        x = (left << half) | right
        if x < n:
            return x


def _mix64_np(x):
    # uint64 arrays: numpy multiplication wraps mod 2^64, as the spec wants.
    x = (x ^ (x >> np.uint64(30))) * np.uint64(_M1)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(_M2)
    return x ^ (x >> np.uint64(31))


def permute_np(j, n, seed, epoch):
    """permute() on an array of positions j (any int dtype, all in [0, n)); returns int64."""
    j = np.asarray(j, dtype=np.int64)
    if j.size and (j.min() < 0 or j.max() >= n):
        raise ValueError(f"permute_np: positions outside [0, {n})")
    half, hmask, key = _feistel_params(n, seed, epoch)
    u_half, u_hmask = np.uint64(half), np.uint64(hmask)
    round_keys = [np.uint64((key + r) & MASK) for r in range(4)]
    x = j.astype(np.uint64).reshape(-1)
    todo = np.arange(x.size)                 # elements still walking the cycle
    while todo.size:
        v = x[todo]
        left, right = v >> u_half, v & u_hmask
        for rk in round_keys:
            f = _mix64_np(right ^ rk) & u_hmask
            left, right = right, left ^ f
        v = (left << u_half) | right
        x[todo] = v
        todo = todo[v >= np.uint64(n)]
    return x.astype(np.int64).reshape(j.shape)


def sample_windows(first_sample, count, n, seed):
    """Window index of each global sample first_sample .. first_sample + count - 1 (int64[count])."""
    if n <= 0:
        raise ValueError("sample_windows: no windows")
    g = np.arange(first_sample, first_sample + count, dtype=np.int64)
    epoch, pos = g // n, g % n
    out = np.empty(count, dtype=np.int64)
    for e in np.unique(epoch):               # a batch spans at most a few epochs
        sel = epoch == e
        out[sel] = permute_np(pos[sel], n, seed, int(e))
    return out


def gather_windows(tokens, windows, seq_len):
    """(inputs, targets), each int64[len(windows), T], from window indices."""
    windows = np.asarray(windows, dtype=np.int64)
    idx = windows[:, None] * seq_len + np.arange(seq_len + 1, dtype=np.int64)[None, :]
    w = tokens[idx].astype(np.int64)
    return w[:, :-1], w[:, 1:]


# ---------------------------------------------------------------------------------------------
# Blends (src/io/dataset.cpp, Blend): the literal specification, for checking the C++ order.

BLEND_BLOCK = 4096


def fnv1a64(name):
    h = 0xCBF29CE484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001B3) & MASK
    return h


def stream_key(seed, name):
    return mix64(mix64(seed & MASK) ^ fnv1a64(name))


def blend_counts(weights):
    """Samples of each source per block of BLEND_BLOCK: largest remainder, at least 1 each."""
    total = 0.0
    for w in weights:
        total += w
    quota = [w / total * BLEND_BLOCK for w in weights]
    counts = [max(1, int(math.floor(q))) for q in quota]
    rem = lambda i: quota[i] - counts[i]                      # noqa: E731
    while sum(counts) < BLEND_BLOCK:
        i = max(range(len(counts)), key=lambda i: (rem(i), -i))   # the first largest
        counts[i] += 1
    while sum(counts) > BLEND_BLOCK:
        i = min(range(len(counts)), key=lambda i: (counts[i] <= 1, rem(i), i))
        counts[i] -= 1
    return counts


def blend_sample(g, weights, windows, seed):
    """(source, window) of global sample g of a blend of sources with these weights and windows."""
    if len(weights) == 1:
        return 0, permute(g % windows[0], windows[0], seed, g // windows[0])
    counts = blend_counts(weights)
    starts = [sum(counts[:i]) for i in range(len(counts))]
    block, j = divmod(g, BLEND_BLOCK)
    p = permute(j, BLEND_BLOCK, stream_key(seed, "blend"), block)
    s = max(i for i in range(len(starts)) if starts[i] <= p)
    k = block * counts[s] + p - starts[s]
    n = windows[s]
    return s, permute(k % n, n, mix64((stream_key(seed, "source") + s) & MASK), k // n)


def micro_batch_size(batch_size, micro_batch):
    b = micro_batch if micro_batch > 0 else batch_size
    if batch_size % b != 0:
        raise ToolError(f"train.micro_batch = {b} does not divide train.batch_size = {batch_size}")
    return b


def train_step_windows(step, batch_size, micro_batch, n, seed, next_sample=0):
    """Window indices of training step `step` (0-based, counted from the sample next_sample),
    as a list of int64 arrays, one per micro-batch of b consecutive samples."""
    b = micro_batch_size(batch_size, micro_batch)
    w = sample_windows(next_sample + step * batch_size, batch_size, n, seed)
    return [w[i:i + b] for i in range(0, batch_size, b)]


def train_step_batches(tokens, seq_len, step, batch_size, micro_batch, seed, next_sample=0):
    """[(inputs, targets)] per micro-batch of training step `step`; each int64[b, T]."""
    n = num_windows(tokens.size, seq_len)
    if n == 0:
        raise ToolError(f"{tokens.size} tokens are too few for one window of seq_len {seq_len}")
    return [gather_windows(tokens, w, seq_len)
            for w in train_step_windows(step, batch_size, micro_batch, n, seed, next_sample)]


def eval_batches(tokens, seq_len, micro_batch, num_batches):
    """Validation micro-batches: windows 0, 1, 2, ... in file order, b per batch, at most
    num_batches of them (fewer when the file runs out; a short last batch is dropped)."""
    n = num_windows(tokens.size, seq_len)
    out = []
    for i in range(num_batches):
        if (i + 1) * micro_batch > n:
            break
        out.append(gather_windows(tokens, np.arange(i * micro_batch, (i + 1) * micro_batch), seq_len))
    return out


# ---------------------------------------------------------------------------------------------
# Self-test and command line.

def self_test(verbose=True):
    """Checks permute is a bijection for several n and that the numpy version agrees."""
    failures = 0
    for n in [1, 2, 3, 4, 5, 7, 8, 16, 17, 100, 255, 256, 257, 1000, 4097, 65536, 100003]:
        for seed, epoch in [(0, 0), (1337, 0), (1337, 3), (MASK, 1)]:
            p = permute_np(np.arange(n), n, seed, epoch)
            ok = np.array_equal(np.sort(p), np.arange(n))
            check = np.linspace(0, n - 1, num=min(n, 50)).astype(np.int64)
            ok = ok and all(permute(int(j), n, seed, epoch) == int(p[j]) for j in check)
            if not ok:
                failures += 1
                print(f"FAIL permute n={n} seed={seed} epoch={epoch}", file=sys.stderr)
    # A shuffle, not the identity, and a different one per epoch.
    p0, p1 = permute_np(np.arange(1000), 1000, 1337, 0), permute_np(np.arange(1000), 1000, 1337, 1)
    if np.array_equal(p0, np.arange(1000)) or np.array_equal(p0, p1):
        failures += 1
        print("FAIL permute is the identity or does not change with the epoch", file=sys.stderr)
    # Global samples crossing an epoch boundary.
    n = 10
    w = sample_windows(5, 20, n, 7)
    expect = [permute(g % n, n, 7, g // n) for g in range(5, 25)]
    if w.tolist() != expect:
        failures += 1
        print("FAIL sample_windows across epochs", file=sys.stderr)
    # Windows overlap by one token: targets are inputs shifted by one.
    toks = np.arange(101, dtype=np.uint16)
    x, y = gather_windows(toks, np.array([0, 3]), 10)
    if x[1, 0] != 30 or y[1, -1] != 40 or not np.array_equal(x[:, 1:], y[:, :-1]):
        failures += 1
        print("FAIL gather_windows", file=sys.stderr)
    # Blend counts: exact per block, the rounding of the weights, every source at least once.
    for weights in ([0.7, 0.3], [0.6, 0.3, 0.1], [1.0, 1e-9, 1e-9], [1.0] * 7):
        c = blend_counts(weights)
        if sum(c) != BLEND_BLOCK or min(c) < 1 or any(
                abs(x - w / sum(weights) * BLEND_BLOCK) > len(c) for x, w in zip(c, weights)):
            failures += 1
            print(f"FAIL blend_counts {weights}: {c}", file=sys.stderr)
    if verbose:
        print("tessera_data selftest: " + ("PASS" if failures == 0 else f"FAIL ({failures})"))
    return failures == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("selftest", help="check the permutation and window code")
    o = sub.add_parser("order", help="print the window of positions 0..count-1 of one epoch")
    o.add_argument("--n", type=int, required=True, help="number of windows")
    o.add_argument("--seed", type=int, default=1337)
    o.add_argument("--epoch", type=int, default=0)
    o.add_argument("--count", type=int, default=0, help="how many positions (0 = all n)")
    b = sub.add_parser("blend", help="print 'g source window' of global samples of a blend")
    b.add_argument("--weights", required=True, help="comma-separated, as data.train gives them")
    b.add_argument("--windows", required=True, help="comma-separated windows of each source")
    b.add_argument("--seed", type=int, default=1337)
    b.add_argument("--first", type=int, default=0)
    b.add_argument("--count", type=int, default=16)
    i = sub.add_parser("info", help="describe a token file")
    i.add_argument("file")
    i.add_argument("--seq-len", type=int, default=0, help="also print the number of windows")
    d = sub.add_parser("decode", help="print tokens of a token file as text, with its tokenizer")
    d.add_argument("file")
    d.add_argument("--start", type=int, default=0)
    d.add_argument("--count", type=int, default=200)
    args = ap.parse_args()

    if args.cmd == "selftest":
        return 0 if self_test() else 1
    if args.cmd == "order":
        if args.n <= 0 or args.seed < 0 or args.epoch < 0 or args.count < 0:
            raise ToolError("order: --n must be positive, --seed, --epoch and --count non-negative")
        count = min(args.count or args.n, args.n)
        print(" ".join(str(v) for v in permute_np(np.arange(count), args.n, args.seed, args.epoch)))
        return 0
    if args.cmd == "blend":
        weights = [float(w) for w in args.weights.split(",")]
        windows = [int(n) for n in args.windows.split(",")]
        if len(weights) != len(windows) or min(weights) <= 0 or min(windows) <= 0:
            raise ToolError("blend: --weights and --windows need as many positive entries")
        for g in range(args.first, args.first + args.count):
            print(g, *blend_sample(g, weights, windows, args.seed))
        return 0
    tokens, meta = read_token_file(args.file)
    if args.cmd == "decode":
        if args.start < 0 or args.count < 0:
            raise ToolError("decode: --start and --count must be non-negative")
        sys.stdout.write(decode_tokens(meta, tokens[args.start:args.start + args.count], args.file))
        sys.stdout.write("\n")
        return 0
    model = meta["tokenizer_model"]
    print(f"{args.file}: {tokens.size} tokens ({tokens.dtype}), {meta['num_documents']} documents, "
          f"tokenizer {meta['tokenizer']}, vocab_size {meta['vocab_size']}, eot {meta['eot']}"
          + (f", model {len(model)} bytes" if model is not None else ""))
    if args.seq_len > 0:
        print(f"windows of seq_len {args.seq_len}: {num_windows(tokens.size, args.seq_len)}")
    return 0


if __name__ == "__main__":
    run_tool(main)
