#!/usr/bin/env bash
# Long runs (docs/checkpoints.md, "Long runs"): checkpoint retention (checkpoint.keep), `tessera ckpt info` and
# `ckpt verify`, and checkpoints that are never trusted when read: a non-finite or negative value
# with a matching checksum, a damaged value, a changed restart attribute, each one line, on
# `ckpt verify` and on a restart alike.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck long)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1
common=(train.steps=6 eval.every=0 eval.batches=1 log.every=100)

# 1. Retention: a checkpoint every step, the newest two kept.
if timeout 120 "$TESSERA" train "$deck" "${common[@]}" checkpoint.every=1 checkpoint.keep=2 \
     run.dir="$WORK/keep" >keep.log 2>&1 &&
   [ "$(cd keep/checkpoints && ls step_*)" = "$(printf 'step_00000005.h5\nstep_00000006.h5')" ] &&
   [ "$(grep -c '^checkpoint: removed step_0000000[1-4]\.h5 (checkpoint\.keep = 2)$' keep.log)" -eq 4 ] &&
   [ "$(cat keep/checkpoints/latest)" = step_00000006.h5 ]; then
  pass "checkpoint.keep=2: steps 1-4 removed as newer ones completed, 5 and 6 kept, latest = 6"
else
  fail "checkpoint.keep"; ls keep/checkpoints; grep checkpoint: keep.log | tail -4
fi
ck=$WORK/keep/checkpoints/step_00000006.h5

# 2. ckpt info and verify on a good checkpoint (a directory resolves to its newest).
if "$TESSERA" ckpt info "$WORK/keep/checkpoints" >info.txt 2>&1 &&
   grep -q "^checkpoint $ck$" info.txt && grep -q "^step 6, tokens_seen 384, next_sample 24, seed 7," info.txt &&
   grep -q "^tensor model/wte \[320x32\] 40960 bytes$" info.txt &&
   grep -q "^tensor optim/exp_avg_sq/ln_f.weight \[32\] 128 bytes$" info.txt &&
   grep -q "^deck:$" info.txt && grep -q "^  n_layer: 2$" info.txt; then
  pass "ckpt info: $(sed -n 2p info.txt); $(grep -c ^tensor info.txt) tensors"
else
  fail "ckpt info"; head -12 info.txt
fi
if "$TESSERA" ckpt verify "$ck" >verify.txt 2>&1 &&
   grep -q "^ok: $ck: step 6, every checksum, value and the restart state verified$" verify.txt; then
  pass "ckpt verify: $(cat verify.txt)"
else
  fail "ckpt verify on a good checkpoint"; cat verify.txt
fi

# 3. Bad checkpoints: verify and a restart refuse each with the same one line.
tamper() {  # tamper OUT EXPRESSION: a copy of $ck changed by a Python statement on f
  cp "$ck" "$1"
  "$PYTHON" - "$1" "$2" <<'EOF'
import sys, h5py, numpy as np
from tessera_ckpt import checksum
with h5py.File(sys.argv[1], "r+") as f:
    exec(sys.argv[2])
EOF
}
nan_in() {  # a statement: element 3 of dataset $1 becomes $2, its checksum made to match
  echo "d = f['$1']; v = d[()]; v.flat[3] = $2; d[...] = v; f['checksum/$1'][()] = np.uint64(checksum(v))"
}
tamper nan.h5 "$(nan_in model/h.1.attn.c_proj.weight np.nan)"
tamper neg.h5 "$(nan_in optim/exp_avg_sq/h.0.mlp.c_fc.bias -1.0)"
tamper inf.h5 "$(nan_in optim/exp_avg/wpe np.inf)"
tamper flip.h5 "d = f['model/ln_f.bias']; v = d[()]; v[0] += 1; d[...] = v"
tamper state.h5 "f['train'].attrs['next_sample'] = np.int64(28)"
tamper lr.h5 "f['train'].attrs['lr'] = np.float64(np.nan)"
values="\(a checkpoint holds finite weights and moments, and non-negative exp_avg_sq\)"
for case in "nan 2 /model/h\.1\.attn\.c_proj\.weight holds nan at element 3 of this rank's tile $values" \
            "neg 2 /optim/exp_avg_sq/h\.0\.mlp\.c_fc\.bias holds -1 at element 3 of this rank's tile $values" \
            "inf 2 /optim/exp_avg/wpe holds inf at element 3 of this rank's tile $values" \
            "flip 1 checksum mismatch in /model/ln_f\.bias \(file corrupt\?\)" \
            "state 2 attribute state_checksum does not match the restart attributes \(step, tokens_seen, /train next_sample, seed, lr, data_sources, data_position, the /model shape\): one was changed after the write" \
            "lr 2 /train attribute lr nan is not a learning rate \(finite, >= 0\)"; do
  read -r name code message <<<"$case"
  expect_error "verify_$name" "$code" "^$WORK/$name\.h5: $message$" "$TESSERA" ckpt verify "$WORK/$name.h5"
