#!/usr/bin/env bash
# The step breakdown's own cost, and where a step goes, on a backend (the GPU bundle runs it on a
# GPU, where log.breakdown's `auto` leaves the events off until this measures them): a GPT-2
# shape trained STEPS steps four times, log.breakdown false, true, true, false (the order's own
# effect cancels); prints the tokens/s of each, the cost, and the breakdown table of the last
# `true` run. docs/running.md#step-breakdown.
#   TESSERA (bin/tessera)  OUT (build/bench)  DATA (build/testdata)  BACKEND (cuda)  STEPS (60)
#   MODEL (GPT-2 12 x 768, T=256, B=8: small steps, so the events' host cost shows most)
#   PYTHON (/usr/bin/python3)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TESSERA=${TESSERA:-$ROOT/bin/tessera}
OUT=${OUT:-$ROOT/build/bench}
DATA=${DATA:-$ROOT/build/testdata}
BACKEND=${BACKEND:-cuda}
STEPS=${STEPS:-60}
PYTHON=${PYTHON:-/usr/bin/python3}
MODEL=${MODEL:-"n_layer: 12, n_head: 12, n_embd: 768, block_size: 256"}
T=${T:-256} B=${B:-8}
mkdir -p "$OUT/breakdown"

tps=()
for round in 1 2 3 4; do
  case $round in 1|4) on=false ;; *) on=true ;; esac
  run=$OUT/breakdown/r$round
  rm -rf "$run"
  cat >"$run.yaml" <<DECK
model: {$MODEL}
data: {train: "$DATA/train.h5", seq_len: $T}
train: {steps: $STEPS, batch_size: $B, micro_batch: $B}
checkpoint: {every: 1000000, restart: none, dir: "$run/ckpt"}
eval: {every: 0}
log: {every: 1, breakdown: $on}
run: {dir: "$run"}
device: {backend: $BACKEND}
DECK
  "$TESSERA" train "$run.yaml" >"$run.log" 2>&1 || { echo "breakdown: round $round failed:"; tail -5 "$run.log"; exit 1; }
  tps+=("$("$PYTHON" - "$run/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"train"' in l][5:]   # past the warm-up
print(statistics.median(r["tokens_per_s"] for r in rows))
PY
)")
done
"$PYTHON" - "${tps[@]}" <<'PY'
import sys
off1, on2, on3, off4 = map(float, sys.argv[1:5])
off, on = (off1 + off4) / 2, (on2 + on3) / 2
print(f"breakdown cost: {on:.0f} tokens/s timed against {off:.0f} untimed (rounds off, on, on, off: "
      f"{off1:.0f}, {on2:.0f}, {on3:.0f}, {off4:.0f}): the step {100 * (off / on - 1):+.1f}% longer timed")
PY
sed -n '/^breakdown (rank 0/,/^done:/p' "$OUT/breakdown/r3.log" | grep -v '^done:'
