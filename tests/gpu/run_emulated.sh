#!/usr/bin/env bash
# `make test-cuda-host` (part of `make test`): the CUDA backend, kernels and host code alike,
# executed without a GPU by the emulated build (bin/gpu_tests-emu, bin/tessera-emu; the emulator
# is src/device/emu). Runs
#   - tests/gpu (every CUDA op against its CPU twin in fp32 and bf16, the two backends training
#     side by side, the emulator's own checks) in forward order and in a seeded random order of
#     blocks and threads (TESSERA_EMU_SEED, default 1: a missing barrier can pass in one order),
#     with asynchronous streams drained in two seeded orders (a missing event wait can pass in
#     one), all under the race detector for streams (on by default: TESSERA_EMU_RACES);
#   - the tensor- and data-parallel tests on 2 ranks, NCCL emulated over MPI, in both orders;
#   - tests/gpu/test_trainer.sh: `tessera train` on device.backend=cuda against the CPU, 1 rank,
#     2-rank layouts, tp=4 with a padding-only rank and (2,2,2) on 8 ranks;
#   - tests/gpu/test_device_choice.sh: each rank's GPU, two ranks on one GPU refused, one rank out
#     of device memory ending the job.
# Prints PASS/FAIL lines and exits non-zero on a failure.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MPIEXEC=${MPIEXEC:-mpiexec}
export OMP_NUM_THREADS=1 MPIR_CVAR_POLLS_BEFORE_YIELD=1
seed=${TESSERA_EMU_SEED:-1}
fails=0
run() {  # NAME COMMAND...: the command's output on failure, its last line on success
  local name=$1 start log
  shift
  start=$(date +%s)
  log=$(mktemp)
  if "$@" >"$log" 2>&1; then
    echo "PASS $name ($(( $(date +%s) - start )) s): $(grep -E '^\[  PASSED  \]|passed|^[0-9]+ passed' "$log" | tail -1)"
  else
    # Every failed test by name (gtest lists them at the end), the emulator's diagnoses, the
    # first failures' details, and the last lines (an abort's).
    echo "FAIL $name:"
    { grep -E '^\[  FAILED  \] [^ ]+' "$log" | sort -u
      grep 'cuda emulator:' "$log" | head -5
      grep -E 'Failure|error' "$log" | grep -v 'cuda emulator:' | head -15
      echo "..."; tail -3 "$log"; } | sed 's/^/    /'
    fails=$((fails + 1))
  fi
  rm -f "$log"
}
# Streams deferred and drained in a seeded order (TESSERA_EMU_STREAMS, device/emu/streams.hpp),
# two seeds: a missing event wait lets work run before what it reads in some order.
for run_no in 1 2; do
  if [ "$run_no" = 1 ]; then order=forward; else order=random:$seed; fi
  streams=async:$((seed + run_no - 1))
  run "gpu_tests ($order, $streams)" env TESSERA_EMU_ORDER="$order" TESSERA_EMU_STREAMS="$streams" \
    "$ROOT/bin/gpu_tests-emu"
  run "gpu_tests on 2 ranks ($order, $streams)" env TESSERA_EMU_ORDER="$order" \
    TESSERA_EMU_STREAMS="$streams" "$MPIEXEC" -n 2 "$ROOT/bin/gpu_tests-emu" \
    --gtest_filter='CudaModelTp.*:CudaModelDp.*'
done
# The same stream tests with the race detector off (TESSERA_EMU_RACES, device/emu/races.hpp): a
# missing event wait must then show as a wrong answer in some drain, as it did before the detector.
run "stream tests, race detector off" env TESSERA_EMU_RACES=off TESSERA_EMU_STREAMS=async:$seed \
  "$ROOT/bin/gpu_tests-emu" --gtest_filter='EmulatorStreams.*'
# The GPU bundle's experts' GEMM bench (tools/gpu/bundle_run.sh: bench_experts) at toy shapes:
# both ways run and each row is printed (balanced and skewed).
run "gpu_tests --bench-experts --tiny" bash -c "TESSERA_EMU_STREAMS=async:$seed \"$ROOT/bin/gpu_tests-emu\" \
  --bench-experts --tiny | grep -c '^| toy 4 experts | ' | grep -qx 2"
for script in test_trainer test_device_choice; do
  echo "=== $script (forward order, async:$seed streams)"
  TESSERA=$ROOT/bin/tessera-emu TESSERA_GPUS=8 TESSERA_EMU=1 TESSERA_EMU_STREAMS=async:$seed \
    bash "$ROOT/tests/gpu/$script.sh" || fails=$((fails + 1))
done
echo "test-cuda-host: $fails failed"
[ "$fails" -eq 0 ]
