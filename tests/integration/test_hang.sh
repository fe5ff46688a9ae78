#!/usr/bin/env bash
# Hang forensics (run.hang_timeout; docs/checkpoints.md, "Long runs"): one rank of four, (dp, pp) = (2, 2),
# stalled on purpose at step 3 (TESSERA_TEST_STALL, a trigger for tests only). The job must end
# within the timeout plus a few seconds with exit 5, one line naming the stalled rank as behind
# and the call the others wait in, and every rank's ring of calls in <run.dir>/hang/rank_K.txt.
# A healthy run under the same timeout is not disturbed.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck hang)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1
timeout_s=4
args=(train.steps=6 eval.every=0 eval.batches=1 log.every=1 parallel.dp=2 parallel.pp=2
      train.micro_batch=1 run.hang_timeout=$timeout_s)

if timeout 120 $MPIEXEC -n 4 "$TESSERA" train "$deck" "${args[@]}" run.dir="$WORK/healthy" >healthy.log 2>&1 &&
   [ ! -e healthy/hang ]; then
  pass "a healthy run with run.hang_timeout=$timeout_s ends normally, no hang report"
else
  fail "healthy run under the watchdog"; tail -3 healthy.log
fi

TESSERA_TEST_STALL=3:3 timeout 120 $MPIEXEC -n 4 "$TESSERA" train "$deck" "${args[@]}" \
  run.dir="$WORK/stall" >stall.log 2>stall.err &
job=$!
for _ in $(seq 600); do grep -q "^step      2/" stall.log && break; sleep 0.1; done
start=$(date +%s%N)
wait $job
rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
line=$(grep "^hang: " stall.err)
if [ "$rc" -eq 5 ] && [ "$ms" -lt $(( (timeout_s + 6) * 1000 )) ] &&
   echo "$line" | grep -Eq "^hang: no progress for [0-9]+ s \(run\.hang_timeout\): rank 3 is behind at step 3 \(in no communication call, phase stalled on purpose \(TESSERA_TEST_STALL\)\); ranks 0, 1, 2 wait in [a-z]+ [a-z_]+ [0-9]+ B.*; each rank's last calls are in $WORK/stall/hang/rank_K\.txt; ending the job, exit 5$"; then
  pass "stalled rank 3: ended $ms ms after step 2 (timeout $timeout_s s), exit 5: $line"
else
  fail "stalled rank: exit $rc after $ms ms"; cat stall.err | head -5
fi
if [ "$(ls stall/hang | tr '\n' ' ')" = "rank_0.txt rank_1.txt rank_2.txt rank_3.txt " ] &&
   grep -q "^phase=stalled on purpose" stall/hang/rank_3.txt && grep -q "^call=none$" stall/hang/rank_3.txt &&
   grep -q " IN FLIGHT$" stall/hang/rank_0.txt && grep -q "^step 3, micro-batch" stall/hang/rank_0.txt &&
   grep -Eq "^(pp|dp|MPI_COMM_WORLD|world) [a-z_]+ [0-9]+ B.* step [0-9]+ micro -?[0-9]+ started [0-9.]+ took " stall/hang/rank_1.txt; then
  pass "hang/rank_K.txt of every rank: rank 3 in no call, rank 0 $(grep '^call=' stall/hang/rank_0.txt)"
else
  fail "hang reports"; ls stall/hang; head -8 stall/hang/rank_*.txt
fi
# ZeRO-3 on dp = 4: rank 2 stalls at step 3 while the others wait for its part of a layer's
# parameters (a gather of the shard group, named dpcp: the gradients' group dp x cp); the job ends within the timeout naming it,
# and the last checkpoint (step 2, written as every rank's parts) is whole.
TESSERA_TEST_STALL=2:3 timeout 120 $MPIEXEC -n 4 "$TESSERA" train "$deck" train.steps=6 eval.every=0 \
  eval.batches=1 log.every=1 parallel.dp=4 parallel.zero=3 train.micro_batch=1 checkpoint.every=2 \
  run.hang_timeout=$timeout_s run.dir="$WORK/zero3" >zero3.log 2>zero3.err
rc=$?
line=$(grep "^hang: " zero3.err)
if [ "$rc" -eq 5 ] &&
   echo "$line" | grep -Eq "^hang: no progress for [0-9]+ s \(run\.hang_timeout\): rank 2 is behind at step 3 .*; ranks 0, 1, 3 wait in dpcp [a-z_]+" &&
   verify=$("$TESSERA" ckpt verify "$WORK/zero3/checkpoints/step_00000002.h5" 2>&1); then
  pass "ZeRO-3, stalled rank 2: exit 5: $line; the step-2 checkpoint: $(echo "$verify" | tail -1)"
else
  fail "ZeRO-3 stalled rank: exit $rc: ${line:-$(head -3 zero3.err)} ${verify:-}"
fi
finish
