#!/usr/bin/env bash
# The Slurm job scripts on a real Slurm: a single-node cluster (munged, slurmctld, slurmd from
# Debian's packages) started here from a temporary directory, 2 ranks on this machine.
#   1. A 3-job chain (jobscripts/slurm/chain.sh, --dependency=afterany, launcher mpiexec): the test
#      sends jobs 1 and 2 the warning signal itself (`scancel --batch --signal=USR1`, as Slurm's
#      "B:" does) once they have made progress; job 3 finishes the run.
#   2. Preemption: jobscripts/slurm/train-cpu.sbatch with --time=1 --signal=B:USR1@25. slurmctld
#      checks time limits every 30 s from its start (the first check ~29 s after its launch,
#      measured) and sends the warning at the first check that finds the run 60 - 25 - 30 = 5 s
#      old or older. The job is submitted 11 s before a check, so the warning comes ~10 s into a
#      ~25 s run (one more try, a check later, if the run still ended first). The shell forwards
#      the signal through srun, tessera checkpoints and exits 3, the script requeues the job, and
#      the requeued run (time limit raised meanwhile) restarts from that checkpoint and completes.
#   3. A plain `scancel` ends a job for good: no requeue.
# While 1 and 2 run, no two ranks may be pinned to the same core.
# Both runs must log every step's loss exactly as an uninterrupted mpiexec run of the same deck,
# to the bit. Skipped only when Slurm is not installed or its daemons cannot start here.
source "$(dirname "$0")/lib.sh"
source "$ROOT/tests/slurm/cluster.sh"
trap 'slurm_stop; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM
T0=$SECONDS
elapsed() { echo "$((SECONDS - T0)) s"; }

[ -x "$TESSERA" ] || { fail "no $TESSERA: build it first"; finish; }
chmod 755 "$WORK"  # munged wants every directory above its socket searchable
if ! slurm_start "$WORK/cluster"; then
  echo "SKIP slurm: $SL_WHY"
  exit 0
fi
pass "slurm: munged, slurmctld and slurmd up on $(hostname -s) in $(elapsed)"

