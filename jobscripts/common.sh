# shellcheck shell=bash
# shellcheck disable=SC2034  # TESSERA_STATUS is for the job scripts that source this file
# Shared by jobscripts/slurm/train.sbatch, slurm/train-cpu.sbatch and pbs/train.pbs (sourced, not
# run): start tessera in the background, forward the scheduler's warning signal to it, wait for
# its exit status, and requeue the job when tessera stopped early with a checkpoint.
#
# tessera's exit status (docs/jobscripts.md, docs/running.md):
#   0    the run reached train.steps                       -> done
#   3    stopped early on SIGUSR1/SIGTERM or run.max_minutes, a checkpoint written -> requeue
#   130  stopped on SIGINT, a checkpoint written            -> no requeue (someone asked it to stop)
#   1    I/O error, 2 bad input                             -> never requeue: it would fail again
#   else killed or crashed                                  -> no requeue; the checkpoint directory
#        still holds the previous complete checkpoint, so a resubmission continues from there
#
# Knobs (environment variables; the scripts' headers list their own):
#   TESSERA_REQUEUE=0         do not requeue on status 3 (chain.sh sets it: the next job continues)
#   TESSERA_MAX_RESTARTS=N    do not requeue a job that has already run N+1 times (default 20), so a
#                             run that keeps stopping without progress cannot loop for ever
#   TESSERA_DRY_RUN=1         print the launch command instead of running it
#   TESSERA_REQUEUE_AFTER_TERM=0  no requeue when the stop came from a SIGTERM alone (the Slurm
#                             scripts' default: there SIGTERM means scancel, the hard time limit
#                             or preemption, while the wall-time warning is SIGUSR1)

# One prefix for everything the job script itself says, so its lines stand out from tessera's in
# the job's output file.
tessera_log() { echo "jobscript: $*"; }

# Exports the OpenMP and MPICH settings for RANKS ranks of THREADS threads each on this node. When
# they want more cores than the node has (a test on a laptop), MPICH must yield the core while it
# polls, or ranks spinning in MPI starve the ones computing.
tessera_threads() {  # tessera_threads RANKS_ON_THIS_NODE THREADS_PER_RANK
  local ranks=$1 threads=$2 cores
  # Not OMP_PROC_BIND/OMP_PLACES: with a launcher that does not bind each rank to its own cores,
  # they pin every rank's threads to the same first cores of the node.
  export OMP_NUM_THREADS=$threads
  cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
  if [ $((ranks * threads)) -gt "$cores" ]; then
    export MPIR_CVAR_POLLS_BEFORE_YIELD=${MPIR_CVAR_POLLS_BEFORE_YIELD:-1}
    tessera_log "$ranks ranks x $threads threads > $cores cores on $(hostname): MPICH yields while polling"
  fi
}

# True when MPIEXEC (default: mpiexec) is MPICH's hydra. (Its output is read whole: under pipefail
# `mpiexec --version | grep -q` fails whenever grep exits before mpiexec has written everything.)
tessera_is_hydra() {  # tessera_is_hydra [MPIEXEC]
  local version
  version=$("${1:-mpiexec}" --version 2>&1 || true)
  [[ $version == *HYDRA* ]]
}

# The signal forwarding. The scheduler signals the batch shell only (Slurm's --signal=B:...) or the
# batch shell first (PBS's SIGTERM). A shell runs a trap only between commands, so the launcher
# runs in the background and the shell sits in `wait`, which a trapped signal interrupts at once.
# The trap sends SIGUSR1 to the launcher (srun or mpiexec), which passes it on to every rank;
# tessera treats SIGUSR1 and SIGTERM alike, and SIGUSR1 is the one launchers forward rather than
# take as "kill the job" (MPICH's hydra and srun forward both).
#
# tessera_traps installs the traps; the scripts call it first thing, so that a signal during the
# set-up (module loads can take seconds) is not lost either: the step is then not started at all.
_tessera_pid=""
_tessera_signals=0
_tessera_usr1=0
_tessera_on_signal() {  # _tessera_on_signal NAME
  _tessera_signals=$((_tessera_signals + 1))
  if [ "$1" = USR1 ]; then _tessera_usr1=$((_tessera_usr1 + 1)); fi
  if [ -n "$_tessera_pid" ]; then
    tessera_log "got SIG$1: sending SIGUSR1 to the job step (pid $_tessera_pid)"
    kill -USR1 "$_tessera_pid" 2>/dev/null || true
  else
    tessera_log "got SIG$1 before the job step started"
  fi
}
# True when the job script has received SIGUSR1 or SIGTERM.
tessera_signalled() { [ "$_tessera_signals" -gt 0 ]; }
tessera_traps() {
  trap '_tessera_on_signal USR1' USR1
  trap '_tessera_on_signal TERM' TERM
}

