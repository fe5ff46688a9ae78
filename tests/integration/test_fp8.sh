#!/usr/bin/env bash
# FP8 training simulated on the CPU (device.precision: fp8, docs/fp8.md): it trains near
# fp32; the delayed-scaling state goes into the checkpoint, so 10 steps straight equal 5 + a
# restart + 5 to the bit, and a restart on another layout goes on from it; tensor-parallel,
# pipeline and data-parallel layouts equal the 1-rank fp8 run within the bf16 tolerances of
# tests/gpu/test_trainer.sh (the FP8 grid turns a reduction-order difference into a rounding
# step now and then); ZeRO-3's codes gathered equal the values gathered to the bit, and halve the
# layers' gather bytes; a NaN gradient is skipped by the anomaly policy and leaves the amax
# histories as they were; the deck's FP8 errors are one line each.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck fp8)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1
# 4 layers (pp 2), 4 heads (tp 2), micro-batches of 2; the LM head in FP8 too (fp8_head).
common=(model.n_layer=4 model.n_head=4 model.n_embd=32 train.batch_size=8 train.micro_batch=2
        optim.decay_steps=10 eval.every=5 eval.batches=1 log.every=1 device.precision=fp8
        device.fp8_head=true)

run() {  # run NAME RANKS [overrides...]
  local name=$1 ranks=$2
  shift 2
  timeout 300 $MPIEXEC -n "$ranks" "$TESSERA" train "$deck" "${common[@]}" run.dir="$WORK/$name" \
    "$@" >"$WORK/$name.log" 2>&1
}
compare() {  # compare REF NAME [compare_runs.py options]: the step-10 checkpoints and losses
  local ref=$1 name=$2 out
  shift 2
  if out=$("$PYTHON" "$ROOT/tests/integration/compare_runs.py" "$ref/metrics.jsonl" \
       "$ref/checkpoints/step_00000010.h5" "$name/metrics.jsonl" \
       "$name/checkpoints/step_00000010.h5" "$@"); then
    pass "$name: $out"
  else
    fail "$name: $out"; tail -3 "$name.log" | sed 's/^/    /'
  fi
}

run ref 1 checkpoint.every=5 || { fail "1-rank fp8 run"; tail -5 ref.log; finish; }
# Trains, near fp32 (the same deck in fp32).
timeout 300 $MPIEXEC -n 1 "$TESSERA" train "$deck" "${common[@]:0:9}" run.dir="$WORK/fp32" \
  >fp32.log 2>&1 || fail "fp32 run"
compare fp32 ref --loss-rtol 2e-2 --param-norm-tol 5e-2

# The histories in the checkpoint: 4 layers x 12 rows + the head's 3, 16 entries, newest first.
if "$PYTHON" - ref/checkpoints/step_00000010.h5 <<'EOF'
import sys, h5py, numpy as np
h = h5py.File(sys.argv[1])["train/fp8_amax_history"][()]
assert h.shape == (51, 16), h.shape
assert (h[:, :10] > 0).all() and (h[:, 10:] == -1).all(), h[:, 8:12]
print(f"{h.shape[0]} rows, 10 steps each, amax {h[:, 0].min():.3g} .. {h[:, 0].max():.3g}")
EOF
then pass "the checkpoint holds every layer's amax history"; else fail "amax histories"; fi

# Restart: 5 steps, a restart from step 5, 5 more: bit-identical to 10 straight.
run split 1 checkpoint.every=5 train.steps=5 || fail "first half"
run split 1 checkpoint.every=5 checkpoint.restart=auto || fail "second half"
compare ref split --exact

# Restart from the 1-rank step-5 checkpoint on (tp, pp) = (2, 2): the histories move with it.
mkdir -p moved/checkpoints && cp ref/checkpoints/step_00000005.h5 moved/checkpoints/
run moved 4 parallel.tp=2 parallel.pp=2 checkpoint.restart=auto checkpoint.every=5 ||
  { fail "restart on tp=2, pp=2"; tail -3 moved.log; }
