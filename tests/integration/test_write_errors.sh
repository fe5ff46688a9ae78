#!/usr/bin/env bash
# A checkpoint write that fails on one rank alone (issue 38): write_fail_shim.c, preloaded, makes
# write/pwrite/writev fail with EDQUOT (a project quota), EIO or ENOSPC on one rank for the step-4
# checkpoint's .tmp, as a quota or a failing target seen by one client would. Inside HDF5's
# collective calls that rank then takes another path than its peers and every rank would wait for
# ever; the job must end within a bounded time (kAgreeSeconds, here shortened to 2 s by
# TESSERA_TEST_AGREE_SECONDS, plus start-up; each case waits it out) with exit 1 and one
# line naming the rank, the error and the file, the step-2 checkpoint whole and `latest`, and no
# .tmp left: on 1 rank, dp = 2 (the failing rank 1 or 0), tp = 2, cp = 2, ZeRO-3 with the space
# reserved, and ZeRO-3 with the write in the background.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck write_errors)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1 TESSERA_TEST_AGREE_SECONDS=2
if ! ${CC:-gcc} -O1 -Wall -Wextra -Werror -shared -fPIC -o shim.so \
     "$ROOT/tests/integration/write_fail_shim.c" -ldl 2>shim.err; then
  fail "the shim does not build: $(head -3 shim.err)"
  finish
fi

case_() {  # case_ NAME RANKS FAILING-RANK ERRNO ERROR-TEXT [overrides...]
  local name=$1 ranks=$2 bad=$3 err=$4 text=$5 start rc took line
  shift 5
  start=$(date +%s)
  # shellcheck disable=SC2086  # MPIEXEC may hold words
  TESSERA_SHIM_RANK=$bad TESSERA_SHIM_MATCH=step_00000004.h5.tmp TESSERA_SHIM_ERRNO=$err \
    timeout -k 5 120 $MPIEXEC -n "$ranks" -env LD_PRELOAD "$WORK/shim.so" "$TESSERA" train "$deck" \
    train.steps=6 checkpoint.every=2 eval.every=0 run.dir="$WORK/$name" "$@" >"$name.log" 2>"$name.err"
  rc=$? took=$(($(date +%s) - start))
  line=$(grep -m1 "checkpoint step 4: " "$name.err")
  local ck=$WORK/$name/checkpoints who="rank $bad"
  [ "$ranks" = 1 ] && who=""
  if [ "$rc" = 1 ] && [ "$took" -lt 90 ] && grep -qF "$ck/step_00000004.h5.tmp" <<<"$line" &&
     grep -qF "$text" <<<"$line" && grep -qF "$who" <<<"$line" &&
     ! compgen -G "$ck/*.tmp" >/dev/null && [ "$(cat "$ck/latest")" = step_00000002.h5 ] &&
     "$TESSERA" ckpt verify "$ck/step_00000002.h5" >/dev/null 2>&1; then
    pass "$name: exit 1 in $took s, no .tmp, step 2 kept and verified: $line"
  else
    fail "$name: exit $rc in $took s: ${line:-$(tail -3 "$name.err")}"
    ls "$ck" 2>/dev/null | sed 's/^/    /'
  fi
}

case_ one_rank_edquot 1 0 122 "Disk quota exceeded"
case_ dp2_edquot 2 1 122 "Disk quota exceeded" parallel.dp=2
case_ dp2_eio_rank0 2 0 5 "Input/output error" parallel.dp=2
case_ tp2_enospc 2 1 28 "No space left on device" parallel.tp=2
case_ cp2_edquot 2 1 122 "Disk quota exceeded" parallel.cp=2 model.attention=fused
case_ zero3_reserve_edquot 2 1 122 "Disk quota exceeded" parallel.dp=2 parallel.zero=3 \
  checkpoint.reserve=true
case_ zero3_async_eio 2 1 5 "Input/output error" parallel.dp=2 parallel.zero=3 \
  checkpoint.async=true
finish
