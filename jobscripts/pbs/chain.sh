#!/bin/bash
# Submits N PBS jobs that train one deck one after the other, each starting when the previous one
# has ended, however it ended (-W depend=afterany), and continuing from its newest checkpoint.
# Prints the job ids, one a line.
#
# Usage: jobscripts/pbs/chain.sh N DECK.yaml [section.key=value ...]
# Environment:
#   JOBSCRIPT    the job script (default: train.pbs next to this file)
#   QSUB_FLAGS   more qsub options for every job, e.g. "-l walltime=01:00:00 -A PROJECT"
#   AFTER        a job id the first job waits for (to extend a running chain)
#
# The jobs run with TESSERA_REQUEUE=0: a job that stops at its wall time leaves its checkpoint to
# the next job of the chain instead of rerunning itself, so the chain is exactly N jobs. A job
# whose run reaches train.steps ends the training: the remaining jobs find the final checkpoint
# and end at once. To stop a chain, qdel its jobs.
set -euo pipefail
if [ $# -lt 2 ] || ! [ "$1" -ge 1 ] 2>/dev/null; then
  echo "usage: $0 N DECK.yaml [section.key=value ...]   (N >= 1 jobs)" >&2
  exit 2
fi
n=$1
deck=$2
shift 2
jobscript=${JOBSCRIPT:-$(dirname "$0")/train.pbs}
read -ra extra <<<"${QSUB_FLAGS:-}"
# qsub passes no arguments to a job script: the deck and the overrides travel as variables (-v),
# the overrides in quotes since a value with commas in it (parallel.stage_layers=[2,2]) must be.
vars="DECK=$deck,TESSERA_REQUEUE=0"
if [ $# -gt 0 ]; then vars="$vars,OVERRIDES='$*'"; fi
prev=${AFTER:-}
for _ in $(seq "$n"); do
  dep=()
  if [ -n "$prev" ]; then dep=(-W "depend=afterany:$prev"); fi
  # qsub prints the job id, e.g. 1234.pbs-server.
  prev=$(qsub "${dep[@]}" -v "$vars" "${extra[@]}" "$jobscript")
  echo "$prev"
done
