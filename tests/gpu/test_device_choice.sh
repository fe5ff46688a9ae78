#!/usr/bin/env bash
# Which GPU each rank takes, and a GPU failure on one rank (make test-gpu; make test-cuda-host on
# the emulator):
#   - under mpiexec inside a Slurm allocation every rank inherits SLURM_LOCALID=0: the ranks still
#     take GPUs 0 and 1 (the launcher's own MPI_LOCALRANKID decides), and the log says so;
#   - two ranks of a node on one GPU (CUDA_VISIBLE_DEVICES=0 for both) are refused before
#     anything is allocated: one line naming both ranks and the GPU, exit 2;
#   - (emulator) one rank out of device memory, while its peer goes on into training: that
#     rank's one line and a non-zero exit within seconds, not a hang in ncclCommDestroy;
#   - (emulator) NCCL reporting a lost peer (ncclRemoteError) to one rank in the middle of the
#     data-parallel sums on their own stream: that rank's one line naming the communicator, its
#     size and the call, and the job ended within seconds (30 s allowed, start-up included on a
#     loaded machine), where cudaStreamSynchronize would wait
#     until the wall time; (emulator) a hung collective with run.hang_timeout ended, exit 5, and
#     so a group of sends and receives that never connects and a finalisation that never meets
#     its peer (NCCL's nonblocking calls, polled); the default bound of 900 s in the device line;
#   - (emulator) device.precision fp8 on a GPU of compute capability 8.0: refused in one line; on
#     9.0 its MFU measured against the FP8 peak.
# TESSERA, TESSERA_GPUS and TESSERA_EMU as in test_trainer.sh. Without a GPU: skipped.
# shellcheck source=tests/integration/lib.sh
source "$(dirname "$0")/../integration/lib.sh"
gpus=${TESSERA_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)}
if [ "${gpus:-0}" -lt 1 ]; then
  echo "test_device_choice: no GPU: skipped"
  exit 0
fi
deck=$(tiny_deck choice)
cd "$WORK" || exit 1
common=(device.backend=cuda train.steps=1 eval.batches=1 parallel.dp=2 train.batch_size=4)

if [ "$gpus" -ge 2 ]; then
  if SLURM_LOCALID=0 timeout -k 10 300 "$MPIEXEC" -n 2 "$TESSERA" train "$deck" "${common[@]}" \
       run.dir="$WORK/slurm" >slurm.log 2>&1 &&
     grep -q '^device: cuda: CUDA, fp32, GPU by rank: 0->0 1->1 ' slurm.log; then
    pass "SLURM_LOCALID=0 inherited by both ranks: $(grep '^device:' slurm.log)"
  else
    fail "SLURM_LOCALID=0 inherited by both ranks:"; grep -E '^device:|rror' slurm.log | sed 's/^/    /'
  fi
else
  echo "test_device_choice: 1 GPU: the two-rank GPU choice is skipped"
fi

# The refusal is one line, from rank 0 alone, and no step ran. Only tessera's own lines are
# counted: on a node the launcher, UCX or NCCL may add warnings of their own to either stream.
CUDA_VISIBLE_DEVICES=0 timeout -k 10 120 "$MPIEXEC" -n 2 "$TESSERA" train "$deck" "${common[@]}" \
  run.dir="$WORK/shared" >out.txt 2>err.txt
rc=$?
shared='device\.backend = cuda, but ranks 0 and 1 on .+ would share one GPU \(GPU-[0-9a-f-]+, their device 0 and 0\): each rank needs a GPU of its own'
if [ "$rc" -eq 2 ] && [ "$(grep -Ec "$shared" err.txt)" -eq 1 ] && ! grep -q '^step ' out.txt; then
  pass "two ranks on one GPU refused: $(grep -E "$shared" err.txt)"
else
  fail "two ranks on one GPU: exit $rc"; sed 's/^/    err: /' err.txt | head -5; sed 's/^/    out: /' out.txt | head -3
fi

# COMMAND...: run under a 60 s limit, its output in out.txt and err.txt; sets rc and took (s).
timed() {
  local start
  start=$(date +%s)
  timeout -k 5 60 "$@" >out.txt 2>err.txt
  rc=$?
  took=$(( $(date +%s) - start ))
}

