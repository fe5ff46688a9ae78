#!/usr/bin/env bash
# What a run writes, and who may write there. A run directory whose name holds a colon (which
# MPI-IO reads as a file-system prefix) trains, checkpoints and restarts, on 1 and 2 ranks. A
# write of metrics.jsonl or the data trace that fails (a device that is always full) ends the run
# on every rank at the next step boundary, one line, exit 1. A run directory or a checkpoint
# directory in use by a live job is refused (exit 2, naming host, pid and job); a stale lock of a
# dead process on this host, or of an earlier run of the same requeued job, is taken over; one of
# another host is explained. Files killed writes left are removed at the start and named in the
# log. Non-finite numbers in metrics.jsonl are null, so the file stays JSON.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck out)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1
host=$(hostname)

# 1. A colon in the run directory's name.
if timeout 120 $MPIEXEC -n 2 "$TESSERA" train "$deck" parallel.dp=2 train.steps=2 run.dir="$WORK/10:00" \
     >colon.log 2>&1 && [ -f "$WORK/10:00/checkpoints/step_00000002.h5" ] &&
   timeout 120 $MPIEXEC -n 2 "$TESSERA" train "$deck" parallel.dp=2 train.steps=3 run.dir="$WORK/10:00" checkpoint.restart=auto \
     >colon2.log 2>&1 && grep -q "restart: $WORK/10:00/checkpoints/step_00000002\.h5 at step 2" colon2.log; then
  pass "run.dir $WORK/10:00: trained, wrote step 2 on 2 ranks through MPI-IO, restarted from it"
else
  fail "run.dir with a colon"; tail -n 3 colon.log colon2.log
fi

# 2. A write that fails during the run: metrics.jsonl on a device that is always full (rank 0
# writes it), and a data trace only rank 1 writes.
mkdir -p full_metrics && ln -s /dev/full full_metrics/metrics.jsonl
ALLOW_STDOUT=1 expect_error metrics_write_fails 1 "^cannot write $WORK/full_metrics/metrics\.jsonl: No space left on device$" \
  timeout 60 $MPIEXEC -n 2 "$TESSERA" train "$deck" parallel.dp=2 run.dir="$WORK/full_metrics" train.steps=50
if grep -q "^step" "$WORK/out.txt"; then fail "metrics: it trained on after the failed write"
else pass "metrics: no step was trained after the failed write at step 0"; fi
mkdir -p full_trace && ln -s /dev/full full_trace/data_trace.rank1.txt
ALLOW_STDOUT=1 expect_error trace_write_fails 1 "^cannot write $WORK/full_trace/data_trace\.rank1\.txt: No space left on device$" \
  timeout 60 $MPIEXEC -n 2 "$TESSERA" train "$deck" parallel.dp=2 run.dir="$WORK/full_trace" data.trace=true train.steps=50

# 3. Locks. A live job holds its run directory and its checkpoint directory.
"$TESSERA" train "$deck" run.dir="$WORK/live" checkpoint.dir="$WORK/shared_ck" train.steps=1000000 \
  log.every=100000 eval.every=0 >live.log 2>&1 &
live=$!
for _ in $(seq 600); do grep -q "^init:" live.log && break; sleep 0.1; done
expect_error run_dir_in_use 2 "^$WORK/live is in use by another tessera job \(host $host, pid $live, job none, since [0-9T:-]+; lock file $WORK/live/\.tessera\.lock\)$" \
  timeout 60 "$TESSERA" train "$deck" run.dir="$WORK/live"
expect_error checkpoint_dir_in_use 2 "^$WORK/shared_ck is in use by another tessera job \(host $host, pid $live, job none" \
  timeout 60 "$TESSERA" train "$deck" run.dir="$WORK/other" checkpoint.dir="$WORK/shared_ck"
kill -INT "$live"
wait "$live"
rc=$?
if [ "$rc" -eq 130 ] && [ ! -e "$WORK/live/.tessera.lock" ] && [ ! -e "$WORK/shared_ck/.tessera.lock" ]; then
  pass "the live job went on undisturbed, stopped on SIGINT (exit 130) and released both locks"
else
  fail "the live job: exit $rc, locks: $(ls -a "$WORK/live" "$WORK/shared_ck" | grep -c lock)"
fi