# Runs CMD... in the background with the forwarding above and sets TESSERA_STATUS to its exit
# status. Returns 0 whatever the status, so that it works under `set -e`.
#
# The status comes through a file written by a small subshell that starts the launcher and waits
# for it: bash can lose a child's status when the child exits while a trap is running in the
# shell that waits for it (`wait` then returns -1 or 127), and this shell's traps are where the
# forwarding happens. The subshell receives no forwarded signal and ignores a session-wide
# SIGTERM (PBS may send one to every process of the job), so its `wait` is never interrupted.
tessera_run() {  # tessera_run CMD...
  TESSERA_STATUS=0
  tessera_log "running: $*"
  if [ "${TESSERA_DRY_RUN:-0}" = 1 ]; then
    tessera_log "dry run: not started"
    return 0
  fi
  if [ "$_tessera_signals" -gt 0 ]; then
    # Stopped before it started: the checkpoint directory is as the last job left it, so this
    # is "stopped early with a checkpoint" (3) and the job goes back to the queue.
    tessera_log "a stop signal came before the job step started: not starting it"
    TESSERA_STATUS=3
    return 0
  fi
  local dir wrapper rc rank0
  dir=$(mktemp -d "${TMPDIR:-/tmp}/tessera_job.XXXXXX")
  # Where jobscripts/hydra-rank.sh, when the launch goes through it, leaves rank 0's status.
  export TESSERA_RANK_STATUS=$dir/rank0
  tessera_traps
  (
    # A subshell starts with the signal dispositions the shell had before its traps, so the
    # launcher gets the default ones; the subshell ignores the two signals only after forking it.
    "$@" &
    echo "$!" >"$dir/pid"
    trap '' USR1 TERM
    rc=0
    wait "$!" || rc=$?
    echo "$rc" >"$dir/status"
  ) &
  wrapper=$!
  # The launcher's pid, for the forwarding; a signal meanwhile is counted by the trap.
  while [ ! -s "$dir/pid" ] && kill -0 "$wrapper" 2>/dev/null; do sleep 0.05; done
  # (No $(...) while the traps are set: bash 5.2 drops a trap that fires while it parses one.)
  _tessera_pid=""
  [ ! -s "$dir/pid" ] || read -r _tessera_pid <"$dir/pid"
  if [ -n "$_tessera_pid" ] && [ "$_tessera_signals" -gt 0 ]; then
    # It came while the launcher was being started. A launcher or rank signalled before it has
    # installed its handler dies of it (no requeue then; the previous checkpoint stays intact).
    tessera_log "forwarding a signal that came during the launch: SIGUSR1 to pid $_tessera_pid"
    kill -USR1 "$_tessera_pid" 2>/dev/null || true
  fi
  # A trapped signal interrupts `wait` while the step runs on: wait again until the subshell has
  # written the status, or has gone without writing one (killed: SIGKILL from the scheduler).
  while :; do
    wait "$wrapper" 2>/dev/null || true
    [ ! -s "$dir/status" ] || break
    kill -0 "$wrapper" 2>/dev/null || break
  done
  rc=137
  [ ! -s "$dir/status" ] || read -r rc <"$dir/status"
  if [ -s "$dir/rank0" ]; then
    read -r rank0 <"$dir/rank0"
    if [ "$rank0" != "$rc" ]; then
      tessera_log "the launcher exited with $rc, tessera's rank 0 with $rank0: taking rank 0's"
      rc=$rank0
    fi
  fi
  rm -rf "$dir"
  TESSERA_STATUS=$rc
  _tessera_pid=""
  # A signal from now on (the scheduler's warning racing the end of the run, or the TERM of a
  # requeue) has nothing to stop: say so rather than die before the requeue decision.
  trap 'tessera_log "got a signal after the job step ended: nothing to forward"' USR1 TERM
  tessera_log "tessera exited with status $rc"
}

# Decides what the job does after tessera exited with STATUS: requeue with REQUEUE_CMD... on
# status 3 (unless TESSERA_REQUEUE=0 or the job has run TESSERA_MAX_RESTARTS + 1 times; RUNS_SO_FAR
# is the scheduler's restart counter, 0 on the first run), nothing otherwise. The caller then
# exits with STATUS, so that the job's own exit status is tessera's.
tessera_after_run() {  # tessera_after_run STATUS RUNS_SO_FAR REQUEUE_CMD...
  local status=$1 restarts=$2
  shift 2
  case $status in
    0) tessera_log "done: the run reached train.steps" ;;
    3)
      if [ "${TESSERA_REQUEUE:-1}" = 0 ]; then
        tessera_log "stopped early with a checkpoint; TESSERA_REQUEUE=0, so no requeue (the next job of a chain continues)"
      elif [ "$_tessera_signals" -gt 0 ] && [ "$_tessera_usr1" -eq 0 ] && [ "${TESSERA_REQUEUE_AFTER_TERM:-1}" = 0 ]; then
        tessera_log "stopped by SIGTERM with a checkpoint: the scheduler is ending the job (cancel, time limit, preemption), so no requeue; resubmit to continue"
      elif [ "$restarts" -ge "${TESSERA_MAX_RESTARTS:-20}" ]; then
        tessera_log "stopped early with a checkpoint, but this job has been restarted $restarts times (TESSERA_MAX_RESTARTS=${TESSERA_MAX_RESTARTS:-20}): not requeueing; resubmit to continue"
      else
        tessera_log "stopped early with a checkpoint: requeueing with: $*"
        if ! "$@"; then
          tessera_log "requeue failed ($1 exited non-zero); resubmit the job to continue from the checkpoint"
        fi
      fi
      ;;
    130) tessera_log "stopped on SIGINT with a checkpoint: not requeueing" ;;
    1) tessera_log "I/O error (see the message above): not requeueing" ;;
    2) tessera_log "bad input (see the message above): not requeueing" ;;
    *) tessera_log "tessera was killed or crashed (status $status): not requeueing; the previous complete checkpoint is kept, resubmit to continue from it" ;;
  esac
}
