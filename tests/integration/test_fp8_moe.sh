#!/usr/bin/env bash
# FP8 training of mixture-of-experts models (device.precision fp8 with model.moe, docs/fp8.md):
# the attention's, the shared experts' and the routed experts' GEMMs on FP8 codes (each expert's
# weight at a scale of its own, the dispatched rows at one per layer and role), the router in
# fp32. The loss falls and stays near the fp32 run of the same deck; the checkpoint holds the
# experts' amax histories after the layers' and the head's; 5 steps + restart + 5 equal 10
# straight to the bit, and a restart on ep = 2 from the 1-rank step-5 checkpoint continues the
# 1-rank run (the histories are layout-free); ep = 2 (dp 2), ep2 x tp2, ep2 x ZeRO-1 and 3, pp 2
# and ep2 x cp2 equal the 1-rank fp8 run within the fp8 suite's tolerances (test_fp8.sh); LLaMA's
# SwiGLU experts with a shared expert on ep2 x tp2 likewise.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck fp8_moe)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1
common=(model.n_layer=4 model.n_head=4 model.n_embd=32 train.batch_size=8 train.micro_batch=2
        optim.decay_steps=10 eval.every=5 eval.batches=1 log.every=1 checkpoint.every=5
        model.moe.experts=4 model.moe.top_k=2 model.moe.ffn=64 model.moe.aux_loss=0.01
        model.moe.every=2 device.precision=fp8 device.fp8_head=true)
llama=(model.arch=llama model.n_kv_head=2 model.moe.every=1 model.moe.shared_experts=1)

run() {  # run NAME RANKS [overrides...]
  local name=$1 ranks=$2
  shift 2
  timeout 300 $MPIEXEC -n "$ranks" "$TESSERA" train "$deck" "${common[@]}" run.dir="$WORK/$name" \
    "$@" >"$WORK/$name.log" 2>&1
}

run ref 1 || { fail "1-rank fp8 MoE run"; tail -5 ref.log; finish; }
# Trains (the loss falls by a tenth), near fp32: the same deck without the fp8 keys.
timeout 300 $MPIEXEC -n 1 "$TESSERA" train "$deck" "${common[@]:0:15}" run.dir="$WORK/fp32" \
  >fp32.log 2>&1 || fail "fp32 MoE run"
compare_to fp32 ref --loss-rtol 2e-2 --param-norm-tol 5e-2
if out=$("$PYTHON" - ref/metrics.jsonl <<'EOF'
import json, sys
loss = [r["loss"] for r in map(json.loads, open(sys.argv[1])) if r["type"] == "train"]
assert len(loss) == 10 and loss[-1] < 0.9 * loss[0], loss
print(f"loss {loss[0]:.4f} -> {loss[-1]:.4f}")
EOF
); then pass "fp8 MoE trains: $out"; else fail "fp8 MoE loss: $out"; fi

# The histories: 4 layers x 12 rows, the head's 3, then each of the 2 MoE layers' experts'
# 2 x (2 + 4) (fc1's and fc2's rows' input and output gradient, each expert's weight), every
# one recorded at each of the 10 steps; but the MoE layers' (1 and 3) dense MLP rows, 0: without
# shared experts they have none.
if out=$("$PYTHON" - ref/checkpoints/step_00000010.h5 <<'EOF'
import sys, h5py, numpy as np
h = h5py.File(sys.argv[1])["train/fp8_amax_history"][()]
assert h.shape == (51 + 24, 16), h.shape
assert (h[:, 10:] == -1).all(), h[:, 8:12]
mlp = np.zeros(len(h), bool)
for l in (1, 3):
    mlp[l * 12 + 6:l * 12 + 12] = True
assert (h[mlp, :10] == 0).all() and (h[~mlp, :10] > 0).all(), np.argwhere(h[:, :10] <= 0)[:5]
e = h[51:, 0].reshape(2, 2, 6)  # MoE layer, GEMM (fc1, fc2), rows
print(f"{h.shape[0]} rows; the experts' weights' amaxes {e[:, :, 2:].min():.3g} .. {e[:, :, 2:].max():.3g}, "
      f"their rows' inputs {e[:, :, 0].min():.3g} .. {e[:, :, 0].max():.3g}, "
      f"output gradients {e[:, :, 1].min():.3g} .. {e[:, :, 1].max():.3g}")
EOF
); then pass "the checkpoint holds the experts' amax histories: $out"
else fail "experts' amax histories: $out"; fi

# 5 steps, a restart, 5 more: bit-identical to 10 straight.
run split 1 train.steps=5 || fail "first half"
run split 1 checkpoint.restart=auto || fail "second half"
compare_to ref split --exact
# The 1-rank step-5 checkpoint restarted on ep = 2: steps 6-10 are the 1-rank run's (measured
# 5e-9 in the parameters); without the experts' histories their first step would run in fp32.
mkdir -p moved/checkpoints && cp ref/checkpoints/step_00000005.h5 moved/checkpoints/
run moved 2 parallel.dp=2 parallel.ep=2 checkpoint.restart=auto ||
  { fail "restart on ep=2"; tail -3 moved.log; }
compare_to ref moved --steps 6:10 --loss-rtol 1e-6 --param-norm-tol 1e-5

# Layouts against the 1-rank fp8 run.
for layout in "ep2 2 1 1 parallel.ep=2" "ep2_tp2 2 2 1 parallel.ep=2" \
              "ep2_zero1 2 1 1 parallel.ep=2 parallel.zero=1" \
              "ep2_zero3 2 1 1 parallel.ep=2 parallel.zero=3" \
              "pp2 1 1 2 parallel.schedule=1f1b" \
              "ep2_cp2 1 1 1 parallel.cp=2 parallel.ep=2 model.attention=fused"; do
  set -- $layout
  ranks=$(($2 * $3 * $4 * $(echo "${*:5}" | grep -q 'cp=2' && echo 2 || echo 1)))
  if run "$1" "$ranks" parallel.dp="$2" parallel.tp="$3" parallel.pp="$4" "${@:5}"; then
    compare_to ref "$1" --loss-rtol 2e-2 --param-norm-tol 2e-2
  else
    fail "$1 run"; tail -5 "$1.log"
  fi
done
# LLaMA: SwiGLU's gate and up of each expert in one FP8 GEMM, every layer MoE, a shared expert
# (the dense MLP's FP8 GEMMs); ep2 x tp2 against 1 rank.
run llama_ref 1 "${llama[@]}" || { fail "llama fp8 MoE run"; tail -3 llama_ref.log; }
run llama_ep2_tp2 4 "${llama[@]}" parallel.dp=2 parallel.tp=2 parallel.ep=2 ||
  { fail "llama ep2 x tp2 run"; tail -3 llama_ep2_tp2.log; }
compare_to llama_ref llama_ep2_tp2 --loss-rtol 2e-2 --param-norm-tol 2e-2
finish
