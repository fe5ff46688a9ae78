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
# Under ZeRO-3 (2,2,1): one rank's checkpoint writes failing with EDQUOT (write_fail_shim.c, as a
# project quota seen by one client), a kill -9 and a SIGTERM, in a seeded order; the run ends
# bit-identical to the same deck without faults. The failing rank gives up after 2 s instead of
# 10 (TESSERA_TEST_AGREE_SECONDS, as in test_write_errors.sh): the same way out, sooner.
if ${CC:-gcc} -O1 -Wall -Wextra -Werror -shared -fPIC -o "$WORK/shim.so" \
     "$ROOT/tests/integration/write_fail_shim.c" -ldl 2>"$WORK/shim.err"; then
  if TESSERA_TEST_AGREE_SECONDS=2 "$PYTHON" "$ROOT/tools/runs/chaos.py" --tessera "$TESSERA" \
       --mpiexec "$MPIEXEC" --data "$DATA" --work "$WORK/chaos3" --faults 3 --seed 38 --zero 3 \
       --kinds write_error,kill9,sigterm --shim "$WORK/shim.so" >"$WORK/chaos3.log" 2>&1 &&
     grep -q "^ok   fault .* write_error .*EDQUOT on rank [0-3] .* exit 1 " "$WORK/chaos3.log" &&
     grep -q "^final: all [0-9]* tensors (weights and moments) bit-identical" "$WORK/chaos3.log"; then
    pass "chaos soak under ZeRO-3 with one rank's EDQUOT (seed 38): $(grep 'write_error' "$WORK/chaos3.log" | sed 's/  */ /g')"
  else
    fail "chaos soak under ZeRO-3 (seed 38)"; grep -E "^(FAIL|note|final|reference)" "$WORK/chaos3.log" | head -12
  fi
  sed 's/^/    /' "$WORK/chaos3.log"
else
  fail "the shim does not build: $(head -3 "$WORK/shim.err")"
fi
finish
