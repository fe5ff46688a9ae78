#!/usr/bin/env bash
# Layout equivalence, the central test: the same deck trains the same model on every layout.
# Each layout's 10 losses agree with the 1-rank run to a relative 1e-5, and its final parameters
# (read back from its checkpoint) to 1e-4 of each tensor's largest magnitude.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck layouts)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1   # up to 8 ranks share 2 cores
# 4 layers (pp up to 4), 4 heads (tp 2), micro-batches of 2 so pipelines run 2 to 4 of them.
# optim.eps = 1e-6 for the reason given in test_parity.sh (the key bias's zero gradient).
common=(model.n_layer=4 model.n_head=4 model.n_embd=32 train.batch_size=8 train.micro_batch=2
        train.steps=10 optim.decay_steps=10 optim.eps=1e-6 eval.batches=1 log.every=1)

run() {  # run NAME DP TP PP [extra overrides...]
  local name=$1 dp=$2 tp=$3 pp=$4
  shift 4
  timeout 300 $MPIEXEC -n $((dp * tp * pp)) "$TESSERA" train "$deck" "${common[@]}" \
    parallel.dp="$dp" parallel.tp="$tp" parallel.pp="$pp" run.dir="$WORK/$name" "$@" \
    >"$WORK/$name.log" 2>&1
}
compare() { compare_to ref "$1"; }  # against the (1,1,1) run

run ref 1 1 1 || { fail "(1,1,1) run"; tail -5 ref.log; finish; }
for layout in "2 1 1" "1 2 1" "1 1 2" "2 2 1" "1 2 2" "2 1 2" "2 2 2"; do
  set -- $layout
  name="dp$1_tp$2_pp$3"
  if run "$name" "$1" "$2" "$3" parallel.schedule=1f1b; then compare "$name"; else fail "$name run"; tail -5 "$name.log"; fi
done
for schedule in gpipe 1f1b; do
  if run "pp4_$schedule" 1 1 4 parallel.schedule=$schedule; then compare "pp4_$schedule"; else fail "pp4_$schedule run"; tail -5 "pp4_$schedule.log"; fi
done
for dp in 2 4; do
  if run "zero1_dp$dp" "$dp" 1 1 parallel.zero=1; then compare "zero1_dp$dp"; else fail "zero1_dp$dp run"; tail -5 "zero1_dp$dp.log"; fi
done
# The fused attention (no T x T matrix) trains the same model as the 1-rank gemm attention, and
# so do sequence parallelism (with ZeRO-1, recompute and both schedules). ZeRO-1 and the fused
# attention on (2,2,2) are each checked inside the combined runs below (and alone in
# test_comm_volume.sh and the emulated suite), not once more on their own.
for extra in "2 2 2 parallel.zero=1 model.attention=fused train.recompute=selective parallel.schedule=gpipe" \
             "1 2 1 train.recompute=full"; do
  set -- $extra
  name="sp_dp$1_tp$2_pp$3"
  if run "$name" "$@" parallel.sequence_parallel=true; then compare "$name"; else fail "$name run"; tail -5 "$name.log"; fi
done
# The interleaved 1F1B schedule: two chunks of layers per stage (layers 0, 2 on stage 0).
for extra in "1 1 2" "2 2 2 parallel.zero=1 parallel.sequence_parallel=true model.attention=fused"; do
  set -- $extra
  name="v2_dp$1_tp$2_pp$3"
  if run "$name" "$@" parallel.virtual_stages=2; then compare "$name"; else fail "$name run"; tail -5 "$name.log"; fi
done
# ZeRO-2 and 3 (gradients, and parameters, sharded by unit over dp): alone, in hybrid groups of
# 2 dp ranks, on (2,2,2) with sequence parallelism and the fused attention (the tied embedding's
# parts summed between the stages), and under interleaved stages keeping the gathered
# parameters from the forward (reshard_after_forward: false).
for extra in "4 1 1 parallel.zero=2" "4 1 1 parallel.zero=3" "4 1 1 parallel.zero=3 parallel.zero_group=2" \
             "2 2 2 parallel.zero=3 parallel.sequence_parallel=true model.attention=fused" \
             "2 1 2 parallel.zero=3 parallel.virtual_stages=2 parallel.reshard_after_forward=false"; do
  set -- $extra
  name="zero_dp$1_tp$2_pp$3_$(echo "${*:4}" | sed 's/parallel\.//g; s/model\.//g; s/=//g; s/ /_/g')"
  if run "$name" "$@"; then compare "$name"; else fail "$name run"; tail -5 "$name.log"; fi
done
# LLaMA blocks (grouped-query attention, untied head): the 1-rank run against tp=2, against
# (2,2,2) with everything at once (ZeRO-1, sequence parallelism, selective recompute, fused
# attention, interleaved stages), and against ZeRO-3 on dp=4 with full recompute (each layer's
# parameters gathered for its forward, and again for the backward's rerun).
llama=(model.arch=llama model.n_kv_head=2 model.ffn_multiple=32)
if run llama_ref 1 1 1 "${llama[@]}"; then
  for extra in "1 2 1" "2 2 2 parallel.zero=1 parallel.sequence_parallel=true train.recompute=selective model.attention=fused parallel.virtual_stages=2" \
               "4 1 1 parallel.zero=3 train.recompute=full"; do
    set -- $extra
    name="llama_dp$1_tp$2_pp$3"
    if run "$name" "$@" "${llama[@]}"; then compare_to llama_ref "$name"; else fail "$name run"; tail -5 "$name.log"; fi
  done
else
  fail "llama (1,1,1) run"; tail -5 llama_ref.log
fi
# The comparison can fail: a different seed is caught.
if run seed 1 1 1 train.seed=8 &&
   ! "$PYTHON" "$ROOT/tests/integration/compare_runs.py" ref/metrics.jsonl \
     ref/checkpoints/step_00000010.h5 seed/metrics.jsonl seed/checkpoints/step_00000010.h5 >/dev/null; then
  pass "a run with another seed is told apart"
else
  fail "compare_runs accepted a different model"
fi
finish
