#!/usr/bin/env bash
# The chaos soak, short (docs/checkpoints.md, "Chaos soak"; the long one is `make chaos`): one training job of
# a tiny model on 4 ranks, (dp, tp, pp) = (2, 2, 1), through 8 seeded random faults (kill -9 of a
# rank, SIGTERM to the launcher, SIGUSR1 to the ranks, a full checkpoint tmpfs, a corrupted newest
# checkpoint, a rank hung before a step), each followed by a restart with checkpoint.restart: auto.
# tools/runs/chaos.py asserts that each faulted job ends within 60 s with its documented exit status,
# that `latest` then names a checkpoint that verifies and is no older than before the job, and
# that the final weights and moments equal those of the same deck run without faults, bit for bit.
source "$(dirname "$0")/lib.sh"
test_data
export OMP_NUM_THREADS=1
if "$PYTHON" "$ROOT/tools/runs/chaos.py" --tessera "$TESSERA" --mpiexec "$MPIEXEC" --data "$DATA" \
     --work "$WORK/chaos" --faults 8 --seed 8 >"$WORK/chaos.log" 2>&1; then
  pass "chaos soak, 8 faults (seed 8): $(grep -c '^ok ' "$WORK/chaos.log") ok; $(grep '^final:' "$WORK/chaos.log")"
else
  fail "chaos soak (seed 8)"; grep -E "^(FAIL|note|final|reference)" "$WORK/chaos.log" | head -12
fi
sed 's/^/    /' "$WORK/chaos.log"
finish
