#!/usr/bin/env bash
# `make bench`, tokenizer section: how fast tools/data/prepare_data.py --tokenizer encodes about
# SIZE_MB (100) MB of text with GPT-2's tokenizer and with a LLaMA 3-kind one (cl100k's ranks),
# both written from the npm package js-tiktoken's ranks (tests/integration/tiktoken_ref.mjs). The
# text: source and documentation files of this machine (/usr/lib/python3*, /usr/include: .py,
# .h, .c, .txt, .rst), distinct documents in sorted order. Prints a Markdown table: the whole
# tool (reading, encoding, writing the token files) and tessera's C++ encoder alone, on THREADS
# threads (default: every core).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
SIZE_MB=${SIZE_MB:-100}
THREADS=${THREADS:-$(nproc)}
OUT=${OUT:-$ROOT/build/bench}/tokenizer
NPM=$ROOT/build/npm
if [ ! -f "$NPM/node_modules/js-tiktoken/package.json" ]; then
  echo "tokenizer bench: skipped (js-tiktoken is not installed in build/npm: make deps-test)"
  exit 0
fi
rm -rf "$OUT" && mkdir -p "$OUT/corpus"
(cd "$NPM" && node "$ROOT/tests/integration/tiktoken_ref.mjs" files gpt2 "$OUT/gpt2" &&
  node "$ROOT/tests/integration/tiktoken_ref.mjs" files cl100k_base "$OUT/llama3") >/dev/null
# Links to the first SIZE_MB MB of files, in sorted order.
find /usr/lib/python3* /usr/include -type f \( -name '*.py' -o -name '*.h' -o -name '*.c' -o \
  -name '*.txt' -o -name '*.rst' \) -size +0 -printf '%s %p\n' 2>/dev/null | sort -k2 >"$OUT/files.txt"
awk -v max="$((SIZE_MB * 1000000))" '{ if (s >= max) exit; s += $1; print $2 }' "$OUT/files.txt" >"$OUT/taken.txt"
n=0
while read -r f; do
  n=$((n + 1))
  ln -s "$f" "$OUT/corpus/$(printf '%06d' "$n")_$(basename "$f").txt"
done <"$OUT/taken.txt"
echo "| tokenizer | text | documents | tokens | prepare_data.py (read, encode, write) | C++ encoder alone |"
echo "|---|---|---|---|---|---|"
for kind in gpt2 llama3; do
  "$PYTHON" "$ROOT/tools/data/prepare_data.py" "$OUT/corpus" --suffixes .txt --tokenizer "$OUT/$kind/tokenizer.json" \
    --threads "$THREADS" --val-every 10 --log-seconds 1000 --out-dir "$OUT/$kind-out" 2>"$OUT/$kind.log" ||
    { echo "tokenizer bench: prepare_data.py failed: $(tail -1 "$OUT/$kind.log")"; exit 1; }
  "$PYTHON" - "$OUT/$kind.log" "$kind" <<'PY'
import re, sys
log = open(sys.argv[1]).read()
m = re.search(r"encode done: (\d+) documents, ([\d.]+) MB, (\d+) tokens in ([\d.]+) s \(([\d.]+) MB/s, (\d+) tokens/s", log)
e = re.search(r"tessera encode: .*? in ([\d.]+) s on (\d+) threads \(([\d.]+) MB/s, (\d+) tokens/s\)", log)
docs, mb, tokens, s, mbs, tps = m.groups()
print(f"| {sys.argv[2]} | {mb} MB | {docs} | {tokens} | {s} s, {int(tps):,} tokens/s ({mbs} MB/s) | "
      f"{e.group(1)} s on {e.group(2)} threads, {int(e.group(4)):,} tokens/s ({e.group(3)} MB/s) |")
PY
  rm -rf "$OUT/$kind-out"
done
