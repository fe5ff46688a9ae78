#!/usr/bin/env bash
# Full and read-only disks, on small tmpfs mounts this test makes (it needs root, or at least the
# right to mount: elsewhere it says so and passes nothing). A checkpoint that finds the disk full,
# on 1 rank and on 2 (data- and tensor-parallel), with the space reserved up front and without
# (a write failing part-way): every rank agrees, exit 1, one line "checkpoint step N: disk full on
# DIR (...): kept step M", the .tmp file removed, `latest` still on step M, no hang, no crash. A
# run directory that is full at the start or fills up during the run, and a read-only checkpoint
# directory: one line, exit 1, found at once.
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck full)
cd "$WORK" || exit 1
export OMP_NUM_THREADS=1

mounts=()
cleanup_mounts() {
  for m in "${mounts[@]}"; do umount "$m" 2>/dev/null; done
  [ -n "${KEEP:-}" ] || rm -rf "$WORK"
}
trap cleanup_mounts EXIT
# tmpfs NAME SIZE [OPTIONS]: a fresh tmpfs at $WORK/NAME.
tmpfs() {
  mkdir -p "$WORK/$1"
  mount -t tmpfs -o "size=$2${3:+,$3}" tmpfs "$WORK/$1" 2>"$WORK/mount.err" || return 1
  mounts+=("$WORK/$1")
}
if ! tmpfs probe 64k; then
  echo "test_disk_full: skipped: cannot mount a tmpfs here ($(head -1 "$WORK/mount.err")); run as root"
  finish
fi