if grep -q "restart: .*step_00000005.h5" moved.log; then
  compare ref moved --steps 6:10 --loss-rtol 2e-2 --param-norm-tol 2e-2
else
  fail "moved: did not restart from step 5"; head -5 moved.log
fi

# Layouts against the 1-rank fp8 run; and (2,2,2) with ZeRO-3, sequence parallelism, the fused
# attention and full recompute (the backward's rerun of the forward rounds the same values), and
# context parallelism.
for layout in "1 2 1" "1 1 2" "2 2 1" \
              "2 2 2 parallel.zero=3 parallel.sequence_parallel=true model.attention=fused train.recompute=full" \
              "1 1 1 parallel.cp=2 model.attention=fused"; do
  set -- $layout
  name="dp$1_tp$2_pp$3$(echo "${*:4}" | sed 's/[a-z_]*\.//g; s/=//g; s/ /_/g; s/^./_&/')"
  ranks=$(($1 * $2 * $3 * $(echo "${*:4}" | grep -q 'cp=2' && echo 2 || echo 1)))
  if run "$name" "$ranks" parallel.dp="$1" parallel.tp="$2" parallel.pp="$3" "${@:4}" checkpoint.every=5; then
    compare ref "$name" --loss-rtol 2e-2 --param-norm-tol 2e-2
  else
    fail "$name run"; tail -5 "$name.log"
  fi
done
# LLaMA (SwiGLU's gate and up in one FP8 GEMM, no biases): tp = 2 against 1 rank.
llama=(model.arch=llama model.n_kv_head=2)
run llama_ref 1 "${llama[@]}" checkpoint.every=5 || { fail "llama fp8 run"; tail -3 llama_ref.log; }
run llama_tp2 2 "${llama[@]}" parallel.tp=2 checkpoint.every=5 || { fail "llama tp=2 run"; tail -3 llama_tp2.log; }
compare llama_ref llama_tp2 --loss-rtol 2e-2 --param-norm-tol 2e-2

# A NaN gradient at step 3: skipped, and the histories of the next checkpoint (step 3, the good
# retry) are step 2's shifted by one entry: the NaN step's amaxes never went in.
TESSERA_TEST_NAN_STEP=3 run nan 1 train.steps=4 train.anomaly_action=skip checkpoint.every=1
if grep -q "^anomaly: step 3: grad_norm nan is not finite .*: skip: update dropped" nan.log &&
   "$PYTHON" - nan/checkpoints/step_00000002.h5 nan/checkpoints/step_00000003.h5 <<'EOF'
import sys, h5py, numpy as np
a, b = (h5py.File(p)["train/fp8_amax_history"][()] for p in sys.argv[1:])
assert np.isfinite(b).all() and (b[:, 0] > 0).all() and (b[:, 3:] == -1).all(), b[:, :4]
assert np.array_equal(b[:, 1:], a[:, :-1]), "the history moved by more than the good step"
EOF
then pass "a NaN gradient: step skipped, amax histories untouched"
else fail "NaN step"; grep anomaly nan.log | head -3; fi

# Under ZeRO-3 the weights' codes take turns in two layers' places (model/fp8.hpp): LLaMA 7B's
# FSDP deck on 64 ranks holds its parameters' shard plus two layers' codes and transposes (2 x
# 202.4 M GEMM weights x 2 bytes), not 2 bytes for every parameter (13.6 GB a rank before).
params_mb() {  # the `tessera plan` line's parameters of rank 0, in MB
  "$TESSERA" plan "$ROOT/input/llama-7b-fsdp.yaml" --ranks 64 "$@" 2>&1 |
    sed -n 's/.*stage 0 tp 0: parameters \([0-9.]*\) \([MG]\)B.*/\1 \2/p' |
    awk '{print $2 == "G" ? $1 * 1000 : $1}'
}
bf16_mb=$(params_mb) fp8_mb=$(params_mb device.precision=fp8)
layer=$(( 4 * 4096 * 4096 + 3 * 4096 * 11008 ))
if awk -v a="$bf16_mb" -v b="$fp8_mb" -v w="$layer" \
     'BEGIN { d = b - a; want = 2 * w * 2 / 1e6; exit !(a > 0 && d > 0.999 * want && d < 1.001 * want) }'; then
  pass "ZeRO-3 fp8 on LLaMA 7B: parameters $fp8_mb MB a rank, bf16's $bf16_mb MB + two layers' codes"
