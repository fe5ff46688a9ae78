#!/usr/bin/env bash
# `make bench`, data preparation section: `tessera data prepare` on about SIZE_MB (100) MB of JSON
# Lines text in zstd shards, made from this machine's own text files (/usr/lib/python3*,
# /usr/share/doc, /usr/include: .py, .h, .c, .txt, .rst, .md; a file a document, the first
# SIZE_MB MB in sorted order, cut into SHARDS (8) .jsonl.zst files), on 1, 2 and 4 ranks x 1 and
# 2 threads, with the byte tokenizer and with GPT-2's byte-level BPE (written from js-tiktoken's
# ranks, tests/integration/tiktoken_ref.mjs; skipped where build/npm lacks it). Prints the
# machine and a Markdown table: seconds, MB/s of text and tokens/s, in all and per rank.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
MPIEXEC=${MPIEXEC:-mpiexec}
SIZE_MB=${SIZE_MB:-100}
SHARDS=${SHARDS:-8}
RUNS=${RUNS:-"1x1 1x2 2x1 4x1"}
OUT=${OUT:-$ROOT/build/bench}/data_prepare
TESSERA=${TESSERA:-$ROOT/bin/tessera}
export MPIR_CVAR_POLLS_BEFORE_YIELD=${MPIR_CVAR_POLLS_BEFORE_YIELD:-1}
rm -rf "$OUT" && mkdir -p "$OUT/corpus"

find /usr/lib/python3* /usr/share/doc /usr/include -type f \( -name '*.py' -o -name '*.h' -o \
  -name '*.c' -o -name '*.txt' -o -name '*.rst' -o -name '*.md' \) -size +0 -printf '%s %p\n' \
  2>/dev/null | sort -k2 >"$OUT/files.txt"
"$PYTHON" - "$OUT/files.txt" "$OUT/corpus" "$SIZE_MB" "$SHARDS" <<'PY'
import json, subprocess, sys
files, out, size_mb, shards = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
docs, total = [], 0
for line in open(files):
    path = line.split(" ", 1)[1].rstrip("\n")
    try:
        text = open(path, "rb").read().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        continue
    docs.append(json.dumps({"text": text, "source": path}, ensure_ascii=False) + "\n")
    total += len(docs[-1])
    if total >= size_mb * 1e6:
        break
per = (len(docs) + shards - 1) // shards
for s in range(shards):
    name = f"{out}/shard_{s:03d}.jsonl"
    with open(name, "w") as f:
        f.writelines(docs[s * per:(s + 1) * per])
    subprocess.run(["zstd", "-q", "--rm", "-3", name], check=True)
print(f"corpus: {len(docs)} documents, {total / 1e6:.1f} MB of JSON Lines in {shards} zstd shards", file=sys.stderr)
PY

tokenizers=(byte)
NPM=$ROOT/build/npm
if [ -f "$NPM/node_modules/js-tiktoken/package.json" ]; then
  (cd "$NPM" && node "$ROOT/tests/integration/tiktoken_ref.mjs" files gpt2 "$OUT/gpt2") >/dev/null
  mkdir -p "$OUT/tiny" && echo a >"$OUT/tiny/a.txt" && echo b >"$OUT/tiny/b.txt"
  "$PYTHON" "$ROOT/tools/data/prepare_data.py" "$OUT/tiny" --tokenizer "$OUT/gpt2/tokenizer.json" \
    --val-every 2 --out-dir "$OUT/gpt2tok" 2>/dev/null
  tokenizers+=("$OUT/gpt2tok/val.h5")
fi

model=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
echo "Machine: $model, $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo);" \
  "input $(du -sm "$OUT/corpus" | cut -f1) MB of .jsonl.zst"
echo
echo "| tokenizer | ranks x threads | documents | text MB | tokens | seconds (encode + write) | MB/s | tokens/s | tokens/s per rank |"
echo "|---|---|---|---|---|---|---|---|---|"
for tok in "${tokenizers[@]}"; do
  name=byte; [ "$tok" = byte ] || name=gpt2
  for run in $RUNS; do
    ranks=${run%x*} threads=${run#*x}
    rm -rf "$OUT/out"
    OMP_NUM_THREADS=$threads $MPIEXEC -n "$ranks" "$TESSERA" data prepare "$OUT/corpus" --out-dir "$OUT/out" \
      --tokenizer "$tok" --threads "$threads" --log-seconds 1000 2>"$OUT/$name-$run.log" ||
      { echo "data prepare bench: failed: $(tail -1 "$OUT/$name-$run.log")"; exit 1; }
    "$PYTHON" - "$OUT/$name-$run.log" "$name" "$ranks" "$threads" <<'PY'
import re, sys
log, name, ranks, threads = open(sys.argv[1]).read(), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
m = re.search(r"prepare: (\d+) documents, [0-9.]+ MB of input \(([0-9.]+) MB of text\), (\d+) tokens in "
              r"([0-9.]+) s \(encode ([0-9.]+) s, write ([0-9.]+) s\).*: ([0-9.]+) MB/s, (\d+) tokens/s", log)
docs, mb, tokens, s, enc, wr, mbs, tps = m.groups()
print(f"| {name} | {ranks} x {threads} | {docs} | {mb} | {tokens} | {s} ({enc} + {wr}) | {mbs} | {tps} | "
      f"{int(tps) // ranks} |")
PY
  done
done
