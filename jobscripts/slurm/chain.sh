#!/bin/bash
# Submits N jobs that train one deck one after the other, each starting when the previous one has
# ended, however it ended (--dependency=afterany), and continuing from its newest checkpoint.
# Prints the job ids, one a line. For systems where a job may not requeue itself, or to keep the
# next job waiting in the queue (accruing priority) while the current one runs.
#
# Usage: jobscripts/slurm/chain.sh N DECK.yaml [section.key=value ...]
#   JOBSCRIPT=jobscripts/slurm/train-cpu.sbatch jobscripts/slurm/chain.sh 3 input/default.yaml
# Environment:
#   JOBSCRIPT      the job script (default: train.sbatch next to this file)
#   SBATCH_FLAGS   more sbatch options for every job, e.g. "--time=01:00:00 --nodes=4"
#                  (sbatch's own SBATCH_* variables, e.g. SBATCH_ACCOUNT, work too)
#   AFTER          a job id the first job waits for (to extend a running chain)
#
# The jobs run with TESSERA_REQUEUE=0: a job that stops at its wall time leaves its checkpoint to
# the next job of the chain instead of requeueing itself, so the chain is exactly N jobs. A job
# whose run reaches train.steps ends the training: the remaining jobs find the final checkpoint
# and end at once. To stop a chain, scancel its jobs.
set -euo pipefail
if [ $# -lt 2 ] || ! [ "$1" -ge 1 ] 2>/dev/null; then
  echo "usage: $0 N DECK.yaml [section.key=value ...]   (N >= 1 jobs)" >&2
  exit 2
fi
n=$1
shift
jobscript=${JOBSCRIPT:-$(dirname "$0")/train.sbatch}
read -ra extra <<<"${SBATCH_FLAGS:-}"
prev=${AFTER:-}
for _ in $(seq "$n"); do
  dep=()
  if [ -n "$prev" ]; then dep=(--dependency="afterany:$prev"); fi
  # --parsable prints "id" or "id;cluster".
  out=$(sbatch --parsable "${dep[@]}" --export=ALL,TESSERA_REQUEUE=0 "${extra[@]}" "$jobscript" "$@")
  prev=${out%%;*}
  echo "$prev"
done