done
# A restart on 2 ranks: the same line, every rank agreeing, before a step is trained.
expect_error restart_nan 2 "^$WORK/nan\.h5: /model/h\.1\.attn\.c_proj\.weight holds nan at element 3 of this rank's tile $values$" \
  timeout 120 $MPIEXEC -n 2 "$TESSERA" train "$deck" "${common[@]}" parallel.dp=2 \
  checkpoint.restart="$WORK/nan.h5" run.dir="$WORK/r_nan"
expect_error restart_state 2 "^$WORK/state\.h5: attribute state_checksum does not match" \
  timeout 120 $MPIEXEC -n 2 "$TESSERA" train "$deck" "${common[@]}" parallel.dp=2 \
  checkpoint.restart="$WORK/state.h5" run.dir="$WORK/r_state"

# 4. Asynchronous checkpoints: the same files as synchronous ones, bit for bit, on 2 ranks; the
# log gives the stall; a SIGUSR1 during an asynchronous run still ends with a complete checkpoint.
for mode in sync async; do
  timeout 120 $MPIEXEC -n 2 "$TESSERA" train "$deck" "${common[@]}" parallel.dp=2 checkpoint.every=2 \
    checkpoint.async=$([ $mode = async ] && echo true || echo false) run.dir="$WORK/$mode" >$mode.log 2>&1 ||
    fail "$mode run"
done
same=1
for s in 2 4 6; do
  "$TESSERA" ckpt diff sync/checkpoints/step_0000000$s.h5 async/checkpoints/step_0000000$s.h5 >d$s.txt &&
    [ -s d$s.txt ] && ! cut -f6 d$s.txt | grep -qv '^1$' || same=0
done
if [ $same = 1 ] &&
   [ "$(grep -c '^checkpoint: step [246] copied to the host in [0-9.]* s (training stalled [0-9.]* s); writing in the background$' async.log)" = 3 ] &&
   [ "$(grep -c '^checkpoint: wrote .*step_0000000[246]\.h5 (.* MB) in [0-9.]* s in the background$' async.log)" = 3 ]; then
  pass "checkpoint.async: steps 2, 4, 6 equal to the synchronous ones bit for bit; $(grep -m1 'copied to the host' async.log)"
else
  fail "checkpoint.async"; grep "^checkpoint" async.log | head -6
fi
"$TESSERA" train "$deck" train.steps=100000 eval.every=0 log.every=1 checkpoint.every=3 checkpoint.async=true \
  run.dir="$WORK/async_sig" >async_sig.log 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q "^step      7/" async_sig.log && break; sleep 0.1; done
kill -USR1 $pid
wait $pid
rc=$?
ck=$(cat async_sig/checkpoints/latest 2>/dev/null)
if [ $rc = 3 ] && grep -q "^stop: SIGUSR1 at step [0-9]*: checkpoint written, exit 3" async_sig.log &&
   [ "$ck" = "$(grep -o 'step [0-9]*: checkpoint written' async_sig.log | awk '{printf "step_%08d.h5", $2}')" ] &&
   "$TESSERA" ckpt verify "async_sig/checkpoints/$ck" >/dev/null && ! ls async_sig/checkpoints/*.tmp >/dev/null 2>&1; then
  pass "SIGUSR1 during an asynchronous run: exit 3 with $ck complete and verified"
else
  fail "SIGUSR1 with checkpoint.async: exit $rc, latest $ck"; tail -3 async_sig.log
fi

finish
