#!/usr/bin/env bash
# Hugging Face byte-level BPE (GPT-2 and LLaMA 3 kinds) against an independent implementation:
# js-tiktoken (npm), with GPT-2's and cl100k's real ranks. The tokenizer files tessera reads
# (tokenizer.json; GPT-2's vocab.json + merges.txt; a LLaMA 3-kind tokenizer.json over cl100k's
# ranks) are written from the package's ranks by tests/integration/tiktoken_ref.mjs; the corpus
# is the embedded one (the standard library's top-level .py files, 4.7 MB) plus a generated
# document of letters, digits, marks and symbols of many scripts, long runs of spaces and digits,
# contractions, \r\n and Unicode spaces. prepare_data.py --tokenizer (tessera's C++ encoder)
# must give, document for document, the ids js-tiktoken gives, and every document must decode
# back to its bytes (in C++ and in Python), text that is not UTF-8 included. Bad tokenizer files
# are one line naming the file and what was expected.
#
# Left out of the corpus, knowingly: U+FEFF and U+0085, the two characters whose \s-ness differs
# between JavaScript's regular expressions (js-tiktoken) and Oniguruma's and Rust's (Hugging Face
# tokenizers, tiktoken), which tessera follows (\s = Unicode White_Space).
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$WORK" || exit 1

if ! NPM=$(npm_reference); then
  echo "SKIP test_hf_tokenizer: no npm to install js-tiktoken, the reference (make deps-test installs npm)"
  finish
fi
ref() { (cd "$NPM" && node "$ROOT/tests/integration/tiktoken_ref.mjs" "$@"); }
if ref files gpt2 "$WORK/gpt2" >ref.out 2>&1 && ref files cl100k_base "$WORK/llama3" >>ref.out 2>&1; then
  pass "tokenizer files from js-tiktoken's ranks: $(tr '\n' ';' <ref.out)"
else
  fail "tiktoken_ref.mjs files"; sed 's/^/    /' ref.out; finish
fi