if [ -n "${TESSERA_EMU:-}" ]; then
  # device.precision fp8 on a GPU without FP8 tensor cores (the emulator reporting an A100's
  # compute capability): refused in one line naming the rank, the GPU and its capability.
  expect_error "fp8 on compute capability 8.0" 2 \
    "device\.precision = fp8 needs FP8 tensor cores \(compute capability 8\.9 or later: Ada, Hopper, Blackwell\), but rank 0's GPU 0 is tessera CUDA emulator, compute capability 8\.0; use device\.precision: bf16$" \
    env TESSERA_EMU_COMPUTE=8.0 "$TESSERA" train "$deck" device.backend=cuda device.precision=fp8 \
    train.steps=1 run.dir="$WORK/fp8_old"
  # On a Hopper (the emulator reporting 9.0) an fp8 run's MFU is measured against the FP8 dense
  # peak, as the planner's.
  if env TESSERA_EMU_COMPUTE=9.0 "$TESSERA" train "$deck" device.backend=cuda device.precision=fp8 \
       train.steps=1 eval.batches=1 log.peak_gflops=0 run.dir="$WORK/fp8_hopper" >fp8_hopper.log 2>&1 &&
     grep -q '^peak: 1979000.0 GFLOP/s per rank (GPU datasheet, FP8)' fp8_hopper.log; then
    pass "fp8 on compute capability 9.0: $(grep '^peak:' fp8_hopper.log)"
  else
    fail "fp8 on compute capability 9.0:"; grep -E '^peak:|rror' fp8_hopper.log | sed 's/^/    /'
  fi
  # Room for what device::init takes but not for the run's buffers, from a 1-rank run's log.
  "$TESSERA" train "$deck" device.backend=cuda train.steps=1 eval.batches=1 run.dir="$WORK/one" \
    >one.log 2>&1
  limit=$(awk '/cuBLAS workspace and reduction scratch:/ { init = $(NF - 1) }
               /total: .* MB in one allocation/ { arena = $2 }
               END { if (init && arena) printf "%d", (init + arena / 2) * 1e6 }' one.log)
  timed "$MPIEXEC" -n 1 -env TESSERA_EMU_DEVICE_MEMORY "${limit:-1}" "$TESSERA" train "$deck" \
    "${common[@]}" run.dir="$WORK/oom" : -n 1 "$TESSERA" train "$deck" "${common[@]}" \
    run.dir="$WORK/oom"
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] && [ "$took" -lt 60 ] &&
     [ "$(grep -c 'cudaMalloc of .* out of memory' err.txt)" -eq 1 ] &&
     grep -Eq '^rank 0: rank 0, GPU 0: cudaMalloc of [0-9.]+ MB .*failed: out of memory: [0-9.]+ MB free of [0-9.]+ MB' err.txt; then
    pass "one rank out of GPU memory ended the job in ${took} s (exit $rc): $(grep 'out of memory' err.txt)"
  else
    fail "one rank out of GPU memory: exit $rc after ${took} s"; sed 's/^/    err: /' err.txt | head -5
  fi

  # Rank 1's NCCL answers ncclRemoteError once it has queued 3 calls (the step's sums).
  timed "$MPIEXEC" -n 1 "$TESSERA" train "$deck" "${common[@]}" train.steps=3 \
    run.dir="$WORK/lost" : -n 1 -env TESSERA_EMU_NCCL_ERROR 3 "$TESSERA" train "$deck" \
    "${common[@]}" train.steps=3 run.dir="$WORK/lost"
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] && [ "$took" -lt 30 ] &&
     grep -Eq '^rank 1: rank 1, GPU 1: NCCL communicator dpcp \(2 ranks, last call nccl [a-z_]+\) failed: remote process exited or there was a network error' err.txt; then
    pass "NCCL's lost peer ended the job in ${took} s (exit $rc): $(grep 'NCCL communicator' err.txt)"
  else
    fail "NCCL's lost peer: exit $rc after ${took} s"; sed 's/^/    err: /' err.txt | head -5
  fi

  # Rank 1's streams never finish once it has queued 3 NCCL calls, and no error says why (a
  # collective whose peer hangs): with run.hang_timeout = 3 its bounded stream wait or the
  # watchdog ends the job, exit 5, naming the timeout, instead of spinning until the wall time.
  timed "$MPIEXEC" -n 1 "$TESSERA" train "$deck" "${common[@]}" train.steps=3 \
    run.hang_timeout=3 run.dir="$WORK/hung" : -n 1 -env TESSERA_EMU_NCCL_HANG 3 "$TESSERA" train \
    "$deck" "${common[@]}" train.steps=3 run.hang_timeout=3 run.dir="$WORK/hung"
  if [ "$rc" -eq 5 ] && [ "$took" -lt 15 ] && grep -q 'run.hang_timeout' err.txt; then
    pass "a hung collective ended the job in ${took} s (exit 5): $(grep -m1 'run.hang_timeout' err.txt)"
  else
    fail "a hung collective: exit $rc after ${took} s"; sed 's/^/    err: /' err.txt | head -5
  fi

  # The calls that wait for the peers inside NCCL, on its nonblocking communicators
  # (parallel/nccl_comm.cpp): rank 1's group of pipeline sends and receives that never connects,
  # and its finalisation at the end of a finished run that never meets the peer
  # (TESSERA_EMU_NCCL_STUCK). Each is polled under the bound and ends the job, exit 5, naming the
  # call, where a blocking ncclGroupEnd or ncclCommDestroy would wait until the wall time.
  pp=(device.backend=cuda train.steps=2 eval.batches=1 parallel.pp=2 train.batch_size=4 run.hang_timeout=3)
  dp=("${common[@]}" run.hang_timeout=3)
  for stuck in group_end finalize; do
    if [ $stuck = group_end ]; then args=("${pp[@]}"); call=ncclGroupEnd; else args=("${dp[@]}"); call=ncclCommFinalize; fi
    timed "$MPIEXEC" -n 1 "$TESSERA" train "$deck" "${args[@]}" run.dir="$WORK/stuck_$stuck" : \
      -n 1 -env TESSERA_EMU_NCCL_STUCK $stuck "$TESSERA" train "$deck" "${args[@]}" \
      run.dir="$WORK/stuck_$stuck"
    if [ "$rc" -eq 5 ] && [ "$took" -lt 20 ] &&
       grep -Eq "^rank 1[:,] .*$call on NCCL communicator [a-z]+ \(2 ranks\): the device did not finish in [0-9]+ s \(run.hang_timeout" err.txt; then
      pass "a stuck $call ended the job in ${took} s (exit 5): $(grep -m1 "$call" err.txt)"
    else
      fail "a stuck $call: exit $rc after ${took} s"; sed 's/^/    err: /' err.txt | head -5
      tail -3 out.txt | sed 's/^/    out: /'
    fi
  done
  # Without run.hang_timeout a GPU run's waits are bounded all the same (15 minutes), and the
  # device line says so.
  if grep -q '^device: cuda: CUDA, fp32, .*host waits on the GPU end after 900 s)$' one.log; then
    pass "the default bound of host waits: $(grep -o 'host waits.*' one.log)"
  else
    fail "the default bound of host waits: $(grep '^device:' one.log)"
  fi
fi
finish
