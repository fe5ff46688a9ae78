#!/usr/bin/env bash
# Same-layout restart is bit-identical: 20 steps straight against 10 steps, a restart from the
# step-10 checkpoint, and 10 more. Every logged loss and every final tensor (parameters and Adam
# moments) must be equal to the bit.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck restart)
cd "$WORK" || exit 1
common=(optim.decay_steps=20 checkpoint.every=10 eval.every=5)

$MPIEXEC -n 1 "$TESSERA" train "$deck" "${common[@]}" train.steps=20 run.dir="$WORK/straight" \
  >straight.log 2>&1 || { fail "straight run"; tail -5 straight.log; }
$MPIEXEC -n 1 "$TESSERA" train "$deck" "${common[@]}" train.steps=10 run.dir="$WORK/split" \
  >first.log 2>&1 || { fail "first half"; tail -5 first.log; }
$MPIEXEC -n 1 "$TESSERA" train "$deck" "${common[@]}" train.steps=20 run.dir="$WORK/split" \
  checkpoint.restart=auto >second.log 2>&1 || { fail "second half"; tail -5 second.log; }

if grep -q "restart: .*step_00000010.h5 at step 10" second.log; then
  pass "restart: auto picked step_00000010.h5"
else
  fail "restart did not pick the step-10 checkpoint"; head -8 second.log
fi
losses straight/metrics.jsonl >a.txt
losses split/metrics.jsonl >b.txt
if [ "$(wc -l <a.txt)" -eq 20 ] && cmp -s a.txt b.txt; then
  pass "all 20 losses bit-identical ($(sed -n 20p a.txt))"
else
  fail "losses differ"; diff a.txt b.txt | head -10
fi
if "$PYTHON" - "$WORK/straight/checkpoints/step_00000020.h5" "$WORK/split/checkpoints/step_00000020.h5" <<'EOF'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1]), h5py.File(sys.argv[2])
names = []
a.visit(lambda n: names.append(n) if isinstance(a[n], h5py.Dataset) else None)
bad = [n for n in names if n not in b or not np.array_equal(a[n][()], b[n][()])]
assert len(names) > 80, names
assert a.attrs["step"] == b.attrs["step"] == 20
assert a["train"].attrs["next_sample"] == b["train"].attrs["next_sample"] == 80
if bad:
    sys.exit("differ: " + ", ".join(bad[:10]))
print(f"{len(names)} datasets equal")
EOF
then
  pass "final parameters, moments and checksums bit-identical"
else
  fail "final checkpoints differ"
fi
# The checkpoint directory holds only complete files and `latest` names the newest.
if [ "$(cat split/checkpoints/latest)" = "step_00000020.h5" ] && ! ls split/checkpoints/*.tmp >/dev/null 2>&1; then
  pass "latest = step_00000020.h5, no .tmp left"
else
  fail "checkpoint directory state"; ls -la split/checkpoints
fi
finish
