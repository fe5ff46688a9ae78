#!/usr/bin/env bash
# The GPU bundle (make gpu-bundle, tools/gpu/bundle.sh) on a machine without a GPU: built from
# this build's CUDA binaries, under 40 MB, unpacked into an empty directory and run with a clean
# environment (only PATH and HOME): `run.sh --cpu-smoke` finds every library in the bundle,
# glibc, the C++ runtime or the CUDA toolkit's lib64 (ldd), and tessera trains on 1 and 2 ranks
# of the CPU with the same losses and tensors, through the bundle's own mpiexec and its
# `tessera ckpt diff` (no h5py). Once with the node's C++ runtime, once with the bundle's. Only in
# a CUDA build (the bundle carries the CUDA binaries); skipped otherwise.
source "$(dirname "$0")/lib.sh"
if ! objdump -p "$TESSERA" 2>/dev/null | grep -q 'NEEDED.*libcudart'; then
  echo "test_gpu_bundle: not a CUDA build: skipped"
  exit 0
fi
test_data
tarball=$ROOT/build/tessera-gpu.tar.xz
if ! (cd "$ROOT" && PYTHON=$PYTHON bash tools/gpu/bundle.sh "$tarball") >"$WORK/bundle.log" 2>&1; then
  fail "tools/gpu/bundle.sh:"; tail -5 "$WORK/bundle.log"; finish
fi
size=$(stat -c %s "$tarball")
if [ "$size" -lt $((40 * 1024 * 1024)) ]; then
  pass "bundle $(( size / 1024 / 1024 )) MB (< 40 MB): $(tail -1 "$WORK/bundle.log")"
else
  fail "bundle is $(( size / 1024 / 1024 )) MB, over 40 MB"
fi
mkdir -p "$WORK/empty" && tar -C "$WORK/empty" -xJf "$tarball"
for cxx in 0 1; do
  if env -i PATH=/usr/bin:/bin HOME="$HOME" TESSERA_BUNDLE_CXX=$cxx \
       bash "$WORK/empty/tessera-gpu/run.sh" --cpu-smoke --out "$WORK/smoke$cxx" >"$WORK/smoke$cxx.log" 2>&1 &&
     grep -q '^PASS cpu_same_losses' "$WORK/smoke$cxx/summary.md" &&
     [ "$(grep -c '^PASS bin/' "$WORK/smoke$cxx/summary.md")" -eq 4 ]; then
    pass "cpu smoke (TESSERA_BUNDLE_CXX=$cxx): $(head -1 "$WORK/smoke$cxx/summary.md")"
  else
    fail "cpu smoke (TESSERA_BUNDLE_CXX=$cxx):"; sed 's/^/    /' "$WORK/smoke$cxx.log" | tail -15
  fi
done
# ldd of the unpacked binary names the bundle's libraries, not the build machine's.
if grep -q "$WORK/empty/tessera-gpu/lib/libhdf5_mpich" "$WORK/smoke0/ldd_tessera.txt" &&
   grep -q "$WORK/empty/tessera-gpu/lib/libmpich" "$WORK/smoke0/ldd_tessera.txt"; then
  pass "ldd: HDF5 and MPICH from the bundle"
else
  fail "ldd: $(grep -E 'hdf5|mpich' "$WORK/smoke0/ldd_tessera.txt" | tr '\n' ';')"
fi
finish
