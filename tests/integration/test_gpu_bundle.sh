#!/usr/bin/env bash
# The GPU bundle (make gpu-bundle, tools/gpu/bundle.sh) on a machine without a GPU: built from
# this build's CUDA binaries, under 40 MB, unpacked into an empty directory and run with a clean
# environment (only PATH and HOME): `run.sh --cpu-smoke` finds every library in the bundle,
# glibc, the C++ runtime or the CUDA toolkit's lib64 (ldd), and tessera trains on 1 and 2 ranks
# of the CPU with the same losses and tensors, through the bundle's own mpiexec and its
# `tessera ckpt diff` (no h5py). Once with the node's C++ runtime, once with the bundle's. Then
# `run.sh --plan` (what the node lacks, the steps' order) and the carried float64 references of
# the derived fp32 bound read with `python3 -S` (no h5py, no numpy). Only in a CUDA build (the
# bundle carries the CUDA binaries); skipped otherwise.
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
# --plan here (no GPU): the summary's first line names what the node lacks, and the steps come
# in the order of their value (tools/gpu/bundle_run.sh), the 480 s budget reaching the PyTorch
# bench (and the breakdown after it where no sanitizer took its minutes); 100 s leave the
# benches to a second call, with the --only that runs them.
B=$WORK/empty/tessera-gpu
if env -i PATH=/usr/bin:/bin HOME="$HOME" bash "$B/run.sh" --plan --budget 480 --out "$WORK/plan" \
     >"$WORK/plan.log" 2>&1 &&
   head -1 "$WORK/plan/summary.md" | grep -q '^CANNOT RUN: the node lacks a GPU (nvidia-smi lists none)' &&
   [ "$(grep -o '^would run [a-z_0-9]*' "$WORK/plan.log" | cut -d' ' -f3 | grep -v '^sanitizer_' | tr '\n' ' ' |
        sed 's/ breakdown $/ /')" = "gpu_tests test_trainer test_device_choice bench_experts bench_fp8 bench_tessera bench_torch " ] &&
   env -i PATH=/usr/bin:/bin HOME="$HOME" bash "$B/run.sh" --plan --budget 100 --out "$WORK/plan100" \
     >"$WORK/plan100.log" 2>&1 &&
   grep -q '^SKIP bench_tessera: [0-9]* s of the budget left, it needs about 50 s (--only bench_tessera runs it)$' "$WORK/plan100.log" &&
   grep -q '^cuda=[0-9]*\.[0-9]*$' "$B/BUILD_INFO" && grep -q '^arch=[0-9;]*$' "$B/BUILD_INFO"; then
  pass "run.sh --plan: $(head -1 "$WORK/plan/summary.md" | cut -c1-60)...; $(grep -c '^would run' "$WORK/plan.log") steps in order; $(tr '\n' ' ' <"$B/BUILD_INFO")"
else
  fail "run.sh --plan:"; sed 's/^/    /' "$WORK/plan.log" | head -20
fi
# The carried float64 references of the derived fp32 bound, read as a GPU node reads them: the
# comparison with `python3 -S` (no site packages: no h5py, no numpy), this machine's
# initialisation equal to the one the reference started from.
# shellcheck source=tests/gpu/floor_refs.sh
source "$ROOT/tests/gpu/floor_refs.sh"
deck=$(tiny_deck gpu)
refs=$B/build/floor
if "$TESSERA" train "$deck" "${floor_common[@]}" device.backend=cpu run.dir="$WORK/floor_cpu" \
     >"$WORK/floor_cpu.log" 2>&1 &&
   "$TESSERA" train "$deck" "${floor_common[@]}" device.backend=cpu train.steps=0 \
     optim.decay_steps=10 run.dir="$WORK/floor_init" >/dev/null 2>&1 &&
   "$TESSERA" ckpt diff "$refs/cuda_fp32_floor.init.h5" \
     "$WORK/floor_init/checkpoints/step_00000000.h5" >"$WORK/floor_init.diff" &&
   ! grep '^model/' "$WORK/floor_init.diff" | cut -f6 | grep -qv '^1$' &&
   out=$(TESSERA=$TESSERA "$PYTHON" -S "$B/tests/gpu/fp32_floor.py" --reference "$refs/cuda_fp32_floor.ref.h5" \
           --losses "$refs/cuda_fp32_floor.losses.json" --floor "$WORK/floor_cpu" \
           --run "$WORK/floor_cpu" --step 10 2>&1); then
  pass "the carried float64 floor, read with python3 -S: $out"
else
  fail "the carried float64 floor: ${out:-}"; tail -3 "$WORK/floor_cpu.log" | sed 's/^/    /'
fi
# ldd of the unpacked binary names the bundle's libraries, not the build machine's.
if grep -q "$WORK/empty/tessera-gpu/lib/libhdf5_mpich" "$WORK/smoke0/ldd_tessera.txt" &&
   grep -q "$WORK/empty/tessera-gpu/lib/libmpich" "$WORK/smoke0/ldd_tessera.txt"; then
  pass "ldd: HDF5 and MPICH from the bundle"
else
  fail "ldd: $(grep -E 'hdf5|mpich' "$WORK/smoke0/ldd_tessera.txt" | tr '\n' ';')"
fi
# Every script or tool the bundled scripts call by "$ROOT/..." travels with them (an H200 run
# once lacked tests/gpu/compare_amax.py and failed that comparison).
B=$WORK/empty/tessera-gpu
named=$(cat "$B"/tests/gpu/*.sh "$B"/tests/integration/*.sh "$B"/run.sh |
        grep -o '\$ROOT/\(tests\|tools\)/[A-Za-z0-9_/.-]*\.\(py\|sh\)' | sed 's|^\$ROOT/||' | sort -u)
# These make what bundle.sh carries made (the token files, the float64 references): the node
# runs them only where those are missing.
made_here=" tests/gpu/floor_reference.py tools/data/prepare_data.py tools/reference/reference_gpt.py "
missing=$(for f in $named; do [ -e "$B/$f" ] || [[ $made_here == *" $f "* ]] || echo "$f"; done)
if [ -n "$named" ] && [ -z "$missing" ]; then
  pass "the bundled scripts' $(echo "$named" | wc -l) named scripts and tools are all in the bundle"
else
  fail "named by the bundled scripts but not in the bundle: $(echo $missing)"
fi
finish
