#!/usr/bin/env bash
# device.backend and device.precision on a machine without a usable GPU (the CI machines): `cuda`
# stops before training with one line naming why (no GPU on a rank, or a build without the CUDA
# backend), exit 2 and nothing written; `auto` trains on the CPU and says so; bf16 needs a GPU.
# On a machine with a GPU the cuda checks here do not apply and are skipped (tests/gpu covers it).
source "$(dirname "$0")/lib.sh"
deck=$(tiny_deck dev)
cd "$WORK" || exit 1

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "a GPU is visible here: the no-GPU checks do not apply (make test-gpu covers the GPU)"
  pass "device: skipped on a GPU machine"
  finish
fi

nogpu='device\.backend = cuda, but (rank 0 has no GPU: .+|this tessera was built without the CUDA backend .+); use device\.backend: cpu'
expect_error cuda_without_gpu 2 "^.*/dev\.yaml: $nogpu" "$TESSERA" train "$deck" device.backend=cuda \
  run.dir="$WORK/run_cuda"
[ -e "$WORK/run_cuda" ] && fail "cuda_without_gpu left a run directory"

# Two ranks: every rank decides together, one line from rank 0, the same exit status.
expect_error cuda_without_gpu_2ranks 2 "^.*/dev\.yaml: $nogpu" timeout 120 $MPIEXEC -n 2 \
  "$TESSERA" train "$deck" device.backend=cuda parallel.dp=2 run.dir="$WORK/run_cuda2"

expect_error bf16_without_gpu 2 \
  '^.*/dev\.yaml: device\.precision = bf16 needs (a GPU on every rank, but rank 0 has no GPU|the CUDA backend).*use device\.precision: fp32$' \
  "$TESSERA" train "$deck" device.backend=auto device.precision=bf16 run.dir="$WORK/run_bf16"

expect_error bf16_on_cpu 2 'device\.precision = bf16 needs device\.backend: cuda or auto' \
  "$TESSERA" train "$deck" device.precision=bf16
expect_error bad_precision 2 "device\.precision=fp16: must be fp32, bf16 or fp8, got 'fp16'" \
  "$TESSERA" train "$deck" device.precision=fp16

# auto: trains on the CPU, and the log says so and why.
if "$TESSERA" train "$deck" device.backend=auto train.steps=2 run.dir="$WORK/run_auto" >"$WORK/auto.txt" 2>&1 &&
   grep -Eq '^device: auto: (rank 0 has no GPU: .+|this tessera was built without the CUDA backend): training on the CPU$' "$WORK/auto.txt" &&
   grep -q '^step      2/2' "$WORK/auto.txt"; then
  pass "auto_picks_cpu: $(grep '^device:' "$WORK/auto.txt")"
else
  fail "auto_picks_cpu:"; sed 's/^/    /' "$WORK/auto.txt" | head -20
fi
# make test-gpu's binary (a CUDA build only): where no GPU exists it says so and succeeds; where
# the driver lists a GPU that CUDA cannot use (here: a driver folder that names one, and no CUDA
# driver at all) it fails, and says why. Either way it prints the driver and runtime versions.
if [ -x "$ROOT/bin/gpu_tests" ]; then
  "$ROOT/bin/gpu_tests" >gt.txt 2>&1
  rc=$?
  if [ "$rc" -eq 0 ] && grep -q '^test-gpu: no GPU: skipped (' gt.txt &&
     grep -q '^test-gpu: CUDA driver [0-9]*\.[0-9]*, runtime [0-9]*\.[0-9]*' gt.txt; then
    pass "gpu_tests without a GPU: $(tr '\n' ' ' <gt.txt)"
  else
    fail "gpu_tests without a GPU: exit $rc"; sed 's/^/    /' gt.txt | head -5
  fi
  mkdir -p fake_proc/0000:3b:00.0
  TESSERA_NVIDIA_PROC=$WORK/fake_proc "$ROOT/bin/gpu_tests" >gt.txt 2>&1
  rc=$?
  if [ "$rc" -ne 0 ] && grep -q '^test-gpu: FAILED: 1 GPU is present, but CUDA cannot use it: ' gt.txt; then
    pass "gpu_tests with an unusable GPU fails: $(grep FAILED gt.txt)"
  else
    fail "gpu_tests with an unusable GPU: exit $rc"; sed 's/^/    /' gt.txt | head -5
  fi
else
  echo "no bin/gpu_tests (a build without nvcc): its checks are skipped"
fi
# cpu (the default) says nothing about devices.
if "$TESSERA" train "$deck" train.steps=1 run.dir="$WORK/run_cpu" >"$WORK/cpu.txt" 2>&1 &&
   ! grep -q '^device:' "$WORK/cpu.txt"; then
  pass "cpu_is_silent"
else
  fail "cpu_is_silent:"; sed 's/^/    /' "$WORK/cpu.txt" | head -20
fi
finish
