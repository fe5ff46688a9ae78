#!/usr/bin/env bash
# `make bench`, context parallelism section: input/llama-long.yaml's small LLaMA at T=8192 on
# cp = 1, 2, 4 CPU ranks (one thread each), the K/V passed round the ring or all-gathered: step
# time, the attention's seconds per step (its waits included), the exposed cp communication
# (seconds blocked on the cp communicator per step), the bytes each rank sends on it and its
# memory (activations, every buffer); then the deck itself at T=32768 on cp=4 for a few steps:
# per-rank memory and the share of the step spent waiting on the ring. Prints markdown tables.
#   OUT (build/bench)  PYTHON  STEPS (2 timed steps after one warm-up)  TOKENS (a token file)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
MPIEXEC=${MPIEXEC:-mpiexec}
OUT=${OUT:-$ROOT/build/bench}
STEPS=${STEPS:-2}
TOKENS=${TOKENS:-$ROOT/data/default/train.h5}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 MPIR_CVAR_POLLS_BEFORE_YIELD=1
run() {  # run NAME CP T MODE STEPS
  echo "bench: context parallelism $1 (cp=$2, T=$3, $4)" >&2
  rm -rf "${OUT:?}/$1"
  $MPIEXEC -n "$2" "$ROOT/bin/tessera" train "$ROOT/input/llama-long.yaml" data.train="$TOKENS" \
    data.val= data.check_tokens=false data.seq_len="$3" parallel.cp="$2" parallel.cp_comm="$4" \
    train.steps=$(($5 + 1)) checkpoint.every=1000000 run.dir="$OUT/$1" \
    checkpoint.dir="$OUT/$1/ckpt" >"$OUT/$1.log" 2>&1 ||
    { echo "tools/bench/cp.sh: $1 failed; see $OUT/$1.log" >&2; exit 1; }
}
names=()
for c in "1 ring" "2 ring" "4 ring" "2 allgather" "4 allgather"; do
  set -- $c
  run "cp$1_$2" "$1" 8192 "$2" "$STEPS"
  names+=("cp$1_$2")
done
run long_cp4 4 32768 ring 1
"$PYTHON" - "$OUT" "${names[@]}" <<'PY'
import json, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
def read(name):
    rows = [json.loads(l) for l in open(f"{out}/{name}/metrics.jsonl")]
    steps = [r for r in rows if r["type"] == "train"][1:]  # the first step warms up
    ranks = [r for r in rows if r["type"] == "rank"]
    ms = statistics.median(r["ms"] for r in steps)
    return ms, ranks
print("## Context parallelism\n")
print("input/llama-long.yaml's LLaMA (2 layers of 64, 4 query / 2 KV heads) at T=8192, one "
      "sequence a step, each rank one thread; attention and exposed communication are the "
      "slowest rank's seconds per step.\n")
print("| cp | K/V | step | attention | exposed cp comm | cp MB sent/step | activations/rank | "
      "peak memory/rank |")
print("|---|---|---|---|---|---|---|---|")
for name in names:
    ms, ranks = read(name)
    cp, mode = name[2], name.split("_")[1]
    att = max(r.get("cp_attention_s_per_step", 0) for r in ranks)
    wait = max(r.get("cp_wait_s_per_step", 0) for r in ranks)
    sent = max(r.get("cp_bytes_per_step", 0) for r in ranks) / 1e6
    act = max(r["activation_bytes"] for r in ranks) / 1e6
    peak = max(r["arena_bytes"] for r in ranks) / 1e6
    att_text = f"{att:.2f} s" if cp != "1" else "(fused, in step)"
    print(f"| {cp} | {mode} | {ms / 1e3:.2f} s | {att_text} | {wait:.3f} s | {sent:.1f} | "
          f"{act:.1f} MB | {peak:.1f} MB |")
ms, ranks = read("long_cp4")
wait = max(r["cp_wait_s_per_step"] for r in ranks)
print(f"\ninput/llama-long.yaml at T=32768 on cp=4: {ms / 1e3:.1f} s a step, "
      f"{max(r['activation_bytes'] for r in ranks) / 1e6:.1f} MB of activations and "
      f"{max(r['arena_bytes'] for r in ranks) / 1e6:.1f} MB in all per rank, exposed cp "
      f"communication {wait:.2f} s a step ({100 * wait / (ms / 1e3):.1f}% of it).")
PY
