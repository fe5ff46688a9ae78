#!/usr/bin/env bash
# `tessera data prepare` end to end on a small generated corpus of .jsonl, .jsonl.gz (two gzip
# members), .jsonl.zst (large enough that its decoded stream is split between ranks), .txt and .md
# (non-ASCII and non-UTF-8 bytes, empty text, extra keys, blank and malformed lines): the files of
# 1, 2 and 4 ranks (different --threads) equal in every dataset and attribute; the tokens those of
# `tessera data encode` of each document, by a reference reading of the corpus in Python (byte
# tokenizer, and GPT-2's byte-level BPE from js-tiktoken's ranks where npm is present);
# /document_offsets against the eot positions; the train/val rule; the same files as
# tools/data/prepare_data.py's for plain text; a zero-document share; bad input (one line, the
# exit status, no file under the final name).
source "$(dirname "$0")/lib.sh"
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1
prep() { local n=$1; shift; timeout 120 $MPIEXEC -n "$n" "$TESSERA" data prepare "$@"; }

# The corpus, and the reference documents in the order the inputs are read (sorted absolute
# paths; JSON Lines a document per line with a "text" string, the rest a document per file).
"$PYTHON" - "$WORK/corpus" <<'PY' || { fail "writing the corpus"; finish; }
import gzip, json, os, random, subprocess, sys
d = sys.argv[1]; os.makedirs(d)
rnd = random.Random(7)
words = ["alpha", "beta", "gamma", "délta", "εψιλον", "жук", "数据", "😀", "def", "return", "\t", "  "]
def text(n): return " ".join(rnd.choice(words) for _ in range(n)) + ("\n" if rnd.random() < 0.5 else "")
with open(f"{d}/a.jsonl", "wb") as f:
    for i in range(12):
        f.write(json.dumps({"id": i, "text": text(20), "meta": {"x": [1, 2]}}).encode() + b"\n")
    f.write(b'{"text": ""}\n')                       # an empty document: just eot
    f.write(b"\n")                                   # blank: no document
    f.write(b'{"text": "broken\n')                   # malformed (line 15)
    f.write(b'{"text": "raw \xff byte"}\n')          # malformed: not UTF-8 (line 16)
    f.write(json.dumps({"text": "no newline at end", "n": None}, ensure_ascii=False).encode())
with open(f"{d}/b.jsonl.gz", "wb") as f:             # two gzip members, one after the other
    for part in (range(0, 5), range(5, 9)):
        f.write(gzip.compress(b"".join(json.dumps({"text": text(30)}, ensure_ascii=False).encode() + b"\n"
                                       for _ in part)))
with open(f"{d}/c.jsonl", "wb") as f:                # ~1.2 MB decoded, ~0.4 MB compressed
    for i in range(3000):
        f.write(json.dumps({"text": text(rnd.randint(5, 120))}, ensure_ascii=rnd.random() < 0.5).encode() + b"\n")
subprocess.run(["zstd", "-q", "--rm", "-3", f"{d}/c.jsonl"], check=True)
open(f"{d}/d.txt", "wb").write(b"plain text \xff\xfe not UTF-8 \xf0\x9f\x98 truncated emoji\n")
open(f"{d}/e.md", "wb").write("# Überschrift\n\nμ-text\n".encode())
open(f"{d}/skipped.bin", "wb").write(b"not taken from a directory")
PY
"$PYTHON" - "$WORK/corpus" "$WORK/docs.bin" <<'PY' || { fail "reference documents"; finish; }
import gzip, json, os, struct, subprocess, sys
d, out = sys.argv[1], sys.argv[2]
docs = []
for name in sorted(os.listdir(d)):
    p = os.path.join(d, name)
    if name.endswith(".bin"): continue
    data = open(p, "rb").read()
    if name.endswith(".gz"): data = gzip.decompress(data)
    if name.endswith(".zst"): data = subprocess.run(["zstd", "-dc", p], capture_output=True, check=True).stdout
    if ".jsonl" not in name:
        docs.append(data); continue
    for line in data.split(b"\n"):
        if not line.strip(b" \t\r"): continue
        try: docs.append(json.loads(line.decode("utf-8"))["text"].encode("utf-8"))
        except Exception: pass
with open(out, "wb") as f:
    for doc in docs: f.write(struct.pack("<Q", len(doc)) + doc)
print(len(docs), "documents")
PY

