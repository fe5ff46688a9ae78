#!/usr/bin/env bash
# Activation recompute (train.recompute) changes memory, not results: selective and full
# recompute train to the same bits as none (every loss, gradient norm and final tensor, Adam
# moments included), with gemm and fused attention, on 1 rank and on (1,2,2) under 1F1B (two
# micro-batches in flight on stage 0, so the shared workspace serves interleaved forwards and
# backwards); and rank 0's activation bytes fall in the order none > selective > full.
# (tests/integration/test_comm_volume.sh checks those bytes against the formula.)
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck recompute)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1
common=(model.n_layer=4 model.n_head=4 model.n_embd=32 train.batch_size=8 train.micro_batch=2
        train.steps=6 checkpoint.every=6 eval.batches=1 log.every=1)
run() {  # NAME NP OVERRIDES...
  local name=$1 np=$2
  shift 2
  timeout 300 "$MPIEXEC" -n "$np" "$TESSERA" train "$deck" "${common[@]}" run.dir="$WORK/$name" \
    "$@" >"$WORK/$name.log" 2>&1 || { fail "$name: tessera train exited non-zero"; tail -3 "$name.log"; return 1; }
}
# Rank 0's activation bytes, as its "rank" line of metrics.jsonl records them.
activations() {
  "$PYTHON" -c 'import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r["type"] == "rank" and int(r["rank"]) == 0: print(int(r["activation_bytes"]))' "$WORK/$1/metrics.jsonl"
}
for attention in gemm fused; do
  for layout in "1 parallel.tp=1" "4 parallel.tp=2 parallel.pp=2"; do
    set -- $layout
    np=$1
    shift
    base=${attention}_np${np}
    run "${base}_none" "$np" model.attention=$attention "$@" train.recompute=none || continue
    for mode in selective full; do
      name=${base}_$mode
      run "$name" "$np" model.attention=$attention "$@" train.recompute=$mode || continue
      if out=$("$PYTHON" "$ROOT/tests/integration/compare_runs.py" "$WORK/${base}_none/metrics.jsonl" \
           "$WORK/${base}_none/checkpoints/step_00000006.h5" "$WORK/$name/metrics.jsonl" \
           "$WORK/$name/checkpoints/step_00000006.h5" --exact); then
        pass "$name equals recompute none to the bit: $out"
      else
        fail "$name differs from recompute none: $out"
      fi
    done
    a_none=$(activations "${base}_none") a_sel=$(activations "${base}_selective") a_full=$(activations "${base}_full")
    if awk -v n="$a_none" -v s="$a_sel" -v f="$a_full" 'BEGIN { exit !(n > s && s > f) }'; then
      pass "$base: activation bytes on rank 0 $a_none (none) > $a_sel (selective) > $a_full (full)"
    else
      fail "$base: activation bytes none $a_none, selective $a_sel, full $a_full: not decreasing"
    fi
  done
done
finish