# job_field JOB NAME: a field of `scontrol show job` (JobState, Restarts, ExitCode, ...).
job_field() { sl scontrol show job -o "$1" 2>/dev/null | grep -o "\b$2=[^ ]*" | head -1 | cut -d= -f2; }
# wait_job JOB SECONDS: true once JOB has ended (not counting the pauses of a requeue).
wait_job() {
  local until=$((SECONDS + $2))
  while [ "$SECONDS" -lt "$until" ]; do
    case $(job_field "$1" JobState) in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) return 0 ;;
    esac
    sleep 0.5
  done
  return 1
}
# last_step RUN_DIR: the newest step of metrics.jsonl, 0 before the first.
last_step() {
  "$PYTHON" -c 'import json,sys
s = 0
try:
    for l in open(sys.argv[1]):
        r = json.loads(l)
        if r["type"] == "train": s = r["step"]
except (OSError, ValueError): pass
print(s)' "$1/metrics.jsonl"
}
# same_losses NAME RUN_DIR STEPS: RUN_DIR's metrics.jsonl logs each of the reference's first
# STEPS steps once, with the reference's loss to the bit.
same_losses() {
  losses "$2/metrics.jsonl" >"$WORK/$1.losses"
  head -n "$3" "$WORK/ref.losses" >"$WORK/$1.want"
  if [ -s "$WORK/$1.losses" ] && cmp -s "$WORK/$1.want" "$WORK/$1.losses"; then
    pass "$1: all $3 losses bit-identical to the uninterrupted run's ($(tail -1 "$WORK/$1.want"))"
  else
    fail "$1: losses differ from the uninterrupted run's (reference < > $1)"
    diff "$WORK/$1.want" "$WORK/$1.losses" | head -6
  fi
}
# check_binding NAME RUN_DIR: while RUN_DIR's ranks run, no two of them are pinned to the same
# cores (2 ranks of one thread on this 2-core node: sharing one core halves the speed).
check_binding() {
  local p cmd sets="" until=$((SECONDS + 20))
  while [ "$SECONDS" -lt "$until" ]; do
    sets=""
    for p in $(_slurm_pids); do
      cmd=$(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline")
      case $cmd in
        "$TESSERA train "*"run.dir=$2"*) sets="$sets $(sed -n 's/^Cpus_allowed_list:\s*//p' "/proc/$p/status" 2>/dev/null)" ;;
      esac
    done
    [ "$(echo "$sets" | wc -w)" -lt 2 ] || break
    sleep 0.2
  done
  read -ra sets <<<"$sets"
  if [ "${#sets[@]}" -ne 2 ]; then
    fail "$1: found ${#sets[@]} ranks running (want 2)"
  elif [ "${sets[0]}" = "${sets[1]}" ] && [ "${sets[0]}" != "0-$(($(nproc) - 1))" ]; then
    fail "$1: both ranks pinned to cpu ${sets[0]}"
  else
    pass "$1: ranks on cpus ${sets[*]}"
  fi
}
# restarts_chain NAME LOG: every run after the first restarted from the checkpoint the run before
# it wrote when it stopped ("stop: ... at step N" then "restart: .../step_0000000N.h5 at step N").
# Prints the stop steps.
restarts_chain() {
  "$PYTHON" - "$2" <<'EOF'
import os, re, sys
stops, restarts = [], []
for line in open(sys.argv[1], errors="replace"):
    if m := re.match(r"stop: (.*) at step (\d+): checkpoint written, exit 3", line):
        stops.append((int(m.group(2)), m.group(1)))
    if m := re.match(r"restart: (\S+) at step (\d+)", line):
        restarts.append((int(m.group(2)), m.group(1)))
if not stops or len(restarts) != len(stops):
    sys.exit(f"{len(stops)} stops, {len(restarts)} restarts")
for (s, why), (r, path) in zip(stops, restarts):
    if r != s or not path.endswith(f"step_{s:08d}.h5"):
        sys.exit(f"stopped at {s} ({why}) but restarted from {path} at {r}")
    if not os.path.isfile(path):
        sys.exit(f"{path} is gone")
print(" ".join(f"{s} ({why})" for s, why in stops))
EOF
}

# A trivial job first: the cluster runs jobs and srun starts MPICH ranks.
j=$(sl sbatch --parsable -n 2 -o "$WORK/hello.out" --wrap 'srun hostname') || j=""
if [ -n "$j" ] && wait_job "$j" 30 && [ "$(job_field "$j" JobState)" = COMPLETED ] &&
   [ "$(grep -c . "$WORK/hello.out")" -eq 2 ]; then
  pass "slurm: a 2-task job ran ($(elapsed))"
else
  fail "slurm: the trivial job did not run (job ${j:-not submitted}: $(job_field "${j:-0}" JobState))"
  head -5 "$WORK/hello.out" 2>/dev/null
  tail -5 "$WORK/cluster/log/slurmctld.log" "$WORK/cluster/log/slurmd.log"
  finish
fi

SBATCH_SCRIPT=$ROOT/jobscripts/slurm/train-cpu.sbatch
CHAIN=$ROOT/jobscripts/slurm/chain.sh
if [ ! -f "$SBATCH_SCRIPT" ] || [ ! -f "$CHAIN" ]; then
  fail "no jobscripts/slurm/train-cpu.sbatch or chain.sh"
  finish
fi

