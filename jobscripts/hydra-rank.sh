#!/bin/bash
# One rank of tessera under MPICH's hydra mpiexec (the job scripts put it in front of the binary):
# runs tessera and writes rank 0's exit status to the file TESSERA_RANK_STATUS names.
#
# Why: once hydra has forwarded a signal, it reports exit status 0 for every rank whose exit it
# has not already seen through the PMI wire (pmip.c, "forced_cleanup"), so `mpiexec` often
# returns 0 where tessera stopped with 3 (seen on MPICH 4.0). The job script reads this file
# instead, and falls back on mpiexec's status where there is none (rank 0 not on the batch node).
#
# Hydra sends a forwarded signal to each rank's whole process group, tessera included, so this
# shell only has to survive it: it ignores SIGUSR1 and SIGTERM, and tessera, which installs its own
# handlers at start-up, replaces the "ignore" it inherits.
trap '' USR1 TERM
"$@"
rc=$?
if [ "${PMI_RANK:-0}" = 0 ] && [ -n "${TESSERA_RANK_STATUS:-}" ]; then
  echo "$rc" >"$TESSERA_RANK_STATUS"
fi
exit "$rc"