else
  fail "ZeRO-3 fp8 on LLaMA 7B: parameters '$fp8_mb' MB a rank against bf16's '$bf16_mb' MB"
fi

# ... and gathers the layers' GEMM weights as their one-byte codes (optim/sharded_weights.hpp):
# the bytes a step hands the dp group drop by half a bf16 gather of every layer, twice (forward
# and backward) each micro-batch, less the norms that still travel as values.
dp_plan() {  # the plan's rank-0 dp bytes per step and micro-batches
  "$TESSERA" plan "$ROOT/input/llama-7b-fsdp.yaml" --ranks 64 --json "$@" 2>/dev/null |
    "$PYTHON" -c 'import json, sys; d = json.load(sys.stdin); print(d["roles"][0]["dp_bytes_per_step"], d["micro_batches"])'
}
read -r bf16_dp micro <<<"$(dp_plan)"
read -r fp8_dp _ <<<"$(dp_plan device.precision=fp8)"
layer=$(( 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096 ))
if awk -v a="$bf16_dp" -v b="$fp8_dp" -v m="$micro" -v w="$layer" \
     'BEGIN { want = m * 2 * 32 * w; d = a - b; exit !(a > 0 && d > 0.995 * want && d <= want) }'; then
  pass "ZeRO-3 fp8 on LLaMA 7B: dp bytes a step $fp8_dp against bf16's $bf16_dp (the layers' gathers in codes)"
else
  fail "ZeRO-3 fp8 on LLaMA 7B: dp bytes a step '$fp8_dp' against bf16's '$bf16_dp' ($micro micro-batches)"
fi
# The codes gathered (and the norms packed) give the run of the values gathered once a step
# (reshard_after_forward: false) to the bit: GPT-2 with tp, LLaMA on four parts, GPT-2 in
# hybrid groups of two.
for layout in "2 2 gpt2" "4 1 llama" "4 1 gpt2 parallel.zero_group=2"; do
  set -- $layout
  name=$3$(echo "${*:4}" | tr -cd 'a-z0-9')
  extra=(parallel.dp="$1" parallel.tp="$2" parallel.zero=3 model.arch="$3" checkpoint.every=5 "${@:4}")
  [ "$3" = llama ] && extra+=(model.n_kv_head=2)
  if run "z3codes_$name" $(($1 * $2)) "${extra[@]}" &&
     run "z3values_$name" $(($1 * $2)) "${extra[@]}" parallel.reshard_after_forward=false; then
    compare "z3values_$name" "z3codes_$name" --exact
  else
    fail "ZeRO-3 $name runs"; tail -3 "z3codes_$name.log" "z3values_$name.log"
  fi
done

# The deck's FP8 errors.
expect_error "fp8 key without fp8" 2 "device.fp8_margin=1: device.fp8_margin needs device.precision: fp8 \(got 'fp32'\)$" \
  "$TESSERA" train "$deck" device.fp8_margin=1
expect_error "bad fp8 format" 2 "device.fp8_format=e5m2: must be hybrid or e4m3, got 'e5m2'$" \
  "$TESSERA" train "$deck" device.precision=fp8 device.fp8_format=e5m2
# A margin that would scale every E4M3 code to zero (from 19 on) is refused, naming the bound.
expect_error "fp8 margin past E4M3's range" 2 "device.fp8_margin=30: must be <= 14 \(beyond it a tensor's largest values are subnormal in E4M3, and from 19 on every value rounds to zero\), got 30$" \
  "$TESSERA" train "$deck" device.precision=fp8 device.fp8_margin=30
finish