# The deck: 2 data-parallel ranks of one thread (what the job script gives --cpus-per-task=1),
# ~0.1 s a step. decay_steps is fixed, so a shorter run's losses are a prefix of a longer one's.
deck=$(tiny_deck slurm)
sed -i -e 's/^  n_embd: .*/  n_embd: 64/' -e 's/^  block_size: .*/  block_size: 64/' \
    -e 's/^  seq_len: .*/  seq_len: 64/' -e 's/^  batch_size: .*/  batch_size: 128/' \
    -e 's/^  micro_batch: .*/  micro_batch: 16/' -e 's/^  restart: none/  restart: none\n  every: 100/' "$deck"
printf 'parallel:\n  dp: 2\n' >>"$deck"
export OMP_NUM_THREADS=1
cd "$WORK" || exit 1
# Steps for at least ~25 s of training, from the fastest of 10 steps (a busy machine only makes
# the runs longer): Slurm's warning comes ~10 s in; the chain needs 100.
$MPIEXEC -n 2 "$TESSERA" train "$deck" train.steps=10 run.dir="$WORK/calibrate" >calibrate.log 2>&1 ||
  { fail "calibration run"; tail -5 calibrate.log; finish; }
steps=$("$PYTHON" -c 'import json,sys,math
ms = [r["ms"] for r in map(json.loads, open(sys.argv[1])) if r["type"] == "train"][2:]
print(min(3000, max(100, math.ceil(25000 / min(ms)))))' "$WORK/calibrate/metrics.jsonl")
chain_steps=100
sed -i -e "s/^  steps: .*/  steps: $steps/" -e "s/^  warmup_steps: .*/  warmup_steps: 10\n  decay_steps: 3000/" "$deck"

t=$SECONDS
$MPIEXEC -n 2 "$TESSERA" train "$deck" run.dir="$WORK/ref" >ref.log 2>&1 ||
  { fail "uninterrupted run"; tail -5 ref.log; finish; }
losses "$WORK/ref/metrics.jsonl" >ref.losses
ref_seconds=$((SECONDS - t))
pass "reference: $steps steps uninterrupted with mpiexec in $ref_seconds s"

# 3. scancel ends a job for good: the SIGTERM it sends stops tessera with a checkpoint, and the job
# script must not requeue a job its user cancelled.
cancel_test() {
  local j state restarts
  j=$(sl sbatch --parsable -n 2 --ntasks-per-node=2 --cpus-per-task=1 -D "$WORK" -o "$WORK/cancel.out" \
        "$SBATCH_SCRIPT" "$deck" train.steps=3000 run.dir="$WORK/cancel") || { fail "cancel: sbatch failed"; return; }
  local until=$((SECONDS + 60))
  while [ "$SECONDS" -lt "$until" ] && [ "$(last_step "$WORK/cancel")" -lt 5 ]; do sleep 0.2; done
  sl scancel "$j"
  wait_job "$j" 30
  sleep 8  # a requeued job would be pending again by now, and starting (AuthInfo cred_expire=5)
  state=$(job_field "$j" JobState) restarts=$(job_field "$j" Restarts)
  if [ "$state" = CANCELLED ] && [ "$restarts" = 0 ]; then
    pass "cancel: job $j stays cancelled ($(grep -m1 '^stop:' cancel.out || echo 'no stop line'))"
  else
    fail "cancel: after scancel job $j is $state with $restarts restarts (want CANCELLED, 0)"
    grep "^jobscript:" cancel.out | head -8
    sl scancel "$j"
  fi
}

# 1. A chain of 3 jobs, each continuing from the one before.
t=$SECONDS
ids=$(sl env TESSERA_LAUNCHER=mpiexec JOBSCRIPT="$SBATCH_SCRIPT" \
        SBATCH_FLAGS="-n 2 --ntasks-per-node=2 --cpus-per-task=1 -D $WORK -o $WORK/chain-%j.out" \
        bash "$CHAIN" 3 "$deck" train.steps=$chain_steps run.dir="$WORK/chain") || ids=""
read -ra chain <<<"$(echo "$ids" | tr '\n' ' ')"
if [ "${#chain[@]}" -ne 3 ]; then
  fail "chain: chain.sh did not print 3 job ids: $ids"
  finish
fi
# Jobs 1 and 2 get the warning once they have trained 40 steps; job 3 runs to the end.
from=0 order_ok=1 bound=""
for k in 0 1; do
  jk=${chain[$k]}
  until=$((SECONDS + 60))
  while [ "$SECONDS" -lt "$until" ] && [ "$(last_step "$WORK/chain")" -lt $((from + 40)) ]; do
    [ "$(job_field "${chain[$((k + 1))]}" JobState)" = PENDING ] || order_ok=0
    if [ -z "$bound" ] && [ "$(last_step "$WORK/chain")" -ge 5 ]; then
      check_binding "chain: mpiexec" "$WORK/chain"
      bound=1
    fi
    sleep 0.2
  done
  [ "$(job_field "$jk" JobState)" = RUNNING ] || order_ok=0
  sl scancel --batch --signal=USR1 "$jk"
  wait_job "$jk" 30 || fail "chain: job $jk did not end in 30 s after its signal"
  from=$(last_step "$WORK/chain")
done
wait_job "${chain[2]}" 60 || fail "chain: job ${chain[2]} did not end in 60 s"
summary="" want=("3:0" "3:0" "0:0") ends=() starts=()
for k in 0 1 2; do
  jk=${chain[$k]}
  code=$(job_field "$jk" ExitCode)
  summary="$summary $jk: $(job_field "$jk" JobState) $code;"
  [ "$code" = "${want[$k]}" ] || order_ok=0
  [ "$(job_field "$jk" Restarts)" = 0 ] || order_ok=0  # TESSERA_REQUEUE=0: no job requeued itself
  starts+=("$(date -d "$(job_field "$jk" StartTime)" +%s)")
  ends+=("$(date -d "$(job_field "$jk" EndTime)" +%s)")
done
[ "${starts[1]}" -ge "${ends[0]}" ] && [ "${starts[2]}" -ge "${ends[1]}" ] || order_ok=0
if [ "$order_ok" = 1 ]; then
  pass "chain: 3 jobs one after the other in $((SECONDS - t)) s:$summary"
else
  fail "chain: order or exit codes wrong:$summary starts ${starts[*]} ends ${ends[*]}"
fi
cat "$WORK"/chain-"${chain[0]}".out "$WORK"/chain-"${chain[1]}".out "$WORK"/chain-"${chain[2]}".out >chain.out
if stops=$(restarts_chain chain chain.out 2>&1) && [ "$(grep -c '^stop: SIGUSR1' chain.out)" -eq 2 ] &&
   grep -q "^done: $chain_steps steps" "$WORK/chain-${chain[2]}.out"; then
  pass "chain: jobs 2 and 3 restarted where 1 and 2 stopped ($stops), job 3 finished"
else
  fail "chain: stops/restarts: $stops"; grep -E "^(jobscript|stop|restart|done):" chain.out | head -12
fi
same_losses chain "$WORK/chain" "$chain_steps"

# 2. Preemption: Slurm's own time limit and warning signal. Once the job has been requeued, its
# time limit is raised so that the second run completes: one requeue, whatever the load.
# Milliseconds until slurmctld's next time-limit check (SL_CTLD_T0_MS: its launch).
until_check_ms() {
  local since=$(( $(date +%s%N) / 1000000 - SL_CTLD_T0_MS - 29000 ))
  echo $(( 30000 - (since % 30000 + 30000) % 30000 ))
}
# 3 (the cancel test) fills the wait for the first aligned submission when it is long enough.
cancelled=""
for attempt in 1 2; do
  wait_ms=$(( ($(until_check_ms) - 11000 + 30000) % 30000 ))
  if [ -z "$cancelled" ] && [ "$wait_ms" -gt 20000 ]; then
    cancel_test
    cancelled=1
    wait_ms=$(( ($(until_check_ms) - 11000 + 30000) % 30000 ))
  fi
  sleep "$(awk -v ms="$wait_ms" 'BEGIN { print ms / 1000 }')"
  rm -rf "$WORK/preempt" "$WORK/preempt.out"
  t=$SECONDS
  j=$(sl sbatch --parsable -n 2 --ntasks-per-node=2 --cpus-per-task=1 --time=1 --signal=B:USR1@25 \
        -D "$WORK" -o "$WORK/preempt.out" "$SBATCH_SCRIPT" "$deck" run.dir="$WORK/preempt") ||
    { fail "preempt: sbatch failed"; finish; }
  # A loaded machine slows the requeued run more than the reference (the srun job binds 1 cpu a
  # task): a generous bound, only the time a failure takes to show.
  limit=$((4 * ref_seconds + 120))
  until=$((SECONDS + limit)) first_run="" bound=""
  while [ "$SECONDS" -lt "$until" ]; do
    state=$(job_field "$j" JobState)
    case $state in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) break ;; esac
    if [ -z "$bound" ] && [ "$(last_step "$WORK/preempt")" -ge 5 ]; then
      check_binding "preempt: srun" "$WORK/preempt"
      bound=1
    fi
    if [ -z "$first_run" ] && [ "$(job_field "$j" Restarts)" = 1 ]; then
      first_run=$((SECONDS - t))
      sl scontrol update JobId="$j" TimeLimit=10 || fail "preempt: could not raise the time limit"
    fi
    sleep 0.5
  done
  if [ "$SECONDS" -ge "$until" ]; then
    fail "preempt: job $j did not end in $limit s (state $state)"
    sl scancel "$j"
  fi
  state=$(job_field "$j" JobState) restarts=$(job_field "$j" Restarts) code=$(job_field "$j" ExitCode)
  # A job that started late met its warning only at the next check, after the run: once more.
  if [ "$attempt" = 1 ] && [ "$state" = COMPLETED ] && [ "$restarts" = 0 ]; then
    echo "preempt: job $j ended before Slurm's warning (it started late): once more, a check later"
    continue
  fi
  break