# disk_full NAME NP SIZE RESERVE STEP KEPT [OVERRIDES...]: checkpoints every 2 steps into a tmpfs
# of SIZE (a checkpoint of the tiny model is 0.52 MB, its reservation about 0.9 MB; a write
# first needs room for its metadata, 0.24 MB, and holds as much again while the data goes in).
disk_full() {
  local name=$1 np=$2 size=$3 reserve=$4 step=$5 kept=$6
  shift 6
  tmpfs "$name" "$size" || { fail "$name: mount"; return; }
  local start=$SECONDS
  timeout -s KILL 120 $MPIEXEC -n "$np" "$TESSERA" train "$deck" run.dir="$WORK/$name.run" \
    checkpoint.dir="$WORK/$name" checkpoint.every=2 checkpoint.reserve="$reserve" train.steps=40 \
    "$@" >"$name.out" 2>"$name.err"
  local rc=$? took=$((SECONDS - start))
  # The rank that met it prints the line; where a peer was stuck inside HDF5's own collectives, it
  # ends the job after the bounded agreement (kAgreeSeconds), its line led by "rank R: ".
  local want="^(rank [0-9]+: )?checkpoint step $step: disk full on $WORK/$name \(a checkpoint needs about [0-9.]+ MB, [0-9.]+ MB are free\): kept step $kept \(step_0*$kept\.h5\)$"
  if [ "$rc" -eq 1 ] && [ "$took" -le 30 ] && [ "$(wc -l <"$name.err")" -eq 1 ] && grep -Eq "$want" "$name.err" &&
     [ "$(cat "$WORK/$name/latest")" = "$(printf 'step_%08d.h5' "$kept")" ] &&
     ! ls "$WORK/$name"/*.tmp >/dev/null 2>&1; then
    pass "$name ($np ranks, reserve=$reserve): exit 1 in $took s, latest kept, no .tmp: $(cat "$name.err")"
  else
    fail "$name ($np ranks, reserve=$reserve): exit $rc after $took s (137: killed, it hung)"
    sed 's/^/    err: /' "$name.err" | head -5; ls -la "$WORK/$name" | sed 's/^/    /'
  fi
  # The checkpoint it kept restarts.
  if timeout 60 "$TESSERA" train "$deck" run.dir="$WORK/$name.restart" checkpoint.reserve=false \
       checkpoint.restart="$WORK/$name" checkpoint.dir="$WORK/$name.restart/ck" train.steps=$((kept + 1)) \
       >"$name.restart.log" 2>&1 && grep -q "restart: .*step_0*$kept\.h5 at step $kept" "$name.restart.log"; then
    pass "$name: the kept checkpoint restarts"
  else
    fail "$name: restart from the kept checkpoint"; tail -3 "$name.restart.log"
  fi
}
# Reserved up front: step 2 fits, step 4's reservation does not.
disk_full reserve_1rank 1 1300k true 4 2
disk_full reserve_dp2 2 1300k true 4 2 parallel.dp=2 train.batch_size=4 train.micro_batch=2
# Not reserved: steps 2 and 4 fit; step 6 finds room for its metadata (0.58 MB free), and its
# data writes fail part-way, on one rank or on both.
disk_full write_1rank 1 1600k false 6 4
disk_full write_dp2 2 1600k false 6 4 parallel.dp=2 train.batch_size=4 train.micro_batch=2
disk_full write_tp2 2 1600k false 6 4 parallel.tp=2
disk_full write_pp2 2 1600k false 6 4 parallel.pp=2 train.micro_batch=1
disk_full reserve_pp2 2 1300k true 4 2 parallel.pp=2 train.micro_batch=1
# Asynchronous checkpoints: the background writer meets the full disk, the job ends the same way.
disk_full async_dp2 2 1600k false 6 4 parallel.dp=2 train.batch_size=4 train.micro_batch=2 checkpoint.async=true
disk_full async_reserve_tp2 2 1300k true 4 2 parallel.tp=2 checkpoint.async=true

# A file system without fallocate (many parallel ones): an LD_PRELOAD shim makes it fail with
# EOPNOTSUPP, so the write takes the free-space check instead of the reservation.
cat >"$WORK/nofallocate.c" <<'C'
#define _GNU_SOURCE
#include <errno.h>
#include <sys/types.h>
int fallocate(int fd, int mode, off_t offset, off_t len) { (void)fd; (void)mode; (void)offset; (void)len; errno = EOPNOTSUPP; return -1; }
int fallocate64(int fd, int mode, off_t offset, off_t len) { return fallocate(fd, mode, offset, len); }
int posix_fallocate(int fd, off_t offset, off_t len) { (void)fd; (void)offset; (void)len; return EOPNOTSUPP; }
C
if cc -shared -fPIC -O1 -o "$WORK/nofallocate.so" "$WORK/nofallocate.c" 2>"$WORK/cc.err"; then
  export LD_PRELOAD=$WORK/nofallocate.so
  disk_full nofallocate_1rank 1 1300k true 4 2
  disk_full nofallocate_dp2 2 1300k true 4 2 parallel.dp=2 train.batch_size=4 train.micro_batch=2
  disk_full nofallocate_tp2 2 1600k true 6 4 parallel.tp=2
  unset LD_PRELOAD
else
  fail "cannot build the fallocate shim: $(head -1 "$WORK/cc.err")"
fi

# The disk fills up while a 4-rank (2,2,1) job runs (another writer on shared scratch), leaving
# room for a checkpoint's metadata but not its data, without the reservation: this hung for ever
# inside HDF5's collective flush (the fill values written through the new datasets failed on one
# rank). One line, exit 1, within 30 s.
tmpfs shared 4096k || fail "shared: mount"
( timeout -s KILL 120 $MPIEXEC -n 4 "$TESSERA" train "$deck" run.dir="$WORK/shared.run" \
    checkpoint.dir="$WORK/shared" checkpoint.every=4 checkpoint.reserve=false train.steps=40 \
    train.batch_size=8 train.micro_batch=2 parallel.dp=2 parallel.tp=2 >shared.out 2>shared.err
  echo $? >shared.rc ) &
wait_for_line shared.out "^step " 60
"$PYTHON" -c 'import os, sys
st = os.statvfs(sys.argv[1])
open(os.path.join(sys.argv[1], "filler"), "wb").write(b"\0" * (st.f_bavail * st.f_frsize - 393 * 1024))' "$WORK/shared"
start=$SECONDS
wait
took=$((SECONDS - start))
if [ "$(cat shared.rc)" = 1 ] && [ "$took" -le 30 ] && [ "$(wc -l <shared.err)" -eq 1 ] &&
   grep -Eq "^(rank [0-9]+: )?checkpoint step 4: disk full on $WORK/shared \(a checkpoint needs about [0-9.]+ MB, 0\.[34] MB are free\): no earlier checkpoint to keep$" shared.err &&
   ! ls "$WORK/shared"/*.tmp >/dev/null 2>&1; then
  pass "disk filled by another writer, 4 ranks, no reservation: exit 1 in $took s: $(cat shared.err)"
else
  fail "disk filled by another writer, 4 ranks: exit $(cat shared.rc) after $took s (137: it hung)"; head -3 shared.err
fi

# The disk fills up in the middle of a checkpoint write (another writer takes the last bytes just
# as the write begins; an LD_PRELOAD shim in rank 1 does it at its first write to the .tmp file),
# without the reservation, on 4 ranks (2,2,1): HDF5's collective metadata flush then fails on some
# ranks only and every rank waits inside HDF5; the job must still end within 30 s with one line.
cat >"$WORK/fill.c" <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>
static int done;
static void fill(int fd) {
  char link[64], path[4096];
  const char* dir = getenv("FILL_DIR");
  const char* rank = getenv("PMI_RANK");
  if (done || !dir || !rank || strcmp(rank, "1") != 0) return;
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n < 7) return;
  path[n] = 0;
  if (strcmp(path + n - 7, ".h5.tmp") != 0) return;
  done = 1;
  struct statvfs st;
  char filler[4200];
  snprintf(filler, sizeof filler, "%s/filler", dir);
  int f = open(filler, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  static char zeros[1 << 16];
  if (f >= 0) {
    while (statvfs(dir, &st) == 0 && st.f_bavail > 0)
      if (syscall(1, f, zeros, sizeof zeros) <= 0) break;  /* write(2), not this shim */
    close(f);
  }
}
ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset) {
  static ssize_t (*real)(int, const void*, size_t, off_t);
  if (!real) real = (ssize_t (*)(int, const void*, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
  fill(fd);
  return real(fd, buf, count, offset);
}
ssize_t pwrite64(int fd, const void* buf, size_t count, off_t offset) { return pwrite(fd, buf, count, offset); }
ssize_t write(int fd, const void* buf, size_t count) {
  static ssize_t (*real)(int, const void*, size_t);
  if (!real) real = (ssize_t (*)(int, const void*, size_t))dlsym(RTLD_NEXT, "write");
  fill(fd);
  return real(fd, buf, count);
}
C
if cc -shared -fPIC -O1 -o "$WORK/fill.so" "$WORK/fill.c" -ldl 2>"$WORK/cc.err"; then
  tmpfs midwrite 4096k || fail "midwrite: mount"
  start=$SECONDS
  FILL_DIR=$WORK/midwrite LD_PRELOAD=$WORK/fill.so timeout -s KILL 120 $MPIEXEC -n 4 "$TESSERA" train "$deck" \
    run.dir="$WORK/midwrite.run" checkpoint.dir="$WORK/midwrite" checkpoint.every=4 checkpoint.reserve=false \
    train.steps=40 train.batch_size=8 train.micro_batch=2 parallel.dp=2 parallel.tp=2 >midwrite.out 2>midwrite.err
  rc=$? took=$((SECONDS - start))
  # One line from tessera; MPICH's own "Abort(1) on node 0 ..." may follow the MPI_Abort.
  if [ "$rc" = 1 ] && [ "$took" -le 40 ] && [ "$(grep -c "checkpoint step" midwrite.err)" -eq 1 ] &&
     [ "$(grep -vc "^Abort(1) on node" midwrite.err)" -eq 1 ] &&
     grep -Eq "^(rank [0-9]+: )?checkpoint step 4: disk full on $WORK/midwrite \(.*\): no earlier checkpoint to keep$" midwrite.err &&
     ! ls "$WORK/midwrite"/*.tmp >/dev/null 2>&1; then
    pass "disk filled in the middle of a write, 4 ranks: exit 1 ($took s with start-up): $(cat midwrite.err)"
  else
    fail "disk filled in the middle of a write, 4 ranks: exit $rc after $took s (137: it hung)"; head -3 midwrite.err
  fi
else
  fail "cannot build the filling shim: $(head -1 "$WORK/cc.err")"
fi

# run.dir full before the start: refused at once, nothing trained.
tmpfs fullrun 64k
dd if=/dev/zero of="$WORK/fullrun/filler" bs=4k count=100 2>/dev/null
expect_error run_dir_full 1 "^cannot write $WORK/fullrun/(\.tessera\.lock|deck\.yaml|metrics\.jsonl).*: No space left on device$" \
  timeout 60 "$TESSERA" train "$deck" run.dir="$WORK/fullrun" checkpoint.dir="$WORK/fullrun_ck"

# run.dir fills up during the run (metrics.jsonl grows a line a step; checkpoints go elsewhere):
# every rank stops at the next step boundary, exit 1.
tmpfs smallrun 16k
timeout -s KILL 120 $MPIEXEC -n 2 "$TESSERA" train "$deck" parallel.dp=2 run.dir="$WORK/smallrun" \
  checkpoint.dir="$WORK/smallrun_ck" train.steps=2000 >smallrun.out 2>smallrun.err
rc=$?
if [ "$rc" -eq 1 ] && [ "$(wc -l <smallrun.err)" -eq 1 ] &&
   grep -q "^cannot write $WORK/smallrun/metrics\.jsonl: No space left on device$" smallrun.err &&
   ! grep -q "^done:" smallrun.out; then
  pass "run.dir filling up during the run: exit 1 at $(grep -c '^step' smallrun.out) steps: $(cat smallrun.err)"
else
  fail "run.dir filling up: exit $rc"; sed 's/^/    err: /' smallrun.err | head -3
fi

# A read-only checkpoint directory: found at the start, not after training.
tmpfs readonly 64k ro
expect_error checkpoint_dir_read_only 1 "^cannot create files in $WORK/readonly: Read-only file system$" \
  timeout 60 "$TESSERA" train "$deck" run.dir="$WORK/ro_run" checkpoint.dir="$WORK/readonly"
if [ -e "$WORK/ro_run/metrics.jsonl" ] && [ -s "$WORK/ro_run/metrics.jsonl" ]; then
  fail "the read-only run trained"
else
  pass "the read-only run trained nothing"
fi
finish
