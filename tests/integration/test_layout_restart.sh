#!/usr/bin/env bash
# Checkpoints across layouts: a run saved on (dp,tp,pp) = (2,2,2) at step 5 restarts on (1,1,1),
# (4,1,2) and (1,2,4) with no conversion, and the next 5 losses match an uninterrupted (1,1,1) run
# to 1e-5. On its own layout the restart stays bit-identical. A LLaMA checkpoint does the same.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck lr)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1
common=(model.n_layer=4 model.n_head=4 model.n_embd=32 train.batch_size=8 train.micro_batch=1
        optim.decay_steps=10 optim.eps=1e-6 eval.batches=1 log.every=1)

run() {  # run NAME DP TP PP [extra overrides...]
  local name=$1 dp=$2 tp=$3 pp=$4
  shift 4
  timeout 300 $MPIEXEC -n $((dp * tp * pp)) "$TESSERA" train "$deck" "${common[@]}" \
    parallel.dp="$dp" parallel.tp="$tp" parallel.pp="$pp" run.dir="$WORK/$name" "$@" \
    >"$WORK/$name.log" 2>&1 || { fail "$name run"; tail -5 "$WORK/$name.log" | sed 's/^/    /'; return 1; }
}
compare() {  # compare NAME REF [args]: steps 6..10 of NAME against REF
  local name=$1 ref=$2 out
  shift 2
  if out=$("$PYTHON" "$ROOT/tests/integration/compare_runs.py" "$WORK/$ref/metrics.jsonl" \
       "$WORK/$ref/checkpoints/step_00000010.h5" "$WORK/$name/metrics.jsonl" \
       "$WORK/$name/checkpoints/step_00000010.h5" --steps 6:10 "$@"); then
    pass "$name: $out"
  else
    fail "$name: $out"
  fi
}

run straight 1 1 1 train.steps=10
run saved 2 2 2 train.steps=5 || finish
ckpt=$WORK/saved/checkpoints/step_00000005.h5
for layout in "1 1 1" "4 1 2" "1 2 4"; do
  set -- $layout
  name="from222_to_dp$1_tp$2_pp$3"
  if run "$name" "$1" "$2" "$3" train.steps=10 checkpoint.restart="$ckpt"; then
    grep -q "restart: .*step_00000005.h5 at step 5, saved on dp=2,tp=2,pp=2" "$name.log" ||
      fail "$name: restart line missing"
    compare "$name" straight
  fi
done
# Every tensor through collective MPI-IO transfers (collective_bytes=0; by default the small ones
# go independently): saved on (2,1,1), restarted on (1,2,1). Two ranks: ROMIO's collective
# rounds crawl when more ranks than cores take turns.
run coll_saved 2 1 1 train.steps=5 checkpoint.collective_bytes=0 &&
  run coll_restart 1 2 1 train.steps=10 checkpoint.collective_bytes=0 \
    checkpoint.restart="$WORK/coll_saved/checkpoints/step_00000005.h5" &&
  compare coll_restart straight
# Same layout: 5 + restart + 5 on (2,2,2) equals 10 straight on (2,2,2), to the bit.
run straight222 2 2 2 train.steps=10 &&
  run saved 2 2 2 train.steps=10 checkpoint.restart=auto &&
  compare saved straight222 --exact
# Across ZeRO stages, each writing its parts and reading them back (no rank holds the whole model
# for it): ZeRO-3 on dp=4 for 3 steps, then 1 rank without ZeRO to step 5, ZeRO-2 on (2,2,1) to
# step 8, ZeRO-3 in hybrid groups of 2 to step 10; each leg's losses and last checkpoint equal
# those of one uninterrupted 1-rank run.
zero_leg() {  # zero_leg NAME FROM TO: NAME's losses FROM..TO and checkpoint TO against the straight run
  local out
  if out=$("$PYTHON" "$ROOT/tests/integration/compare_runs.py" "$WORK/zstraight/metrics.jsonl" \
       "$WORK/zstraight/checkpoints/step_0000000$3.h5" "$WORK/$1/metrics.jsonl" \
       "$WORK/$1/checkpoints/step_0000000$3.h5" --steps "$2:$3"); then
    pass "$1 (steps $2-$3): $out"
  else
    fail "$1 (steps $2-$3): $out"
  fi
}
if run zstraight 1 1 1 train.steps=9 checkpoint.every=1 &&
   run z_a 4 1 1 train.steps=3 parallel.zero=3 && zero_leg z_a 1 3 &&
   run z_b 1 1 1 train.steps=5 checkpoint.restart="$WORK/z_a/checkpoints/step_00000003.h5" &&
   zero_leg z_b 4 5 &&
   run z_c 2 2 1 train.steps=8 parallel.zero=2 \
     checkpoint.restart="$WORK/z_b/checkpoints/step_00000005.h5" && zero_leg z_c 6 8 &&
   run z_d 4 1 1 train.steps=9 parallel.zero=3 parallel.zero_group=2 \
     checkpoint.restart="$WORK/z_c/checkpoints/step_00000008.h5"; then
  zero_leg z_d 9 9
  grep -q "restart: .*step_00000008.h5 at step 8, saved on dp=2,tp=2,pp=1" z_d.log ||
    fail "z_d: restart line missing"
fi
# A LLaMA checkpoint (grouped-query, untied head) saved on (2,2,2) with interleaved stages and
# sequence parallelism restarts on (1,1,1) and on (1,2,2) with the 1-rank run's losses.
llama=(model.arch=llama model.n_kv_head=2 model.ffn_multiple=32)
run llama_straight 1 1 1 train.steps=10 "${llama[@]}" &&
  run llama_saved 2 2 2 train.steps=5 "${llama[@]}" parallel.virtual_stages=2 \
    parallel.sequence_parallel=true train.micro_batch=2 &&
  for layout in "1 1 1" "1 2 2"; do
    set -- $layout
    name="llama_from222_to_dp$1_tp$2_pp$3"
    run "$name" "$1" "$2" "$3" train.steps=10 "${llama[@]}" \
      checkpoint.restart="$WORK/llama_saved/checkpoints/step_00000005.h5" &&
      compare "$name" llama_straight
  done
finish
