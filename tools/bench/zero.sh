#!/usr/bin/env bash
# `make bench`, ZeRO section: the GPT-2 124M shape at T=256 on 4 CPU ranks (dp=4, one thread
# each), ZeRO stages 0-3 side by side in one run, stage 3 also with its prefetch off: tokens/s,
# the persistent bytes a rank keeps (parameters, gradients and optimizer state, from the
# engine's arena), its peak (every buffer), the bytes it hands to MPI per step, and the exposed
# data-parallel communication (seconds blocked in the dp collectives per step). Prints a
# markdown table.
#   OUT (build/bench)  PYTHON  STEPS (4 timed steps after one warm-up)  TOKENS (a GPT-2 id file)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
MPIEXEC=${MPIEXEC:-mpiexec}
OUT=${OUT:-$ROOT/build/bench}
STEPS=${STEPS:-4}
TOKENS=${TOKENS:-$OUT/tokens.h5}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 MPIR_CVAR_POLLS_BEFORE_YIELD=1
L=12 H=12 C=768 V=50257 T=256 RANKS=4
[ -f "$TOKENS" ] || "$PYTHON" "$ROOT/tools/data/random_tokens.py" "$TOKENS" "$V"
cat >"$OUT/zero.yaml" <<DECK
model: {n_layer: $L, n_head: $H, n_embd: $C, block_size: $T, vocab_size: $V, vocab_multiple: 64}
data: {train: "$TOKENS", seq_len: $T, check_tokens: false}
train: {steps: $((STEPS + 1)), batch_size: $RANKS}
checkpoint: {every: 1000000, restart: none}
log: {every: 1, peak_gflops: 50}
parallel: {dp: $RANKS}
DECK
for run in "0 true" "1 true" "2 true" "3 true" "3 false"; do
  set -- $run
  name="zero$1_prefetch$2"
  echo "bench: ZeRO-$1 (prefetch $2), GPT-2 124M shape, T=$T, dp=$RANKS" >&2
  rm -rf "$OUT/$name"
  $MPIEXEC -n $RANKS "$ROOT/bin/tessera" train "$OUT/zero.yaml" parallel.zero="$1" \
    parallel.zero_prefetch="$2" run.dir="$OUT/$name" checkpoint.dir="$OUT/$name/ckpt" \
    >"$OUT/$name.log" 2>&1 || { echo "tools/bench/zero.sh: $name failed; see $OUT/$name.log" >&2; exit 1; }
done
"$PYTHON" - "$OUT" <<'PY'
import json, statistics, sys
out = sys.argv[1]
def read(name):
    rows = [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl")]
    steps = [r for r in rows if r["type"] == "train"][1:]          # step 1 warms up
    ranks = [r for r in rows if r["type"] == "rank"]
    worst = max(ranks, key=lambda r: r["arena_bytes"])
    persistent = max(r["param_buffer_bytes"] + r["grad_buffer_bytes"] + r["optimizer_buffer_bytes"]
                     for r in ranks)
    return {"tps": statistics.median(r["tokens_per_s"] for r in steps), "persistent": persistent,
            "peak": worst["arena_bytes"], "dp": max(r["dp_bytes_per_step"] for r in ranks),
            "wait": max(r["dp_wait_s_per_step"] for r in ranks),
            "ms": statistics.median(r["ms"] for r in steps)}
runs = [("0", "on"), ("1", "on"), ("2", "on"), ("3", "on"), ("3", "off")]
r = {k: read(f"zero{k[0]}_prefetch{'true' if k[1] == 'on' else 'false'}") for k in runs}
base = r[("0", "on")]
print("## ZeRO stages (GPT-2 124M shape, T=256, dp=4 CPU ranks of 1 thread, one micro-batch each)\n")
print("| stage | prefetch | tokens/s | vs stage 0 | step ms | persistent MB/rank | vs stage 0 "
      "| peak MB/rank | dp MB/step | exposed dp s/step |")
print("|---|---|---|---|---|---|---|---|---|---|")
for k in runs:
    x = r[k]
    print(f"| {k[0]} | {k[1] if k[0] == '3' else '-'} | {x['tps']:.0f} | {x['tps'] / base['tps']:.2f}x "
          f"| {x['ms']:.0f} | {x['persistent'] / 1e6:.1f} | {x['persistent'] / base['persistent']:.2f}x "
          f"| {x['peak'] / 1e6:.1f} | {x['dp'] / 1e6:.1f} | {x['wait']:.3f} |")
s3 = r[("3", "on")]
print(f"\nTargets: stage 3 persistent memory <= 0.3x stage 0's: "
      f"{s3['persistent'] / base['persistent']:.2f}x; stage 3 throughput >= 0.8x stage 0's with "
      f"prefetch on: {s3['tps'] / base['tps']:.2f}x (prefetch off: "
      f"{r[('3', 'off')]['tps'] / base['tps']:.2f}x).")
PY
