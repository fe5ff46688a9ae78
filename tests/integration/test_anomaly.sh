#!/usr/bin/env bash
# The anomaly policy (docs/checkpoints.md, "Long runs"), on 1 rank and on (dp, tp, pp) = (2, 2, 2) with ZeRO-1:
# a NaN gradient (TESSERA_TEST_NAN_STEP, a trigger for tests only) at step 3 and a gradient spike
# (TESSERA_TEST_SPIKE_STEP: gradients x 10^4) at step 5, met by each action. skip: the update is
# dropped and the batch passed over; rollback: the newest checkpoint's weights, data after the
# anomalous batch; stop: exit 4 with the last good checkpoint kept and nothing written. Each
# anomaly is one log line and one metrics.jsonl line; the 8-rank runs end where the 1-rank runs do.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck anomaly)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1
common=(train.steps=6 eval.every=0 eval.batches=1 log.every=100 train.anomaly_window=3
        train.anomaly_sigma=100 optim.decay_steps=6)
layouts=("1:parallel.dp=1" "8:parallel.dp=2 parallel.tp=2 parallel.pp=2 parallel.zero=1")

run() {  # run NAME RANKS LAYOUT ARGS...: exit status in $WORK/NAME.rc, log in NAME.log
  local name=$1 ranks=$2 layout=$3
  shift 3
  # shellcheck disable=SC2086
  timeout 180 $MPIEXEC -n "$ranks" "$TESSERA" train "$deck" "${common[@]}" $layout \
    run.dir="$WORK/$name" "$@" >"$name.log" 2>&1
  echo $? >"$name.rc"
}
anomalies() {  # the metrics.jsonl anomaly lines as "step action reason-start loss-is-null"
  "$PYTHON" -c 'import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r["type"] == "anomaly":
        print(r["step"], r["action"], r["reason"].split(" ")[0], r["reason"].split(" ")[1] if "finite" in r["reason"] else "spike")' "$1/metrics.jsonl"
}
state() {  # "step next_sample" of a checkpoint, through tessera ckpt info
  "$TESSERA" ckpt info "$1" | sed -n 's/^step \([0-9]*\), tokens_seen [0-9]*, next_sample \([0-9]*\),.*/\1 \2/p'
}

