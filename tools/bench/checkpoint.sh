#!/usr/bin/env bash
# `make bench`, section "Checkpoint stall": the training stall of a checkpoint of the GPT-2 124M
# shape (1.5 GB: parameters and both Adam moments), written synchronously and with
# checkpoint.async (a host snapshot, written by a background thread while training goes on),
# both read from the run's log lines. Prints a markdown table.
#   DECK (a GPT-2 124M deck, as tools/bench/all.sh writes)  OUT (scratch directory)  TESSERA
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TESSERA=${TESSERA:-$ROOT/bin/tessera}
PYTHON=${PYTHON:-/usr/bin/python3}
: "${DECK:?a GPT-2 124M deck}" "${OUT:?a scratch directory}"
# Two checkpoints four steps apart (steps 4 and 8): the background write has the steps between.
for mode in false true; do
  rm -rf "$OUT/ckpt_$mode"
  "$TESSERA" train "$DECK" train.steps=8 checkpoint.every=4 checkpoint.async=$mode \
    run.dir="$OUT/ckpt_$mode" checkpoint.dir="$OUT/ckpt_$mode/ckpt" >"$OUT/ckpt_$mode.log"
done
"$PYTHON" - "$OUT/ckpt_false.log" "$OUT/ckpt_true.log" <<'PY'
import re, statistics, sys
sync = open(sys.argv[1]).read()
async_ = open(sys.argv[2]).read()
writes = [(float(mb), float(s)) for mb, s in re.findall(r"^checkpoint: wrote \S+ \(([\d.]+) MB\) in ([\d.]+) s$", sync, re.M)]
stalls = [float(s) for s in re.findall(r"^checkpoint: step \d+ copied to the host in [\d.]+ s \(training stalled ([\d.]+) s\)", async_, re.M)]
background = [float(s) for s in re.findall(r"^checkpoint: wrote \S+ \([\d.]+ MB\) in ([\d.]+) s in the background$", async_, re.M)]
assert len(writes) == 2 and len(stalls) == 2 and len(background) == 2, (writes, stalls, background)
sync_s = statistics.mean(s for _, s in writes)
stall_s = statistics.mean(stalls)
print("## Checkpoint stall (GPT-2 124M shape, 1 rank)\n")
print("| checkpoint of %.0f MB | training stalled | written in |" % writes[0][0])
print("|---|---|---|")
print(f"| synchronous | {sync_s:.2f} s | {sync_s:.2f} s |")
print(f"| checkpoint.async | {stall_s:.3f} s (host snapshot) | {statistics.mean(background):.2f} s in the background |")
print(f"\nstall async / sync: {stall_s / sync_s:.3f} (goal: below 0.1); mean of the checkpoints at steps 4 and 8.")
PY
