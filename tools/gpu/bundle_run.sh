#!/usr/bin/env bash
# run.sh of the GPU bundle (tools/gpu/bundle.sh makes it): unpack anywhere, then
#
#   tessera-gpu/run.sh [--out DIR] [--budget SECONDS] [--only STEPS] [--skip STEPS] [--plan]
#       the GPU checks and benches, in the order of their value, until the budget (default 480 s)
#       is spent; results in DIR (default ./tessera-gpu-results)
#   tessera-gpu/run.sh --cpu-smoke [--out DIR]
#       no GPU needed: every library resolves from the bundle, glibc or the node's CUDA, and
#       tessera trains on 1 and 2 ranks of the CPU with the same losses
#
# The steps, in the order they run, with the minutes each took on one H200 (2026-11-28, the
# first lease; gpu_tests_2ranks and the sanitizers not yet run there: estimates):
#   gpu_tests        0.05 every CUDA op against the CPU in double, FP8 GEMMs within Hopper's
#                         accumulation bound, the two backends training side by side
#   gpu_tests_2ranks 0.5  (2+ GPUs) tensor and data parallel over NCCL
#   test_trainer     0.55 tessera train on cuda against the CPU: fp32 (and its float64-derived
#                         bound), bf16, fp8, fused attention, recompute, LLaMA, 104-token
#                         sequences, restarts across backends; 2+ GPUs: the multi-rank layouts,
#                         one multi-communicator layout with device.nccl_overlap on and off
#   test_device_choice 0.02 which GPU each rank takes, two ranks on one GPU refused
#   bench_experts    0.2  (estimate) a MoE layer's expert GEMMs one cuBLAS call per expert
#                         against cublasGemmGroupedBatchedEx at Mixtral, Qwen3-MoE and
#                         DeepSeek-V3 shapes (device.expert_gemm's default comes from it)
#   bench_fp8        0.3  FP8 against bf16 training curves, a small GPT-2 and LLaMA, 400 steps
#   sanitizer_*      1.0  each of racecheck, synccheck, memcheck, initcheck over the CUDA op
#                         tests, boxed to 60 s (what the emulator cannot see)
#   bench_tessera    2.0  the trainer's step: GPT-2 124M and 1.3B, LLaMA 1B bf16 and fp8, then
#                         the other rows; tokens/s and MFU (about 30 s a row; stops starting
#                         rows at the budget)
#   bench_torch      5.0+ PyTorch on the same shapes: sdpa, then torch.compile, then the rest
#   breakdown        0.5  (estimate) the step breakdown from events on the stream, and their cost:
#                         a GPT-2 12 x 768 at T=256 trained 60 steps untimed, timed, timed,
#                         untimed (log.breakdown's auto stays off on a GPU until this measures
#                         it); after the benches take the budget: --only breakdown in a second call
# A step starts only when the budget left covers what it needs (a bench or sanitizer step: a
# third of its estimate), and runs under a timeout of what is left, so run.sh ends within the
# budget plus a few seconds and a call cut short still has DIR/summary.md up to its last finished
# step. The benches stop starting rows when their share is spent (tessera's half of what is left
# after the sanitizers, PyTorch's the rest); a step the budget skipped has a SKIP line naming
# the --only that runs it in a second call. --only and
# --skip take step names, comma separated (sanitizer: every sanitizer_* step); --plan prints what
# would run with the estimates standing in for the clock, and exits.
#
# DIR/summary.md: first the node (GPU, driver, CUDA, NCCL, what the bundle was built with) and,
# where the node cannot run it, one line saying exactly what it lacks; then one line per step as
# it ends (PASS/FAIL/SKIP, seconds); then the bench tables. DIR/<step>.log: each step's output.
# The node's CUDA runtime, cuBLAS and NCCL are found in $CUDA_HOME/lib64, /usr/local/cuda/lib64,
# $LD_LIBRARY_PATH, or the nvidia/*/lib folders of the python3 on PATH (PyTorch's wheels), in
# that order, in the major version the bundle was built with (BUILD_INFO). Exit 0 when every
# step that ran passed.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
mode=gpu
OUT=$PWD/tessera-gpu-results
BUDGET=480
ONLY="" SKIP="" PLAN=0
while [ $# -gt 0 ]; do
  case $1 in
    --cpu-smoke) mode=cpu ;;
    --out) OUT=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --only) ONLY=$2; shift ;;
    --skip) SKIP=$2; shift ;;
    --plan) PLAN=1 ;;
    -h|--help) sed -n '2,47p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case $BUDGET in ''|*[!0-9]*) echo "run.sh: --budget wants whole seconds, got '$BUDGET'" >&2; exit 2 ;; esac