done
if [ "$state" = COMPLETED ] && [ "$code" = 0:0 ] && [ "$restarts" = 1 ]; then
  pass "preempt: job $j stopped by Slurm's warning and requeued after ${first_run} s, completed after $((SECONDS - t)) s"
else
  fail "preempt: job $j: $state, exit $code, $restarts restarts (want COMPLETED, 0:0, 1)"
  [ "$restarts" != 0 ] || echo "    the run ended before Slurm's warning: it was faster than the calibration ($steps steps)"
fi
if grep -q "^jobscript: got SIGUSR1: sending SIGUSR1 to the job step" preempt.out &&
   grep -q "^jobscript: stopped early with a checkpoint: requeueing" preempt.out; then
  pass "preempt: the batch shell got Slurm's SIGUSR1, forwarded it and requeued"
else
  fail "preempt: no forwarded signal / requeue in the job's output"; grep "^jobscript:" preempt.out | head -8
fi
if grep -q "^job: SLURM_JOB_ID=$j SLURM_RESTART_COUNT=1$" preempt.out; then
  pass "preempt: the requeued run logged SLURM_RESTART_COUNT=1"
else
  fail "preempt: no 'job: SLURM_JOB_ID=$j SLURM_RESTART_COUNT=1' line"; grep "^job:" preempt.out
fi
if stops=$(restarts_chain preempt preempt.out 2>&1); then
  pass "preempt: each run restarted from the checkpoint the one before wrote at its stop: $stops"
else
  fail "preempt: $stops"; grep -E "^(stop|restart|checkpoint):" preempt.out | head -10
fi
same_losses preempt "$WORK/preempt" "$steps"

[ -n "$cancelled" ] || cancel_test
echo "slurm test: $(elapsed) in all"
finish