# A dead process of this host: taken over.
bash -c 'echo $$ >dead.pid'
mkdir -p stale && echo "host=$host pid=$(cat dead.pid) start=1 job=none run=0 since=2020-01-01T00:00:00" >stale/.tessera.lock
if timeout 60 "$TESSERA" train "$deck" run.dir="$WORK/stale" train.steps=1 >stale.log 2>&1 &&
   grep -q "^lock: took over $WORK/stale/\.tessera\.lock from host $host, pid $(cat dead.pid), job none, since 2020-01-01T00:00:00 (no longer running)$" stale.log &&
   [ ! -e stale/.tessera.lock ]; then
  pass "stale lock of a dead process: $(grep '^lock:' stale.log)"
else
  fail "stale lock"; tail -3 stale.log
fi
# Another host: explained.
mkdir -p remote && echo "host=node-417 pid=4242 start=99 job=81234 run=0 since=2020-01-01T00:00:00" >remote/.tessera.lock
expect_error lock_of_another_host 2 "^$WORK/remote is locked by a tessera job on another host \(host node-417, pid 4242, job 81234, since 2020-01-01T00:00:00; lock file $WORK/remote/\.tessera\.lock\): tessera cannot see whether it still runs; if that job has ended, remove the lock file$" \
  timeout 60 "$TESSERA" train "$deck" run.dir="$WORK/remote"
# A lock file holding garbage, and a FIFO in its place: named as what they are, not as a job.
mkdir -p garbage && printf 'x\001\377 not a lock' >garbage/.tessera.lock
expect_error lock_garbage 1 "^cannot lock $WORK/garbage: $WORK/garbage/\.tessera\.lock is not a tessera lock \(it holds 'x\?\? not a lock', no host and pid\): remove it if no tessera job uses $WORK/garbage$" \
  timeout 60 "$TESSERA" train "$deck" run.dir="$WORK/garbage"
mkdir -p fifo && mkfifo fifo/.tessera.lock
expect_error lock_fifo 1 "^cannot lock $WORK/fifo: $WORK/fifo/\.tessera\.lock is not a regular file \(a FIFO\), not a tessera lock: remove it$" \
  timeout 60 "$TESSERA" train "$deck" run.dir="$WORK/fifo"
# The same job requeued (a larger restart count) takes it over wherever it runs now.
if SLURM_JOB_ID=81234 SLURM_RESTART_COUNT=1 timeout 60 "$TESSERA" train "$deck" run.dir="$WORK/remote" \
     train.steps=1 >requeue.log 2>&1 && grep -q "^lock: took over .* (an earlier run of this job)$" requeue.log; then
  pass "requeued job: $(grep '^lock:' requeue.log)"
else
  fail "requeued job and its lock"; tail -3 requeue.log
fi

# 4. Files of interrupted writes: removed at the start and named.
mkdir -p tmps/checkpoints && touch tmps/checkpoints/step_00000005.h5.tmp tmps/checkpoints/latest.tmp tmps/deck.yaml.tmp
if timeout 60 "$TESSERA" train "$deck" run.dir="$WORK/tmps" train.steps=1 >tmps.log 2>&1 &&
   grep -q "^checkpoint: removed $WORK/tmps/checkpoints/step_00000005\.h5\.tmp, left by an interrupted write$" tmps.log &&
   grep -q "^run: removed $WORK/tmps/deck\.yaml\.tmp, left by an interrupted write$" tmps.log &&
   ! ls tmps/checkpoints/*.tmp tmps/*.tmp >/dev/null 2>&1; then
  pass "stale .tmp files removed and named: $(grep -c 'removed' tmps.log) lines"
else
  fail "stale .tmp files"; ls tmps tmps/checkpoints; grep removed tmps.log
fi

# 5. A run that blows up (lr 1e30: the loss is NaN at step 2, which stops it: train.anomaly_action)
# still writes JSON: null.
timeout 60 "$TESSERA" train "$deck" run.dir="$WORK/nan" train.steps=3 optim.lr=1e30 optim.min_lr=0 \
  optim.warmup_steps=0 >nan.log 2>&1
if "$PYTHON" - "$WORK/nan/metrics.jsonl" <<'EOF'
import json, sys
def refuse(c):
    raise ValueError("not JSON: " + c)
rows = [json.loads(l, parse_constant=refuse) for l in open(sys.argv[1])]
train = [r for r in rows if r["type"] == "train"]
anomaly = [r for r in rows if r["type"] == "anomaly"]
assert train[0]["loss"] is not None and anomaly[0]["loss"] is None, rows
EOF
then
  pass "metrics.jsonl with a NaN loss is strict JSON (null)"
else
  fail "metrics.jsonl with NaN"
fi
finish