START=$(date +%s)
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
SUMMARY=$OUT/summary.md
: >"$SUMMARY"
fails=0
note() { echo "$*"; echo "$*" >>"$SUMMARY"; }
info() { sed -n "s/^$1=//p" "$HERE/BUILD_INFO" 2>/dev/null; }

export PATH=$HERE/bin:$PATH
export UCX_MODULE_DIR=$HERE/lib/ucx
export PYTHON=${PYTHON:-$(command -v python3 || echo python3)}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
cuda_built=$(info cuda) cuda_major=$(info cuda_major)
cuda_major=${cuda_major:-13}

# What the node lacks, if anything, goes into the first line of the summary: `CANNOT RUN: ...`.
lacks=()
gpus=0
if [ "$mode" = gpu ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
  driver_cuda=$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | grep -o '[0-9.]*$')
  caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d . | sort -u | tr '\n' ' ')
  if [ "$gpus" -eq 0 ]; then
    lacks+=("a GPU (nvidia-smi lists none)")
  elif [ -n "$driver_cuda" ] && [ "${driver_cuda%%.*}" -lt "$cuda_major" ]; then
    lacks+=("a driver for CUDA $cuda_major: driver $driver supports CUDA $driver_cuda, the bundle was built with CUDA $cuda_built (CUDA $cuda_major needs driver 580 or later; or rebuild the bundle with the node's CUDA: make gpu-bundle CUDA_HOME=...)")
  fi
  archs=$(info arch | tr ';' ' ')
  [[ $archs =~ ^[0-9\ ]+$ ]] || caps=""  # unknown: not checked
  for cap in $caps; do  # SASS of the same major at or below it, or the PTX at or below it
    ok=0
    for a in $archs; do
      [ "${a:0:-1}" = "${cap:0:-1}" ] && [ "${a: -1}" -le "${cap: -1}" ] && ok=1
    done
    ptx=${archs##* }
    [ -n "$ptx" ] && [ "$ptx" -le "$cap" ] && ok=1
    [ $ok = 1 ] || lacks+=("a GPU the bundle has code for: compute capability $cap, the bundle has sm_$(info arch | sed 's/;/, sm_/g') (make gpu-bundle CUDA_ARCH=$cap)")
  done
fi

# The node's CUDA libraries: the first folder in the search order that holds each one.
candidates=()
[ -n "${CUDA_HOME:-}" ] && candidates+=("$CUDA_HOME/lib64" "$CUDA_HOME/lib")
candidates+=(/usr/local/cuda/lib64)
IFS=: read -r -a ld <<<"${LD_LIBRARY_PATH:-}"
candidates+=("${ld[@]}")
if wheels=$("$PYTHON" -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null); then
  while read -r w; do
    for d in "$w"/*/lib; do [ -d "$d" ] && candidates+=("$d"); done
  done <<<"$wheels"
fi
cuda_dirs=""
for lib in libcudart.so.$cuda_major libcublas.so.$cuda_major libcublasLt.so.$cuda_major libnccl.so.2; do
  found=""
  for d in "${candidates[@]}"; do
    if [ -n "$d" ] && [ -e "$d/$lib" ]; then found=$d; break; fi
  done
  if [ -z "$found" ]; then
    lacks+=("$lib (the bundle was built with CUDA $cuda_built; searched ${candidates[*]}: load the site's CUDA $cuda_major and NCCL modules or set CUDA_HOME)")
    continue
  fi
  case ":$cuda_dirs:" in *":$found:"*) ;; *) cuda_dirs=${cuda_dirs:+$cuda_dirs:}$found ;; esac
done
export LD_LIBRARY_PATH=$HERE/lib${cuda_dirs:+:$cuda_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# The C++ runtime: the node's own when it has the version the binaries need, else the bundle's
# (TESSERA_BUNDLE_CXX=1 forces the bundle's), which needs a newer glibc.
at_least() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" = "$1" ]; }
glibc_node=$(ldd --version 2>/dev/null | head -1 | grep -o '[0-9][0-9.]*$')
glibc_min=$(cat "$HERE/GLIBC_MIN")
cxx_min=$(cat "$HERE/GLIBCXX_MIN")
ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
node_cxx=$("$ldconfig" -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 /{print $NF; exit}')
if [ "${TESSERA_BUNDLE_CXX:-0}" != 1 ] && [ -n "$node_cxx" ] && grep -aq "$cxx_min" "$node_cxx"; then
  cxx="the node's ($node_cxx)"
else
  export LD_LIBRARY_PATH=$HERE/lib/cxx:$LD_LIBRARY_PATH
  cxx="the bundle's"
  node_cxx=""
  glibc_min=$(printf '%s\n%s\n' "$glibc_min" "$(cat "$HERE/GLIBC_MIN_CXX")" | sort -V | tail -1)
fi
at_least "$glibc_min" "$glibc_node" || lacks+=("glibc $glibc_min (the node has $glibc_node)")

if [ ${#lacks[@]} -gt 0 ]; then
  note "CANNOT RUN: the node lacks $(printf '%s; ' "${lacks[@]}" | sed 's/; $//')"
  [ "$PLAN" = 1 ] || exit 1
fi
note "bundle $(cat "$HERE/VERSION") (built with CUDA $cuda_built, cuBLAS $(info cublas), NCCL $(info nccl), for sm_$(info arch | sed 's/;/, sm_/g')) on $(hostname)"
note "node: glibc $glibc_node (needs >= $glibc_min), C++ runtime $cxx, CUDA libraries from ${cuda_dirs:-nowhere}"
if [ "$mode" = gpu ]; then
  note "device: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1) x $gpus; driver ${driver:-?} (CUDA ${driver_cuda:-?}); compute capability ${caps:-?}"
  for d in ${cuda_dirs//:/ }; do
    [ -e "$d/libnccl.so.2" ] && note "NCCL on the node: $(basename "$(readlink -f "$d/libnccl.so.2")") in $d"
  done
fi

# Every library each binary loads comes from the bundle, glibc, or the CUDA folders found above.
for exe in tessera gpu_tests mpiexec hydra_pmi_proxy; do
  bad=$(ldd "$HERE/bin/$exe" | awk -v here="$HERE/lib/" -v cuda=":$cuda_dirs:" -v cxx="$node_cxx" '
    /not found/ { print $1 " not found"; next }
    $3 ~ /^\// {
      path = $3; dir = path; sub(/\/[^\/]*$/, "", dir)
      if (index(path, here) == 1) next
      if (index(cuda, ":" dir ":")) next
      if ($1 ~ /^(libc|libm|libpthread|libdl|librt|libresolv)\.so/ || $1 ~ /ld-linux/) next
      if (cxx != "" && $1 ~ /^(libstdc\+\+|libgcc_s)\.so/) next
      print $1 " from " path
    }')
  if [ -n "$bad" ]; then
    note "FAIL bin/$exe loads libraries from outside the bundle: $(echo "$bad" | tr '\n' ';')"
    fails=$((fails + 1))
  else
    note "PASS bin/$exe: every library from the bundle, glibc, the C++ runtime or the node's CUDA"
  fi
done
ldd "$HERE/bin/tessera" >"$OUT/ldd_tessera.txt"

planned=0  # --plan: the estimates of the steps it would have run so far stand in for the clock
left() { echo $((BUDGET - ($(date +%s) - START) - planned)); }
wanted() {  # NAME: whether --only/--skip let it run
  local n=$1 w
  for w in ${SKIP//,/ }; do [[ $n == "$w" || ($w == sanitizer && $n == sanitizer_*) ]] && return 1; done
  [ -z "$ONLY" ] && return 0
  for w in ${ONLY//,/ }; do [[ $n == "$w" || ($w == sanitizer && $n == sanitizer_*) ]] && return 0; done
  return 1
}
# step NAME EST_S NEED_S COMMAND...: runs COMMAND in $OUT under a timeout of the budget left, when
# at least NEED_S seconds are left; its output in $OUT/NAME.log, one line in the summary.
step() {
  local name=$1 est=$2 need=$3 start rc l
  shift 3
  wanted "$name" || return 0
  l=$(left)
  if [ "$l" -lt "$need" ]; then
    note "SKIP $name: ${l} s of the budget left, it needs about $need s (--only $name runs it)"
    return 0
  fi
  if [ "$PLAN" = 1 ]; then
    echo "would run $name: about $est s, from about $((BUDGET - l)) s of the $BUDGET s budget"
    planned=$((planned + (est < l ? est : l)))
    return 0
  fi
  start=$(date +%s)
  (cd "$OUT" && timeout -k 10 "$l" "$@") >"$OUT/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    note "PASS $name ($(( $(date +%s) - start )) s)"
  else
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && rc="$rc: the budget ran out"
    note "FAIL $name (exit $rc, $(( $(date +%s) - start )) s): see $name.log"
    { grep -E '^\[  FAILED  \]|^FAIL|cuda emulator:|rror' "$OUT/$name.log" | head -12; echo "..."; tail -5 "$OUT/$name.log"; } |
      sed 's/^/    /' | tee -a "$SUMMARY"
    fails=$((fails + 1))
  fi
}

if [ "$mode" = cpu ]; then
  cat >"$OUT/smoke.yaml" <<DECK
model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 32}
data: {train: "$HERE/build/testdata/train.h5", val: "$HERE/build/testdata/val.h5", seq_len: 32}
train: {steps: 4, batch_size: 4}
optim: {eps: 1.0e-6}
eval: {batches: 1}
device: {backend: cpu, threads: 1}
DECK
  step version 1 0 "$HERE/bin/tessera" --version
  step cpu_1rank 5 0 "$HERE/bin/tessera" train smoke.yaml run.dir=one
  step cpu_2ranks 5 0 mpiexec -n 2 "$HERE/bin/tessera" train smoke.yaml run.dir=two parallel.dp=2
  step cpu_same_losses 2 0 env TESSERA="$HERE/bin/tessera" "$PYTHON" \
    "$HERE/tests/integration/compare_runs.py" one/metrics.jsonl one/checkpoints/step_00000004.h5 \
    two/metrics.jsonl two/checkpoints/step_00000004.h5
  note "cpu smoke: $fails failed"
  [ $fails -eq 0 ]
  exit $?
fi

[ "$PLAN" = 1 ] || nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
export TESSERA=$HERE/bin/tessera TESSERA_GPUS=$gpus MPIEXEC=mpiexec
export TESSERA_FLOOR_REFS=$HERE/build/floor  # the float64 references test_trainer.sh compares with
# Correctness first.
step gpu_tests 10 10 "$HERE/bin/gpu_tests"
[ "$gpus" -ge 2 ] && step gpu_tests_2ranks 30 30 mpiexec -n 2 "$HERE/bin/gpu_tests" \
  --gtest_filter='CudaModelTp.*:CudaModelDp.*'
step test_trainer 45 45 bash "$HERE/tests/gpu/test_trainer.sh"
step test_device_choice 5 5 bash "$HERE/tests/gpu/test_device_choice.sh"
step bench_experts 15 15 "$HERE/bin/gpu_tests" --bench-experts
# FP8 against bf16 in training: the small GPT-2 and LLaMA of tools/bench/fp8.sh on cuda, one seed
# (the loss curves; the speed is bench_tessera's fp8 rows).
step bench_fp8 20 20 env BACKEND=cuda PRECISIONS="bf16 fp8" SEEDS=29 DATA="$HERE/build/testdata" \
  OUT="$OUT/fp8" PYTHON="$PYTHON" TESSERA="$HERE/bin/tessera" bash "$HERE/tools/bench/fp8.sh"
# The sanitizers over the op tests, each boxed to a minute: what the emulator cannot see (races
# between blocks, uninitialised device reads, barrier misuse on the hardware). Before the benches,
# which take whatever is left.
sanitizer=$(command -v compute-sanitizer)
[ -n "$sanitizer" ] || [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" ] ||
  sanitizer=${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer
if [ -n "$sanitizer" ]; then
  for tool in racecheck synccheck memcheck initcheck; do
    step "sanitizer_$tool" 60 30 timeout -k 5 60 "$sanitizer" --tool "$tool" --error-exitcode 1 \
      "$HERE/bin/gpu_tests" --gtest_filter='CudaOp*:CudaFp8*:CudaBlock*'
  done
else
  note "SKIP sanitizers: compute-sanitizer is not on PATH or in CUDA_HOME/bin"
fi
# Then the benches: each stops starting rows when its share of what is left is spent (tessera's
# rows half of it, PyTorch's the rest; each keeps some 30 s for the row it is in).
share=$(( ($(left) - 30) / 2 )); share=$(( share > 20 ? share : 20 ))
step bench_tessera $(( share + 20 < 150 ? share + 20 : 150 )) 50 env OMP_NUM_THREADS="$(nproc)" \
  "$HERE/bin/gpu_tests" --bench --budget "$share"
peak=$(grep -o 'bf16 dense peak [0-9.]*' "$OUT/bench_tessera.log" 2>/dev/null | awk '{print $4}')
share=$(( $(left) - 40 )); share=$(( share > 20 ? share : 20 ))
step bench_torch $(( share + 30 < 180 ? share + 30 : 180 )) 60 "$PYTHON" \
  "$HERE/tools/bench/gpu_torch.py" --peak-tflops "${peak:-989}" --budget "$share"
# Where a GPU step goes (events on the stream) and what timing it costs (tools/bench/breakdown.sh):
# new, so last (the benches' rows were measured before); a second call runs it with --only.
step breakdown 30 30 env BACKEND=cuda DATA="$HERE/build/testdata" OUT="$OUT" PYTHON="$PYTHON" \
  TESSERA="$HERE/bin/tessera" bash "$HERE/tools/bench/breakdown.sh"
[ "$PLAN" = 1 ] && exit 0
{
  echo
  echo "## bench (tessera, then PyTorch, one GPU)"
  grep -h '^|' "$OUT/bench_tessera.log" 2>/dev/null
  grep -h '^| ' "$OUT/bench_torch.log" 2>/dev/null | grep -v '^| shape'
  grep -h '^fp8: \|budget\|set-up' "$OUT/bench_tessera.log" "$OUT/bench_torch.log" 2>/dev/null
  echo
  [ -f "$OUT/bench_experts.log" ] && grep -h '^|\|^experts' "$OUT/bench_experts.log"
  echo
  [ -f "$OUT/bench_fp8.log" ] && grep -v '^bench_fp8: ' "$OUT/bench_fp8.log"
  [ -f "$OUT/breakdown.log" ] && { echo; cat "$OUT/breakdown.log"; }
} >>"$SUMMARY"
note "gpu checks: $fails failed, $(( $(date +%s) - START )) s of a $BUDGET s budget; results in $OUT"
[ $fails -eq 0 ]
