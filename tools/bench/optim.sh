#!/usr/bin/env bash
# `make bench`, optimizer section (tools/bench/all.sh calls it): the update rules side by side on the
# same small GPT-2 (4 layers of 128, T = 64), data and schedule, STEPS steps on the CPU: AdamW,
# Adafactor with a first moment (beta1 0.9) and without (beta1 0: only the factored second
# moment), each on 1 rank and on 2 ranks (dp = 2 with ZeRO-1; tp = 2). Prints a markdown table
# (rule, layout, final train loss (the mean of the last 10 steps), final validation loss,
# tokens/s, the rule's state in bytes per parameter of the rank) and writes it to
# $OUT/optim.md. Every run of a rule trains the same model whatever the layout
# (tests/integration/test_optim_layouts.sh), so its layouts' losses agree to rounding.
#   TESSERA (bin/tessera)  OUT (build/bench)  DATA (data/default, else the test data in
#   build/testdata)  STEPS (300)  LR (2e-3)  THREADS (1)  PYTHON (/usr/bin/python3)  MPIEXEC
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
MPIEXEC=${MPIEXEC:-mpiexec}
TESSERA=${TESSERA:-$ROOT/bin/tessera}
OUT=${OUT:-$ROOT/build/bench}
DATA=${DATA:-$ROOT/data/default}
STEPS=${STEPS:-300}
LR=${LR:-2e-3}
THREADS=${THREADS:-1}
mkdir -p "$OUT"
export OMP_NUM_THREADS=$THREADS MPIR_CVAR_POLLS_BEFORE_YIELD=1
if [ ! -f "$DATA/train.h5" ]; then
  DATA=$ROOT/build/testdata
  [ -f "$DATA/train.h5" ] || "$PYTHON" "$ROOT/tools/data/prepare_data.py" --stdlib --out-dir "$DATA" >/dev/null
fi

# name|overrides: the rules, then the layouts (ranks|overrides).
rules=("adamw|optim.name=adamw" "adafactor|optim.name=adafactor"
       "adafactor_beta1_0|optim.name=adafactor optim.beta1=0")
layouts=("1 rank|1|" "dp=2 ZeRO-1|2|parallel.dp=2 parallel.zero=1" "tp=2|2|parallel.tp=2")
cat >"$OUT/optim.yaml" <<DECK
model: {n_layer: 4, n_head: 4, n_embd: 128, block_size: 64}
data: {train: "$DATA/train.h5", val: "$DATA/val.h5", seq_len: 64}
train: {steps: $STEPS, batch_size: 16, micro_batch: 8, seed: 29}
optim: {lr: $LR, min_lr: $(awk "BEGIN {print $LR / 10}"), warmup_steps: 20, decay_steps: $STEPS}
eval: {every: 0, batches: 16}
checkpoint: {every: 0, restart: none}
log: {every: 1, peak_gflops: 50}
DECK
runs=()
for rule in "${rules[@]}"; do
  for layout in "${layouts[@]}"; do
    IFS='|' read -r rname rover <<<"$rule"
    IFS='|' read -r lname ranks lover <<<"$layout"
    run=$OUT/optim_${rname}_$(echo "$lname" | tr -c 'a-zA-Z0-9\n' '_')
    rm -rf "$run"
    echo "bench_optim: $rname on $lname, $STEPS steps" >&2
    # shellcheck disable=SC2086  # the overrides are words
    $MPIEXEC -n "$ranks" "$TESSERA" train "$OUT/optim.yaml" $rover $lover run.dir="$run" \
      checkpoint.dir="$run/ckpt" >"$run.log" 2>&1 || { tail -5 "$run.log" >&2; exit 1; }
    runs+=("$rname|$lname|$run")
  done
done

"$PYTHON" - "$STEPS" "${runs[@]}" <<'PY' | tee "$OUT/optim.md"
import json, statistics, sys
steps = sys.argv[1]
print(f"## Update rules (GPT-2 4 x 128, T = 64, batch 16, {steps} steps, CPU)\n")
print("| rule | layout | final train loss | final val loss | tokens/s | state bytes/param (rank 0) |")
print("|---|---|---|---|---|---|")
for spec in sys.argv[2:]:
    rule, layout, run = spec.split("|")
    rows = [json.loads(l) for l in open(run + "/metrics.jsonl")]
    train = [r for r in rows if r["type"] == "train"]
    val = [r["val_loss"] for r in rows if r["type"] == "eval"][-1]
    rank = next(r for r in rows if r["type"] == "rank" and r["rank"] == 0)
    params = rank["param_bytes"] / 4
    tps = statistics.median(r["tokens_per_s"] for r in train[1:])
    last = statistics.mean(r["loss"] for r in train[-10:])
    print(f"| {rule} | {layout} | {last:.4f} | {val:.4f} | {tps:.0f} | "
          f"{rank['optim_bytes'] / params:.2f} |")
print("\nState bytes/param: the rule's state on rank 0 over the parameters it holds (AdamW 8; "
      "Adafactor 4 for its first moment plus its vectors' second moments and each matrix's row "
      "and column statistics; under ZeRO-1 a 1/dp share of what is sharded). A rule's layouts "
      "start equal to rounding and drift as rounding grows in training; without a first moment "
      "Adafactor's trajectory is chaotic at this learning rate: on one rank, adafactor_eps "
      "1e-30 against 1.0001e-30 moves the step-60 loss by about 1e-2, as much as tp = 2 does.")
PY
