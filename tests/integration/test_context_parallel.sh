#!/usr/bin/env bash
# Context parallelism (parallel.cp; model/context_attention.hpp): each sequence split over cp
# ranks in 2 x cp chunks, attention's K/V passed round a ring or all-gathered. Every layout
# trains the 1-rank model: its 10 losses to a relative 1e-5 and its final parameters to 1e-4 of
# each tensor's largest magnitude (compare_runs.py, as test_layouts.sh).
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck cp)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1   # up to 8 ranks share 2 cores
# 4 layers (pp 2), 4 heads (tp 2), T = 16: cp = 4 cuts it into 8 chunks of 2.
common=(model.n_layer=4 model.n_head=4 model.n_embd=32 train.batch_size=8 train.micro_batch=2
        train.steps=10 optim.decay_steps=10 optim.eps=1e-6 eval.batches=1 log.every=1
        model.attention=fused)

run() {  # run NAME DP CP TP PP [extra overrides...]
  local name=$1 dp=$2 cp=$3 tp=$4 pp=$5
  shift 5
  timeout 300 $MPIEXEC -n $((dp * cp * tp * pp)) "$TESSERA" train "$deck" "${common[@]}" \
    parallel.dp="$dp" parallel.cp="$cp" parallel.tp="$tp" parallel.pp="$pp" \
    run.dir="$WORK/$name" "$@" >"$WORK/$name.log" 2>&1
}
compare_to() {  # compare_to REF NAME: NAME against the run REF
  local out
  if out=$("$PYTHON" "$ROOT/tests/integration/compare_runs.py" "$WORK/$1/metrics.jsonl" \
       "$WORK/$1/checkpoints/step_00000010.h5" "$WORK/$2/metrics.jsonl" \
       "$WORK/$2/checkpoints/step_00000010.h5"); then
    pass "$2: $out"
  else
    fail "$2: $out"; tail -3 "$WORK/$2.log" | sed 's/^/    /'
  fi
}
layout() {  # layout REF NAME DP CP TP PP [extra...]: run NAME and compare it with REF
  local ref=$1 name=$2
  shift 2
  if run "$name" "$@"; then compare_to "$ref" "$name"; else fail "$name run"; tail -5 "$name.log"; fi
}

run ref 1 1 1 1 || { fail "(1,1,1) run"; tail -5 ref.log; finish; }
layout ref cp2 1 2 1 1
layout ref cp4 1 4 1 1
layout ref cp2_allgather 1 2 1 1 parallel.cp_comm=allgather
layout ref dp2_cp2_tp2 2 2 2 1 parallel.zero=1
layout ref cp2_pp2_1f1b 1 2 1 2 parallel.schedule=1f1b
# The start-up lines name each rank's cp coordinate (rank = ((pp*dp + dp)*cp + cp)*tp + tp).
if grep -q "rank 5: dp 1 cp 0 tp 1 pp 0" dp2_cp2_tp2.log; then pass "start-up names the cp coordinate"
else fail "start-up line of rank 5 in (dp2,cp2,tp2)"; grep "rank 5" dp2_cp2_tp2.log; fi
# LLaMA: grouped-query attention (only the 2 KV heads travel) and RoPE at the true positions.
llama=(model.arch=llama model.n_kv_head=2 model.ffn_multiple=32)
if run llama_ref 1 1 1 1 "${llama[@]}"; then
  layout llama_ref llama_cp4 1 4 1 1 "${llama[@]}"
else
  fail "llama (1,1,1) run"; tail -5 llama_ref.log
fi
finish