for entry in "${layouts[@]}"; do
  ranks=${entry%%:*} layout=${entry#*:}
  tag="$ranks rank$([ "$ranks" -gt 1 ] && echo "s, (2,2,2) ZeRO-1")"
  export TESSERA_TEST_NAN_STEP=3 TESSERA_TEST_SPIKE_STEP=5

  # skip: 6 updates over 8 batches.
  run "skip$ranks" "$ranks" "$layout" train.anomaly_action=skip checkpoint.every=0
  ck=skip$ranks/checkpoints/step_00000006.h5
  if [ "$(cat "skip$ranks.rc")" = 0 ] &&
     grep -q "^anomaly: step 3: grad_norm nan is not finite (loss [0-9.]*, grad_norm nan): skip: update dropped, global samples \[8, 12) skipped$" "skip$ranks.log" &&
     grep -q "^anomaly: step 5: grad_norm [0-9.e+]* is above the mean [0-9.e+-]* + 100 x std [0-9.e+-]* of the last 3 steps (loss .*): skip: update dropped, global samples \[20, 24) skipped$" "skip$ranks.log" &&
     [ "$(anomalies "skip$ranks" | tr '\n' ';')" = "3 skip grad_norm nan;5 skip grad_norm spike;" ] &&
     [ "$(state "$ck")" = "6 32" ] && "$TESSERA" ckpt verify "$ck" >/dev/null; then
    pass "skip ($tag): steps 3 and 5 dropped (nan, spike), 6 updates from 8 batches: $(state "$ck")"
  else
    fail "skip ($tag): exit $(cat "skip$ranks.rc")"; grep -E "^(anomaly|tessera:)" "skip$ranks.log" | head -5; tail -2 "skip$ranks.log"
  fi

  # rollback: to step 2 at the NaN (the data goes on at sample 12), to step 4 at the spike.
  run "rollback$ranks" "$ranks" "$layout" train.anomaly_action=rollback checkpoint.every=2
  ck=rollback$ranks/checkpoints/step_00000006.h5
  if [ "$(cat "rollback$ranks.rc")" = 0 ] &&
     grep -q "^anomaly: step 3: grad_norm nan is not finite .*: rollback 1 of 3: to $WORK/rollback$ranks/checkpoints/step_00000002\.h5 (step 2), global samples \[8, 12) skipped, 4 samples skipped by rollbacks in this job$" "rollback$ranks.log" &&
     grep -q "^anomaly: step 5: grad_norm .* is above the mean .*: rollback 1 of 3: to $WORK/rollback$ranks/checkpoints/step_00000004\.h5 (step 4), global samples \[20, 24) skipped, 8 samples skipped by rollbacks in this job$" "rollback$ranks.log" &&
     [ "$(anomalies "rollback$ranks" | tr '\n' ';')" = "3 rollback grad_norm nan;5 rollback grad_norm spike;" ] &&
     [ "$(state "$ck")" = "6 32" ] && "$TESSERA" ckpt verify "$ck" >/dev/null; then
    pass "rollback ($tag): to step 2 at the nan, to step 4 at the spike, data past both: $(state "$ck")"
  else
    fail "rollback ($tag): exit $(cat "rollback$ranks.rc")"; grep -E "^(anomaly|tessera:)" "rollback$ranks.log" | head -5; tail -2 "rollback$ranks.log"
  fi

  # stop: at the NaN (step 2 kept) and, without it, at the spike (step 4 kept).
  for what in nan spike; do
    if [ $what = nan ]; then step=3 kept=2; else step=5 kept=4; unset TESSERA_TEST_NAN_STEP; fi
    run "stop_$what$ranks" "$ranks" "$layout" train.anomaly_action=stop checkpoint.every=2
    if [ "$(cat "stop_$what$ranks.rc")" = 4 ] && [ "$(cat "stop_$what$ranks/exit_status")" = 4 ] &&
       grep -q "^anomaly: step $step: grad_norm .*: stop: no checkpoint written, kept step_0000000$kept\.h5, exit 4$" "stop_$what$ranks.log" &&
       [ "$(ls "stop_$what$ranks/checkpoints" | grep -c '^step_')" = $((kept / 2)) ] &&
       [ "$(cat "stop_$what$ranks/checkpoints/latest")" = "step_0000000$kept.h5" ] &&
       [ "$(anomalies "stop_$what$ranks" | cut -d' ' -f1-2)" = "$step stop" ]; then
      pass "stop at the $what ($tag): exit 4, step_0000000$kept.h5 kept, nothing written after"
    else
      fail "stop at the $what ($tag): exit $(cat "stop_$what$ranks.rc")"; grep -E "^(anomaly|rank)" "stop_$what$ranks.log" | head -3; tail -2 "stop_$what$ranks.log"
    fi
  done
  unset TESSERA_TEST_NAN_STEP TESSERA_TEST_SPIKE_STEP
done

# checkpoint.async: the step-2 checkpoint still in its background write when step 3's NaN stops
# the run is named as kept (it completes first), not "no checkpoint to keep".
TESSERA_TEST_NAN_STEP=3 run stop_async 1 "parallel.dp=1" train.anomaly_action=stop \
  checkpoint.every=2 checkpoint.async=true
if [ "$(cat stop_async.rc)" = 4 ] &&
   grep -q "^anomaly: step 3: grad_norm .*: stop: no checkpoint written, kept step_00000002\.h5, exit 4$" stop_async.log &&
   "$TESSERA" ckpt verify stop_async/checkpoints/step_00000002.h5 >/dev/null; then
  pass "stop with checkpoint.async: exit 4, the step-2 checkpoint (written in the background) kept and whole"
else
  fail "stop with checkpoint.async: exit $(cat stop_async.rc)"; grep -E "^(anomaly|checkpoint)" stop_async.log | head -4
fi

# The parallel runs against the 1-rank runs: the same losses and final checkpoints.
for action in skip rollback; do
  if "$TESSERA" ckpt diff "$action"1/checkpoints/step_00000006.h5 "$action"8/checkpoints/step_00000006.h5 >"$action.diff" &&
     worst=$("$PYTHON" - "$action.diff" <<'EOF'
import sys
worst = 0.0
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    assert len(f) == 6, line
    worst = max(worst, (float(f[4]) ** 0.5) / max(float(f[3]) ** 0.5, 1e-30))
assert worst < 1e-4, worst
print(f"{worst:.1e}")
EOF
); then
    pass "$action: (2,2,2) ZeRO-1 ends where 1 rank does (every tensor within a relative $worst)"
  else
    fail "$action: (2,2,2) differs from 1 rank"; sort -t$'\t' -k5 -g "$action.diff" | tail -3
  fi
done

# Never a checkpoint from non-finite weights: a run that blows up (lr 1e30) under every action.
timeout 60 "$TESSERA" train "$deck" run.dir="$WORK/blowup" train.steps=3 optim.lr=1e30 optim.min_lr=0 \
  optim.warmup_steps=0 eval.every=0 >blowup.log 2>&1
rc=$?
if [ $rc = 4 ] && grep -q "^anomaly: step 2: loss [-a-z]* is not finite" blowup.log && [ ! -e blowup/checkpoints/step_00000003.h5 ]; then
  pass "lr 1e30: the NaN at step 2 stops the run (exit 4) with nothing written"
else
  fail "lr 1e30: exit $rc"; grep -E "^(anomaly|step)" blowup.log | head -4
fi
# A cause that persists (lr 1e6: NaN some steps after every rollback) under rollback: at most
# train.anomaly_max_rollbacks = 2 rollbacks to one checkpoint, then exit 4 with one line on stderr
# naming the cause and the samples skipped; not a loop for ever.
timeout 120 "$TESSERA" train "$deck" run.dir="$WORK/persist" train.steps=200 optim.lr=1e6 \
  optim.warmup_steps=0 eval.every=0 log.every=1 checkpoint.every=1 train.anomaly_action=rollback \
  train.anomaly_max_rollbacks=2 >persist.log 2>persist.err
rc=$?
if [ $rc = 4 ] && [ "$(wc -l <persist.err)" = 1 ] &&
   grep -Eq "^anomaly: step [0-9]+: .* is not finite .*: rollback: 2 rollbacks to step_[0-9]{8}\.h5 already \(train\.anomaly_max_rollbacks = 2\), the cause persists: stop, [1-9][0-9]* samples skipped by rollbacks: no checkpoint written, kept step_[0-9]{8}\.h5, exit 4$" persist.err &&
   [ "$(grep -c "^anomaly: .*: rollback [12] of 2: to " persist.log)" -ge 2 ] &&
   [ "$(grep -c "^anomaly: " persist.log)" -le 12 ] &&
   [ "$("$PYTHON" -c 'import json, sys
a = [json.loads(l) for l in open(sys.argv[1]) if "\"anomaly\"" in l]
print(a[-1]["action"], a[-1]["skipped_samples"])' persist/metrics.jsonl)" = "stop $(sed -n 's/.* stop, \([0-9]*\) samples skipped.*/\1/p' persist.err)" ]; then
  pass "lr 1e6 under rollback: $(grep -c "^anomaly: " persist.log) anomalies, then exit 4: $(cat persist.err)"
else
  fail "lr 1e6 under rollback: exit $rc"; cat persist.err | head -3; grep -E "^anomaly" persist.log | head -6
fi
finish