# Every dataset (values and types) and every attribute (values, types, order) of two files equal.
same_files() {
  "$PYTHON" - "$@" <<'PY'
import h5py, numpy as np, sys
def describe(p):
    f = h5py.File(p, "r")
    sets = {k: (f[k].dtype.str, f[k].shape, f[k].chunks, f[k].compression, f[k][()].tobytes()) for k in f}
    attrs = [(k, f.attrs[k].tobytes() if hasattr(f.attrs[k], "tobytes") else f.attrs[k],
              f.attrs.get_id(k).get_type().get_class(), f.attrs.get_id(k).get_type().get_size()) for k in f.attrs]
    return sets, attrs, f["tokens"].id.get_offset() % 4096
a = describe(sys.argv[1])
for p in sys.argv[2:]:
    assert describe(p) == a, p
PY
}

out=()
for run in "1 1" "2 2" "4 1"; do
  read -r ranks threads <<<"$run"
  set -- "$ranks" "$threads"
  if prep "$1" corpus --out-dir "r$1" --val-every 3 --threads "$2" --log-seconds 0 >"r$1.out" 2>"r$1.err"; then
    out+=("r$1")
  else
    fail "prepare on $1 ranks x $2 threads (exit $?)"; sed 's/^/    /' "r$1.err" | head -5
  fi