mkdir -p corpus
stdlib=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
cp "$stdlib"/*.py corpus/
"$PYTHON" - <<'EOF'
import random, unicodedata
rng = random.Random(28)
ranges = [(0xC0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x5D0, 0x5EA), (0x620, 0x64A),
          (0x660, 0x669), (0x900, 0x97F), (0x966, 0x96F), (0xE01, 0xE5B), (0x3041, 0x30FF),
          (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0x1F300, 0x1F64F), (0x2200, 0x22FF),
          (0x20A0, 0x20BF), (0x2160, 0x2188), (0x300, 0x36F), (0x2010, 0x2027)]
chars = [chr(c) for a, b in ranges for c in range(a, b + 1)
         if unicodedata.category(chr(c))[0] in "LNMPS"]
spaces = [" ", "  ", "\t", "\u00a0", "\u3000", "\u2028", "\u1680", " \u2029 "]
extras = ["it's", "IT'S", "we'LL", "don't", "they've", "I'd", "'re", "'m", "x = 12345678901234",
          "!!!...", "(){}[]", "  \r\n", "\r\n", "\n\n\n", "    ", "0.5e-10", "١٢٣٤٥", "naïve café"]
lines = []
while sum(len(l) for l in lines) < 300_000:
    words = []
    for _ in range(rng.randint(0, 14)):
        r = rng.random()
        if r < 0.55:
            words.append("".join(rng.choice(chars) for _ in range(rng.randint(1, 12))))
        elif r < 0.7:
            words.append("".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40))))
        elif r < 0.9:
            words.append(rng.choice(extras))
        else:
            words.append(rng.choice(spaces) * rng.randint(1, 3))
    lines.append(" " * rng.choice([0, 0, 4, 8, 13]) + rng.choice([" ", "  ", "\t"]).join(words) +
                 rng.choice(["", " ", "   "]))
lines.insert(100, "9" * 3000)
lines.insert(200, "a" + " " * 2000 + "b")
lines.insert(300, " " * 5000)
open("corpus/zz_unicode.txt", "w", encoding="utf-8", newline="").write("\n".join(lines) + "\n")
EOF
printf 'ok \xff\xfe bytes \xc3( and \xe2\x82 cut\n' >not_utf8.txt
printf "%s\n" "$PWD"/corpus/* | LC_ALL=C sort >list.txt
mb=$(du -cb corpus | tail -1 | awk '{printf "%.1f", $1 / 1e6}')

# ids of every document, tessera's against js-tiktoken's: DIR holds train.h5/val.h5 of
# --val-every 10; the reference's ids of list.txt's files in order; bos/eot framing per kind.
compare() {
  local dir=$1 ref_ids=$2 bos=$3
  "$PYTHON" - "$dir" "$ref_ids" "$bos" <<'EOF'
import sys
import numpy as np
import tessera_data as td
d, ref_path, bos = sys.argv[1], sys.argv[2], int(sys.argv[3])
ref = np.fromfile(ref_path, dtype="<u4")
want, at = [], 0
while at < ref.size:
    n = int(ref[at]); want.append(ref[at + 1:at + 1 + n].tolist()); at += 1 + n
got = {}
for split in ("train", "val"):
    tokens, meta = td.read_token_file(f"{d}/{split}.h5")
    docs, cur = [], []
    for x in tokens.tolist():
        if x == meta["eot"]:
            docs.append(cur); cur = []
        else:
            cur.append(x)
    assert not cur, f"{split}: tokens after the last eot"
    got[split] = iter(docs)
bad, tokens = [], 0
for i, w in enumerate(want):
    g = next(got["val" if i % 10 == 9 else "train"])
    if bos >= 0:
        assert g[:1] == [bos], f"document {i} does not start with bos {bos}"
        g = g[1:]
    tokens += len(w)
    if g != w:
        k = next((j for j, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
        bad.append(f"document {i} differs at token {k}: {g[k:k + 4]} vs {w[k:k + 4]}")
if bad:
    print(f"{len(bad)} of {len(want)} documents differ; " + "; ".join(bad[:3])); sys.exit(1)
print(f"{len(want)} documents, {tokens} tokens")
EOF
}

for kind in gpt2 llama3; do
  case $kind in
    gpt2) tok=$WORK/gpt2/tokenizer.json; encoding=gpt2; bos=-1 ;;
    llama3) tok=$WORK/llama3/tokenizer.json; encoding=cl100k_base; bos=100256 ;;
  esac
  if "$PYTHON" "$ROOT/tools/data/prepare_data.py" corpus --tokenizer "$tok" --val-every 10 \
       --out-dir "$kind" >"$kind.out" 2>&1; then
    pass "$kind: prepare_data --tokenizer $(basename "$tok"): $(grep -m1 'encode done' "$kind.out")"
  else
    fail "$kind: prepare_data --tokenizer"; sed 's/^/    /' "$kind.out"; continue
  fi
  ref encode "$encoding" "$WORK/list.txt" "$WORK/$kind.ref" >/dev/null 2>&1 || fail "$kind: js-tiktoken encode"
  if msg=$(compare "$kind" "$kind.ref" "$bos" 2>&1); then
    pass "$kind: ids equal to js-tiktoken ($encoding) on every document: $msg, $mb MB"
  else
    fail "$kind: ids differ from js-tiktoken: $msg"
  fi
done

# GPT-2's vocab.json + merges.txt: the same ids as its tokenizer.json.
if "$PYTHON" "$ROOT/tools/data/prepare_data.py" corpus --tokenizer "$WORK/gpt2/vocab.json" --val-every 10 \
     --out-dir gpt2v >gpt2v.out 2>&1 &&
   "$PYTHON" -c 'import sys, tessera_data as td
a, b = (td.read_token_file(f"{d}/train.h5")[0] for d in sys.argv[1:])
assert (a == b).all() and a.size > 1000000' gpt2 gpt2v; then
  pass "gpt2: vocab.json + merges.txt give the tokenizer.json's ids"
else
  fail "gpt2: vocab.json + merges.txt"; sed 's/^/    /' gpt2v.out
fi

# decode(encode(x)) == x: in C++ (--verify) and in Python, text that is not UTF-8 included.
if "$PYTHON" - "$TESSERA" "$WORK/gpt2/tokenizer.json" <<'EOF'
import struct, subprocess, sys
docs = [open(p, "rb").read() for p in open("list.txt").read().split()] + [open("not_utf8.txt", "rb").read()]
feed = b"".join(struct.pack("<Q", len(d)) + d for d in docs)
r = subprocess.run([sys.argv[1], "data", "encode", sys.argv[2], "--stream", "--verify"], input=feed,
                   capture_output=True)
assert r.returncode == 0, r.stderr.decode()
assert b"every document decodes to its text" in r.stderr, r.stderr
EOF
then pass "C++ decode(encode(x)) == x on every document and on bytes that are not UTF-8"
else fail "C++ decode(encode(x)) != x"; fi
mkdir -p bad_utf8 && cp not_utf8.txt bad_utf8/a.txt && cp corpus/abc.py bad_utf8/b.txt
if "$PYTHON" "$ROOT/tools/data/prepare_data.py" bad_utf8 --tokenizer "$WORK/gpt2" --val-every 2 \
     --out-dir bad_utf8_out >/dev/null 2>&1 &&
   "$PYTHON" - <<'EOF'
import hf_tokenizer, tessera_data as td
tokens, meta = td.read_token_file("bad_utf8_out/train.h5")
assert meta["tokenizer"] == "hf-bpe"
ids = tokens.tolist()
assert ids[-1] == meta["eot"] and meta["eot"] not in ids[:-1]
assert hf_tokenizer.decode(meta["tokenizer_model"], ids) == open("not_utf8.txt", "rb").read()
import numpy as np
for name, docs in (("gpt2", None), ("llama3", None)):
    for split in ("train", "val"):
        t, m = td.read_token_file(f"{name}/{split}.h5")
        text = hf_tokenizer.decode(m["tokenizer_model"], t)
        assert len(text) > 0
EOF
then pass "Python decode: a document with bytes that are not UTF-8 comes back byte for byte"
else fail "Python decode of bytes that are not UTF-8"; fi

# The tokenizer travels in the token file with its special tokens.
if "$PYTHON" - <<'EOF'
import hf_tokenizer, tessera_data as td
for name, eos, bos in (("gpt2", 50256, 50256), ("llama3", 100257, 100256)):
    _, meta = td.read_token_file(f"{name}/val.h5")
    sp = hf_tokenizer.blob_specials(meta["tokenizer_model"])
    assert (meta["eot"], sp["eos_token_id"], sp["bos_token_id"]) == (eos, eos, bos), (name, meta["eot"], sp)
    assert sp["kind"] == name, sp
EOF
then pass "token files carry tokenizer hf-bpe with its kind, eos and bos (gpt2: 50256/50256, llama3: 100257/100256)"
else fail "special tokens in the token file"; fi
out=$("$TESSERA" data encode gpt2/val.h5 --text "def f(x):  return 'it's'" 2>&1) &&
  back=$("$TESSERA" data decode gpt2/val.h5 --ids "$out" 2>&1)
if [ "$back" = "def f(x):  return 'it's'" ] && [ "$out" = "4299 277 7 87 2599 220 1441 705 270 338 6" ]; then
  pass "tessera data encode|decode with a token file's tokenizer: $out"
else
  fail "tessera data encode|decode: '$out' -> '$back'"
fi

# Bad input: one line naming the file and what was expected, exit 2, nothing written.
printf '{"model": {"type": "BPE",\n  "vocab": {"a": 0,}}}\n' >bad.json
expect_error "malformed JSON (prepare_data)" 2 'bad\.json: not valid JSON at line 2, column 20' \
  "$PYTHON" "$ROOT/tools/data/prepare_data.py" corpus --tokenizer bad.json --out-dir nothing
[ ! -e nothing/train.h5 ] || fail "malformed JSON: a token file was written"
expect_error "malformed JSON (tessera)" 2 'bad\.json: not valid JSON at line 2, column 20: syntax error while parsing object key' \
  "$TESSERA" data encode bad.json --text x
printf '{"model": {"type": "WordPiece", "vocab": {"a": 0}}, "normalizer": null}' >wordpiece.json
expect_error "another kind (prepare_data)" 2 "wordpiece\.json: model type 'WordPiece' \(tessera reads byte-level BPE" \
  "$PYTHON" "$ROOT/tools/data/prepare_data.py" corpus --tokenizer wordpiece.json --out-dir nothing
expect_error "another kind (tessera)" 2 "wordpiece\.json: model type 'WordPiece' \(tessera reads byte-level BPE" \
  "$TESSERA" data encode wordpiece.json --text x
"$PYTHON" -c 'import json; t = json.load(open("gpt2/tokenizer.json")); t["normalizer"] = {"type": "NFC"}
json.dump(t, open("nfc.json", "w"))'
expect_error "a normalizer" 2 "nfc\.json: normalizer: type 'NFC' \(tessera reads" \
  "$PYTHON" "$ROOT/tools/data/prepare_data.py" corpus --tokenizer nfc.json --out-dir nothing
mkdir -p only_vocab && cp gpt2/vocab.json only_vocab/
expect_error "vocab.json without merges.txt" 2 "vocab\.json: GPT-2's vocab\.json needs merges\.txt beside it" \
  "$PYTHON" "$ROOT/tools/data/prepare_data.py" corpus --tokenizer only_vocab/vocab.json --out-dir nothing
"$PYTHON" -c 'import json; t = json.load(open("gpt2/tokenizer.json")); t["model"]["merges"].append("Ġzzzq Ġzzzr")
json.dump(t, open("badmerge.json", "w"))'
expect_error "a merge of unknown tokens" 2 "badmerge\.json: model\.merges\[[0-9]+\]: 'Ġzzzq Ġzzzr': 'Ġzzzq' is not in model\.vocab" \
  "$TESSERA" data encode badmerge.json --text x
finish
