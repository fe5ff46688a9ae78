#!/usr/bin/env bash
# `make bench`, mixture-of-experts section (tools/bench/all.sh calls it): a small MoE (LLaMA
# blocks, 4 layers of 128, 8 experts of width 128, top-2) against the dense model of the same
# active parameters (its MLP of width 2 x 128 = 256: what one token multiplies by in either),
# same data and schedule, STEPS steps on the CPU; then the MoE with its experts split over
# ep = 2 and 4 data-parallel ranks (parallel.ep). Prints a markdown table (model, layout, final
# train loss (mean of the last 10 steps), final val loss, tokens/s, the worst layer's busiest
# expert over the mean at the end, the all-to-all bytes per rank and step against
# FORMULAS.md's balanced count 4 k b T C (ep - 1) / ep x 4 bytes per MoE layer and micro-batch,
# and the seconds a step was blocked in it) and writes it to $OUT/moe.md.
#   TESSERA (bin/tessera)  OUT (build/bench)  DATA (data/default, else the test data in
#   build/testdata)  STEPS (200)  THREADS (1)  PYTHON (/usr/bin/python3)  MPIEXEC
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
MPIEXEC=${MPIEXEC:-mpiexec}
TESSERA=${TESSERA:-$ROOT/bin/tessera}
OUT=${OUT:-$ROOT/build/bench}
DATA=${DATA:-$ROOT/data/default}
STEPS=${STEPS:-200}
THREADS=${THREADS:-1}
mkdir -p "$OUT"
export OMP_NUM_THREADS=$THREADS MPIR_CVAR_POLLS_BEFORE_YIELD=1
if [ ! -f "$DATA/train.h5" ]; then
  DATA=$ROOT/build/testdata
  [ -f "$DATA/train.h5" ] || "$PYTHON" "$ROOT/tools/data/prepare_data.py" --stdlib --out-dir "$DATA" >/dev/null
fi
L=4 C=128 T=64 B=16 MB=4 E=8 K=2 F=128
cat >"$OUT/moe.yaml" <<DECK
model: {arch: llama, n_layer: $L, n_head: 4, n_embd: $C, block_size: $T, ffn_hidden: $((K * F))}
data: {train: "$DATA/train.h5", val: "$DATA/val.h5", seq_len: $T}
train: {steps: $STEPS, batch_size: $B, micro_batch: $MB, seed: 31}
optim: {lr: 2e-3, min_lr: 2e-4, warmup_steps: 20, decay_steps: $STEPS}
eval: {every: 0, batches: 16}
checkpoint: {every: 0, restart: none}
log: {every: 1, peak_gflops: 50}
DECK
moe="model.moe.experts=$E model.moe.top_k=$K model.moe.ffn=$F model.moe.aux_loss=0.01"
# name|ranks|ep|overrides
runs=("dense, MLP $((K * F))|1|1|" "MoE $E x $F top-$K|1|1|$moe"
      "MoE, ep = 2|2|2|$moe parallel.dp=2 parallel.ep=2"
      "MoE, ep = 4|4|4|$moe parallel.dp=4 parallel.ep=4" "MoE, dp = 4, ep = 1|4|1|$moe parallel.dp=4")
done_runs=()
for spec in "${runs[@]}"; do
  IFS='|' read -r name ranks ep over <<<"$spec"
  run=$OUT/moe_$(echo "$name" | tr -c 'a-zA-Z0-9\n' '_')
  rm -rf "$run"
  echo "bench_moe: $name on $ranks ranks, $STEPS steps" >&2
  # shellcheck disable=SC2086  # the overrides are words
  $MPIEXEC -n "$ranks" "$TESSERA" train "$OUT/moe.yaml" $over run.dir="$run" \
    checkpoint.dir="$run/ckpt" >"$run.log" 2>&1 || { tail -5 "$run.log" >&2; exit 1; }
  done_runs+=("$name|$ranks|$ep|$run")
done

"$PYTHON" - "$STEPS" "$L" "$C" "$T" "$MB" "$K" "${done_runs[@]}" <<'PY' | tee "$OUT/moe.md"
import json, statistics, sys
steps, L, C, T, mb, k = (int(x) for x in sys.argv[1:7])
print(f"## Mixture of experts (LLaMA {L} x {C}, T = {T}, micro-batches of {mb}, {steps} steps, "
      "CPU)\n")
print("| model | ranks | final train loss | final val loss | tokens/s | load max/mean | "
      "all-to-all MB/rank/step | against the formula | blocked in it |")
print("|---|---|---|---|---|---|---|---|---|")
for spec in sys.argv[7:]:
    name, ranks, ep, run = spec.split("|")
    ep = int(ep)
    rows = [json.loads(l) for l in open(run + "/metrics.jsonl")]
    train = [r for r in rows if r["type"] == "train"]
    val = [r["val_loss"] for r in rows if r["type"] == "eval"][-1]
    tps = statistics.median(r["tokens_per_s"] for r in train[1:])
    last = statistics.mean(r["loss"] for r in train[-10:])
    load = max(train[-1]["moe_load"]) if "moe_load" in train[-1] else None
    a2a = statistics.mean(r.get("moe_a2a_bytes", 0) for r in train[1:])
    secs = statistics.mean(r.get("moe_a2a_s", 0) for r in train[1:])
    ms = statistics.median(r["ms"] for r in train[1:])
    micro = 16 // (int(ranks) * mb)
    formula = 4 * k * mb * T * C * (ep - 1) / ep * 4 * L * micro
    ratio = f"{a2a / formula:.3f}" if formula else ""
    print(f"| {name} | {ranks} | {last:.4f} | {val:.4f} | {tps:.0f} | "
          f"{'' if load is None else f'{load:.2f}'} | {a2a / 1e6:.3f} | {ratio} | "
          f"{'' if ep == 1 else f'{secs * 1e3:.1f} ms of {ms:.0f} ms'} |")
print("\nThe dense model's MLP has the MoE's active width (top-2 of experts of 128): the same "
      "FLOPs per token. The MoE's layouts train the same model (tests/integration/"
      "test_moe_layouts.sh): their losses start equal to rounding and drift apart as training's rounding grows; the all-to-all counts the bytes a "
      "rank sends to the other ep ranks (rows out and outputs back, forward and backward), "
      "against the balanced count, which the routing's imbalance moves either way.")
PY
