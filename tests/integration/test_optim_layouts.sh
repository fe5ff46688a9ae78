#!/usr/bin/env bash
# Adafactor on every layout trains the model it trains on 1 rank (test_layouts.sh's tolerances:
# each of the 10 losses within a relative 1e-5, every final parameter within 1e-4 of its
# tensor's largest). Its row and column statistics are sums over every rank holding a piece of a
# matrix (tp blocks, ZeRO-1 slices cutting rows anywhere, ZeRO-2/3 parts, hybrid groups), and
# its checkpoints restart on another layout: ZeRO-3's parts on (2,2,2) continued on 1 rank, and
# 1 rank's continued on ZeRO-3 in hybrid groups.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck optim_layouts)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1   # up to 8 ranks share 2 cores
common=(model.n_layer=4 model.n_head=4 model.n_embd=32 train.batch_size=8 train.micro_batch=2
        train.steps=10 optim.decay_steps=10 eval.batches=1 log.every=1 optim.name=adafactor
        optim.adafactor_eps=1e-12)

run() {  # run NAME DP TP PP [extra overrides...]
  local name=$1 dp=$2 tp=$3 pp=$4
  shift 4
  timeout 300 $MPIEXEC -n $((dp * tp * pp)) "$TESSERA" train "$deck" "${common[@]}" \
    parallel.dp="$dp" parallel.tp="$tp" parallel.pp="$pp" run.dir="$WORK/$name" "$@" \
    >"$WORK/$name.log" 2>&1
}
check() {  # check REF NAME DP TP PP [extra...]
  local ref=$1 name=$2
  shift 2
  if run "$name" "$@"; then compare_to "$ref" "$name"; else fail "$name run"; tail -3 "$name.log"; fi
}

run ref 1 1 1 || { fail "(1,1,1) run"; tail -5 ref.log; finish; }
check ref dp2 2 1 1
check ref tp2 1 2 1
check ref pp2 1 1 2
check ref dp2_tp2_pp2 2 2 2
# ZeRO-1's flat slices (of 4) cut matrices in mid-row; ZeRO-2 and 3 by units; hybrid groups.
check ref zero1_dp4 4 1 1 parallel.zero=1
check ref zero1_sp_222 2 2 2 parallel.zero=1 parallel.sequence_parallel=true model.attention=fused
check ref zero2_dp4 4 1 1 parallel.zero=2
check ref zero3_hybrid_dp4 4 1 1 parallel.zero=3 parallel.zero_group=2
check ref zero3_sp_222 2 2 2 parallel.zero=3 parallel.sequence_parallel=true model.attention=fused
check ref v2_zero1_222 2 2 2 parallel.zero=1 parallel.virtual_stages=2
# Without a first moment (only the factored statistics and the vectors' second moments).
run ref_b0 1 1 1 optim.beta1=0 || fail "beta1 = 0 (1,1,1) run"
check ref_b0 zero1_222_b0 2 2 2 parallel.zero=1 optim.beta1=0
# LLaMA (q, k, v, gate, up column-split by heads; o, down row-split; untied head).
llama=(model.arch=llama model.n_kv_head=2 model.ffn_multiple=32)
if run llama_ref 1 1 1 "${llama[@]}"; then
  check llama_ref llama_tp2 1 2 1 "${llama[@]}"
  check llama_ref llama_zero1_222 2 2 2 "${llama[@]}" parallel.zero=1 parallel.sequence_parallel=true
else
  fail "llama (1,1,1) run"; tail -3 llama_ref.log
fi

# Checkpoints across layouts: 5 steps on one, 5 more on another, against 10 on 1 rank.
mkdir -p a/checkpoints b/checkpoints
if run a 2 2 2 parallel.zero=3 train.steps=5 &&
   run a 1 1 1 checkpoint.restart=auto; then
  compare_to ref a
else
  fail "(2,2,2) ZeRO-3 then (1,1,1)"; tail -3 a.log
fi
if run b 1 1 1 train.steps=5 &&
   run b 4 1 1 parallel.zero=3 parallel.zero_group=2 checkpoint.restart=auto; then
  compare_to ref b
else
  fail "(1,1,1) then ZeRO-3 hybrid"; tail -3 b.log
fi
# The comparison can fail: Adafactor's statistics summed over one rank's pieces only (a tp
# rank's half) would train another model; here, the clipping threshold changed.
if run clip 1 1 1 optim.adafactor_clip=0.5 &&
   ! "$PYTHON" "$ROOT/tests/integration/compare_runs.py" ref/metrics.jsonl \
     ref/checkpoints/step_00000010.h5 clip/metrics.jsonl clip/checkpoints/step_00000010.h5 >/dev/null; then
  pass "a run with another adafactor_clip is told apart"
else
  fail "compare_runs accepted another adafactor_clip"
fi
finish
