#!/usr/bin/env bash
# `make bench`'s step section: the training step against the machine's own sgemm rate on the
# GPT-2 124M shape at T=64 B=4 and T=1024 B=1, gemm and fused attention, each with where its step
# goes (log.breakdown), PyTorch's reference on the same shapes and threads, and the breakdown's
# own cost (log.breakdown true against false, interleaved), measured side by side in one run.
# Prints Markdown.
#   OUT (build/bench)  PYTHON (/usr/bin/python3)  THREADS (2)  STEPS (4 timed steps after one warm-up)
#   TOKENS (a token file of GPT-2 ids, made by the caller)  PEAK (sgemm GFLOP/s, measured if unset)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
OUT=${OUT:-$ROOT/build/bench}
THREADS=${THREADS:-2}
STEPS=${STEPS:-4}
TOKENS=${TOKENS:-$OUT/tokens.h5}
export OMP_NUM_THREADS=$THREADS
L=12 H=12 C=768 V=50257
mkdir -p "$OUT/step"
PEAK=${PEAK:-$("$ROOT/bin/tessera" peak | awk '/sgemm_gflops/ {print $2}')}

# run NAME T B ATTENTION [key=value...]: tessera's median tokens/s and MFU of the steps after the
# first, and its breakdown averaged over them, as one JSON line.
run() {
  local name=$1 T=$2 B=$3 attention=$4
  shift 4
  rm -rf "$OUT/step/$name"
  cat >"$OUT/step/$name.yaml" <<DECK
model: {n_layer: $L, n_head: $H, n_embd: $C, block_size: $T, vocab_size: $V, vocab_multiple: 64, attention: $attention}
data: {train: "$TOKENS", seq_len: $T}
train: {steps: $((STEPS + 1)), batch_size: $B, micro_batch: $B}
checkpoint: {every: 1000000, restart: none, dir: "$OUT/step/$name/ckpt"}
eval: {every: 0}
log: {every: 1, peak_gflops: $PEAK}
run: {dir: "$OUT/step/$name"}
device: {threads: $THREADS}
DECK
  "$ROOT/bin/tessera" train "$OUT/step/$name.yaml" "$@" >"$OUT/step/$name.log" 2>&1
  "$PYTHON" - "$OUT/step/$name/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l][1:]
b = {k: statistics.mean(r["breakdown_ms"][k] for r in rows) for k in rows[0]["breakdown_ms"]}
print(json.dumps({"tps": statistics.median(r["tokens_per_s"] for r in rows),
                  "mfu": statistics.median(r["mfu"] for r in rows), "breakdown": b}))
PY
}
torch() {  # torch T B: PyTorch's tokens/s
  "$PYTHON" "$ROOT/tools/reference/reference_gpt.py" --bench --n-layer $L --n-head $H --n-embd $C \
    --vocab $V --seq "$1" --batch "$2" --steps "$STEPS" --threads "$THREADS" 2>>"$OUT/step/torch.log" |
    awk '/tokens_per_second/ {print $2}'
}

declare -A result
for shape in "64 4" "1024 1"; do
  set -- $shape
  for attention in gemm fused; do
    echo "bench: step, T=$1 B=$2, $attention attention" >&2
    result["$1 $2 $attention"]=$(run "t$1_b$2_$attention" "$1" "$2" "$attention")
  done
  echo "bench: step, PyTorch T=$1 B=$2" >&2
  result["$1 $2 torch"]=$(torch "$1" "$2")
done
# The breakdown's cost: two rounds at the short shape, off then on, on then off (the order's
# own effect cancels).
for round in 1 2; do
  echo "bench: step, breakdown off and on, round $round" >&2
  if [ "$round" = 2 ]; then result["on $round"]=$(run "on_$round" 64 4 gemm log.breakdown=true); fi
  result["off $round"]=$(run "off_$round" 64 4 gemm log.breakdown=false)
  if [ "$round" = 1 ]; then result["on $round"]=$(run "on_$round" 64 4 gemm log.breakdown=true); fi
done

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
for k in "${!result[@]}"; do printf '%s\t%s\n' "$k" "${result[$k]}"; done >"$OUT/step/results.tsv"
"$PYTHON" - "$PEAK" "$cpu" "$THREADS" "$OUT/step/results.tsv" <<'PY'
import json, sys
peak, cpu, threads = float(sys.argv[1]), sys.argv[2], sys.argv[3]
r = {}
for line in open(sys.argv[4]):
    k, v = line.rstrip("\n").split("\t")
    r[k] = json.loads(v) if v.startswith("{") else float(v)
print(f"## The step against sgemm ({cpu}, {threads} threads)\n")
print(f"sgemm (OpenBLAS, 1024^3): {peak:.1f} GFLOP/s; MFU counts 6*N_matmul + 12*L*C*T FLOPs a token "
      "against it. Target: 85% at both shapes (issue 37).\n")
print("| shape | attention | tessera tokens/s | MFU of sgemm | PyTorch tokens/s | tessera / PyTorch |")
print("|---|---|---|---|---|---|")
for T, B in ((64, 4), (1024, 1)):
    for a in ("gemm", "fused"):
        x = r[f"{T} {B} {a}"]
        t = r[f"{T} {B} torch"]
        print(f"| T={T} B={B} | {a} | {x['tps']:.0f} | {100 * x['mfu']:.1f}% | {t:.0f} | {x['tps'] / t:.2f}x |")
print("\nWhere a step goes (ms a step, mean of the steps after the first; % of the step):\n")
rows = [(f"T={T} B={B} {a}", r[f"{T} {B} {a}"]["breakdown"]) for T, B in ((64, 4), (1024, 1))
        for a in ("gemm", "fused")]
kinds = [k for k in rows[0][1] if k != "step" and any(b[k] > 0 for _, b in rows)]
print("| kind | " + " | ".join(n for n, _ in rows) + " |")
print("|---|" + "---|" * len(rows))
for k in kinds:
    print(f"| {k} | " + " | ".join(f"{b[k]:.1f} ({100 * b[k] / b['step']:.0f}%)" for _, b in rows) + " |")
print("| step | " + " | ".join(f"{b['step']:.1f}" for _, b in rows) + " |")
off = [r[f"off {i}"]["tps"] for i in (1, 2)]
on = [r[f"on {i}"]["tps"] for i in (1, 2)]
print(f"\nThe breakdown's cost (T=64 B=4 gemm, two rounds, off-on and on-off): {sum(on) / 2:.0f} tokens/s with it "
      f"against {sum(off) / 2:.0f} without: the step {100 * (sum(off) / sum(on) - 1):+.1f}% longer with it "
      "(the rounds' noise included).")
PY