done
if [ ${#out[@]} -eq 3 ] && same_files r1/train.h5 r2/train.h5 r4/train.h5 && same_files r1/val.h5 r2/val.h5 r4/val.h5 &&
   cmp -s r1/train.h5 r4/train.h5 && cmp -s r1/val.h5 r2/val.h5; then
  pass "1, 2 and 4 ranks (1, 2, 1 threads): the same datasets and attributes in train.h5 and val.h5, the same bytes ($(grep -o '[0-9]* documents, [0-9.]* MB of input' r4.err | head -1))"
else
  fail "files differ between rank counts"
fi

# Tokens and the index against the reference documents, each encoded by `tessera data encode`.
check_tokens() {  # check_tokens DIR TOKENIZER(byte|token file) VAL_EVERY
  "$PYTHON" - "$TESSERA" "$WORK/docs.bin" "$@" <<'PY'
import h5py, json, numpy as np, struct, subprocess, sys
tessera, docs_bin, d, tok, val_every = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
raw = open(docs_bin, "rb").read()
if tok == "byte":
    docs, at = [], 0
    while at < len(raw):
        n = struct.unpack_from("<Q", raw, at)[0]; docs.append(list(raw[at + 8:at + 8 + n])); at += 8 + n
    eot, bos = 256, None
else:
    out = subprocess.run([tessera, "data", "encode", tok, "--stream"], input=raw, capture_output=True, check=True).stdout
    docs, at = [], 0
    while at < len(out):
        n = struct.unpack_from("<Q", out, at)[0]
        docs.append(list(np.frombuffer(out, "<u4", n, at + 8))); at += 8 + 4 * n
    t = h5py.File(tok, "r")
    eot = int(t.attrs["eot"])
    special = json.loads(t["tokenizer_model"][()].tobytes()).get("tessera", {})
    bos = special.get("bos_token_id")
    bos = None if bos is None or bos == eot else int(bos)
for split, val in (("train", False), ("val", True)):
    f = h5py.File(f"{d}/{split}.h5", "r")
    mine = [doc for i, doc in enumerate(docs) if (i % val_every == val_every - 1) == val]
    head = [] if bos is None else [bos]
    want = np.array([t for doc in mine for t in head + doc + [eot]], dtype=np.int64)
    got = f["tokens"][()].astype(np.int64)
    assert got.shape == want.shape and (got == want).all(), (split, got.shape, want.shape)
    off = f["document_offsets"][()]
    assert off.dtype == np.int64 and len(off) == f.attrs["num_documents"] + 1 == len(mine) + 1
    assert off[0] == 0 and off[-1] == len(got) and (got[off[1:] - 1] == eot).all()
    assert (np.diff(off) == [len(head) + len(doc) + 1 for doc in mine]).all()
    assert bos is None or (got[off[:-1]] == bos).all()
    assert f["tokens"].dtype == (np.uint16 if f.attrs["vocab_size"] <= 65536 else np.uint32)
print(len(docs))
PY
}
# The summary counts the documents that are not UTF-8 (d.txt: 0xFF 0xFE and a truncated emoji;
# the JSON line with a raw 0xFF is a malformed line, not a document).
if grep -q "; 1 documents not UTF-8 (encoded as bytes" r1.err && grep -q "; 1 documents not UTF-8" r4.err; then
  pass "the summary counts 1 document that is not UTF-8, on 1 and 4 ranks"
else
  fail "no count of documents that are not UTF-8"; grep "prepare: [0-9]* documents" r1.err r4.err
fi
if n=$(check_tokens r2 byte 3); then
  pass "byte tokens = each reference document's bytes + eot, $n documents; document_offsets at the eots; document i in val.h5 iff i % 3 == 2"
else
  fail "byte tokens against the reference"
fi
if grep -q "a.jsonl:15: not JSON" r4.err && grep -q "a.jsonl:16: not JSON" r4.err &&
   grep -q "2 malformed lines skipped (of 3[0-9]* JSON lines)" r4.err; then
  pass "malformed lines counted and named with file and line, on 4 ranks: $(grep -c 'malformed line skipped' r4.err) lines"
else
  fail "malformed-line report"; sed 's/^/    /' r4.err | head -8
fi
if grep -Eq '^prepare: rank 0 of 4: [0-9]+ documents, [0-9.]+ MB of text \([0-9]+% of its share\), [0-9]+ tokens, [0-9]+ tokens/s, ETA [0-9]+ s$' r4.err; then
  pass "progress lines on rank 0: $(grep -m1 '^prepare: rank 0' r4.err)"
else
  fail "no progress line"; head -3 r4.err
fi

# A GPT-2-like tokenizer from js-tiktoken's ranks, as a token file prepare_data.py makes.
if NPM=$(npm_reference) && (cd "$NPM" && node "$ROOT/tests/integration/tiktoken_ref.mjs" files gpt2 "$WORK/gpt2") >/dev/null 2>&1 &&
   mkdir -p tiny && printf 'a\n' >tiny/a.txt && printf 'b\n' >tiny/b.txt &&
   "$PYTHON" "$ROOT/tools/data/prepare_data.py" tiny --tokenizer gpt2/tokenizer.json --val-every 2 --out-dir gtok >/dev/null 2>&1; then
  if prep 1 corpus --out-dir g1 --val-every 4 --tokenizer gtok/val.h5 --threads 2 >g1.err 2>&1 &&
     prep 3 corpus --out-dir g3 --val-every 4 --tokenizer gtok/val.h5 --threads 1 >g3.err 2>&1 &&
     same_files g1/train.h5 g3/train.h5 && same_files g1/val.h5 g3/val.h5 && n=$(check_tokens g3 gtok/val.h5 4); then
    pass "GPT-2 byte-level BPE: 1 and 3 ranks equal; tokens = tessera data encode --stream of each of $n documents + eot"
  else
    fail "GPT-2 tokenizer"; tail -3 g1.err g3.err
  fi
  # A LLaMA 3-kind tokenizer over cl100k's ranks: uint32 ids, a bos before every document.
  if (cd "$NPM" && node "$ROOT/tests/integration/tiktoken_ref.mjs" files cl100k_base "$WORK/llama3") >/dev/null 2>&1 &&
     "$PYTHON" "$ROOT/tools/data/prepare_data.py" tiny --tokenizer llama3/tokenizer.json --val-every 2 --out-dir ltok >/dev/null 2>&1 &&
     prep 1 corpus --out-dir l1 --val-every 5 --tokenizer ltok/val.h5 --threads 2 >l1.err 2>&1 &&
     prep 2 corpus --out-dir l2 --val-every 5 --tokenizer ltok/val.h5 --threads 1 >l2.err 2>&1 &&
     same_files l1/train.h5 l2/train.h5 && same_files l1/val.h5 l2/val.h5 && n=$(check_tokens l2 ltok/val.h5 5); then
    pass "LLaMA 3-kind BPE (cl100k ranks): uint32 ids, bos + ids + eos per document; 1 and 2 ranks equal; $n documents as data encode gives them"
  else
    fail "LLaMA 3-kind tokenizer"; tail -3 l1.err l2.err
  fi
else
  echo "SKIP GPT-2 and LLaMA 3-kind tokenizers: no npm to install js-tiktoken (make deps-test)"
fi

# Plain text: the same files as tools/data/prepare_data.py writes; and a share with no document.
mkdir -p plain && "$PYTHON" -c 'import sys
open(sys.argv[1] + "/big.txt", "w").write("x" * 200000)
for i in range(6): open(sys.argv[1] + f"/s{i}.txt", "w").write("small %d\n" % i)' plain
if "$PYTHON" "$ROOT/tools/data/prepare_data.py" plain --out-dir py --val-every 3 >/dev/null 2>&1 &&
   prep 4 plain --out-dir p4 --val-every 3 >p4.err 2>&1 &&
   same_files py/train.h5 p4/train.h5 && same_files py/val.h5 p4/val.h5; then
  pass "plain text on 4 ranks (ranks 1-3 hold no document start: big.txt spans their shares) = prepare_data.py's files"
else
  fail "plain text against prepare_data.py"; tail -3 p4.err
fi

# The same input twice: warned, read once.
if prep 2 corpus corpus/a.jsonl --out-dir twice --val-every 3 >twice.err 2>&1 &&
   grep -q "warning: corpus/a.jsonl is given more than once" twice.err && same_files r1/train.h5 twice/train.h5; then
  pass "an input given twice: $(grep warning twice.err)"
else
  fail "input given twice"; head -3 twice.err
fi

# Bad input: one line, the exit status, nothing under the final name.
none_left() { [ ! -e "$1/train.h5" ] && [ ! -e "$1/val.h5" ] && [ ! -e "$1/train.h5.tmp" ] && [ ! -e "$1/val.h5.tmp" ]; }
bad() {  # bad NAME CODE PATTERN INPUT... [-- FLAGS]
  local name=$1 code=$2 pattern=$3; shift 3
  expect_error "$name" "$code" "$pattern" prep 2 "$@" --out-dir "out_$name"
  none_left "out_$name" || fail "$name: a file was left under the final name"
}
mkdir -p badin
printf 'hello\nworld\n' >badin/notjson.jsonl
head -c 300 corpus/b.jsonl.gz >badin/cut.jsonl.gz
head -c 200000 corpus/c.jsonl.zst >badin/cut.jsonl.zst
printf 'PAR1' >badin/t.parquet
bad not_json_lines 2 'none of the first 2 JSON lines of .*notjson\.jsonl has a "text" member \(e\.g\. .*notjson\.jsonl:1: not JSON' badin/notjson.jsonl
bad truncated_gzip 2 'cut\.jsonl\.gz: the gzip stream is truncated$' badin/cut.jsonl.gz
bad truncated_zstd 2 'cut\.jsonl\.zst: the zstd stream is truncated$' badin/cut.jsonl.zst
bad missing_key 2 '^--text-key body: none of the first 16 JSON lines of .*a\.jsonl has a "body" member \(e\.g\. .*a\.jsonl:1: no "body" member\)' corpus --text-key body
bad strict 2 'a\.jsonl:15: not JSON: .*\(--strict stops at the first malformed line\)$' corpus --strict
bad parquet 2 't\.parquet: Parquet is not read here .*convert it to JSON Lines' badin/t.parquet
: >afile
expect_error out_dir_is_file 1 'cannot create directory afile/sub' \
  prep 2 corpus/d.txt corpus/e.md --val-every 2 --out-dir afile/sub
mkdir -p out_mpiio/train.h5.tmp
expect_error mpiio_create 1 'cannot create .*out_mpiio/train\.h5\.tmp through MPI-IO' \
  prep 2 corpus/d.txt corpus/e.md --val-every 2 --out-dir out_mpiio
if [ -e out_mpiio/train.h5 ] || [ -e out_mpiio/val.h5 ]; then fail "mpiio_create: a file left under the final name"; fi

# A write that fails on one rank alone (a full disk that rank sees, write_fail_shim.c preloaded):
# one line naming the rank and the error, exit 1, no file under the final name, no hang.
if ${CC:-gcc} -O1 -Wall -Wextra -Werror -shared -fPIC -o shim.so "$ROOT/tests/integration/write_fail_shim.c" -ldl 2>shim.err; then
  timeout -k 5 90 $MPIEXEC -n 2 -env LD_PRELOAD "$WORK/shim.so" -env TESSERA_SHIM_RANK 1 \
    -env TESSERA_SHIM_MATCH train.h5.tmp -env TESSERA_SHIM_ERRNO 28 \
    "$TESSERA" data prepare plain --val-every 3 --out-dir out_full >full.out 2>full.err
  rc=$?
  if [ "$rc" -eq 1 ] && [ "$(grep -c '^tessera data prepare: ' full.err)" -eq 1 ] &&
     grep -q '^tessera data prepare: rank 1 cannot write out_full/train\.h5\.tmp: No space left on device' full.err &&
     none_left out_full; then
    pass "a write failing on rank 1 alone: exit 1, $(grep '^tessera data prepare' full.err)"
  else
    fail "write failing on one rank: exit $rc"; sed 's/^/    /' full.err | head -5
  fi
else
  fail "the shim does not build: $(head -3 shim.err)"
fi
finish
