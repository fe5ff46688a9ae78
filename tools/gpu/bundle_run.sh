#!/usr/bin/env bash
# run.sh of the GPU bundle (tools/gpu/bundle.sh makes it): unpack anywhere, then
#
#   tessera-gpu/run.sh [--out DIR]          the GPU checks and the GPU bench (results in DIR,
#                                            default ./tessera-gpu-results)
#   tessera-gpu/run.sh --cpu-smoke [--out DIR]   no GPU needed: every library resolves from the
#                                            bundle, glibc or the node's CUDA, and tessera trains
#                                            on 1 and 2 ranks of the CPU with the same losses
#
# The node's CUDA runtime, cuBLAS and NCCL are found in $CUDA_HOME/lib64, /usr/local/cuda/lib64,
# $LD_LIBRARY_PATH, or the nvidia/*/lib folders of the python3 on PATH (PyTorch's wheels), in
# that order. The GPU run: nvidia-smi, compute-sanitizer's four tools over the op tests,
# bin/gpu_tests (every CUDA op against the CPU, the two backends training side by side; on 2 GPUs
# over NCCL), tests/gpu/test_trainer.sh and
# test_device_choice.sh (tessera train on cuda against the CPU), bin/gpu_tests --bench,
# tools/bench/gpu_torch.py (PyTorch on the same shapes) and tools/bench/fp8.sh on cuda (bf16
# against fp8 in training). DIR/summary.md lists each step's result
# and the bench tables; each step's output is DIR/<step>.log. Exit 0 when every check passed.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
mode=gpu
OUT=$PWD/tessera-gpu-results
while [ $# -gt 0 ]; do
  case $1 in
    --cpu-smoke) mode=cpu ;;
    --out) OUT=$2; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
SUMMARY=$OUT/summary.md
: >"$SUMMARY"
fails=0
note() { echo "$*"; echo "$*" >>"$SUMMARY"; }

export PATH=$HERE/bin:$PATH
export UCX_MODULE_DIR=$HERE/lib/ucx
export PYTHON=${PYTHON:-$(command -v python3 || echo python3)}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}

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
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  found=""
  for d in "${candidates[@]}"; do
    if [ -n "$d" ] && [ -e "$d/$lib" ]; then found=$d; break; fi
  done
  if [ -z "$found" ]; then
    note "FAIL $lib not found (searched: ${candidates[*]}): load the site's CUDA 13 and NCCL modules or set CUDA_HOME"
    exit 1
  fi
  case ":$cuda_dirs:" in *":$found:"*) ;; *) cuda_dirs=${cuda_dirs:+$cuda_dirs:}$found ;; esac
done
export LD_LIBRARY_PATH=$HERE/lib:$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

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
note "bundle $(cat "$HERE/VERSION") on $(hostname): glibc $glibc_node (needs >= $glibc_min), C++ runtime $cxx, CUDA libraries from $cuda_dirs"
if ! at_least "$glibc_min" "$glibc_node"; then
  note "FAIL glibc $glibc_node is older than the $glibc_min the bundle needs"
  exit 1
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

step() {  # NAME COMMAND...: runs it in $OUT, output in $OUT/NAME.log
  local name=$1 start rc
  shift
  start=$(date +%s)
  (cd "$OUT" && "$@") >"$OUT/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    note "PASS $name ($(( $(date +%s) - start )) s)"
  else
    note "FAIL $name (exit $rc, $(( $(date +%s) - start )) s): see $name.log"
    tail -15 "$OUT/$name.log" | sed 's/^/    /'
    fails=$((fails + 1))
  fi
  return $rc
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
  step version "$HERE/bin/tessera" --version
  step cpu_1rank "$HERE/bin/tessera" train smoke.yaml run.dir=one
  step cpu_2ranks mpiexec -n 2 "$HERE/bin/tessera" train smoke.yaml run.dir=two parallel.dp=2
  step cpu_same_losses env TESSERA="$HERE/bin/tessera" "$PYTHON" \
    "$HERE/tests/integration/compare_runs.py" one/metrics.jsonl one/checkpoints/step_00000004.h5 \
    two/metrics.jsonl two/checkpoints/step_00000004.h5
  note "cpu smoke: $fails failed"
  [ $fails -eq 0 ]
  exit $?
fi

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
note "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1) x $gpus"
export TESSERA=$HERE/bin/tessera TESSERA_GPUS=$gpus MPIEXEC=mpiexec
# compute-sanitizer over the CUDA op tests first (what the emulator cannot see: races between
# blocks, uninitialised device reads, barrier misuse on the real hardware), where the node's CUDA
# has it; each tool a step of its own, failing on any error it reports.
sanitizer=$(command -v compute-sanitizer)
[ -n "$sanitizer" ] || [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" ] ||
  sanitizer=${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer
if [ -n "$sanitizer" ]; then
  for tool in memcheck racecheck synccheck initcheck; do
    step "sanitizer_$tool" timeout 600 "$sanitizer" --tool "$tool" --error-exitcode 1 \
      "$HERE/bin/gpu_tests" --gtest_filter='CudaOp*'
  done
else
  note "compute-sanitizer: not on PATH or in CUDA_HOME/bin: the sanitizer steps are skipped"
fi
step gpu_tests "$HERE/bin/gpu_tests"
if [ "$gpus" -ge 2 ]; then
  step gpu_tests_2ranks mpiexec -n 2 "$HERE/bin/gpu_tests" --gtest_filter='CudaModelTp.*:CudaModelDp.*'
fi
step test_trainer bash "$HERE/tests/gpu/test_trainer.sh"
step test_device_choice bash "$HERE/tests/gpu/test_device_choice.sh"
step bench_tessera "$HERE/bin/gpu_tests" --bench
# PyTorch's rows against the same bf16 peak as tessera's.
peak=$(grep -o 'bf16 dense peak [0-9.]*' "$OUT/bench_tessera.log" | awk '{print $4}')
step bench_torch "$PYTHON" "$HERE/tools/bench/gpu_torch.py" --peak-tflops "${peak:-989}"
# FP8 against bf16 in training: the small GPT-2 and LLaMA of tools/bench/fp8.sh on cuda, one seed
# (the loss curves; the speed is bench_tessera's fp8 rows).
step bench_fp8 env BACKEND=cuda PRECISIONS="bf16 fp8" SEEDS=29 DATA="$HERE/build/testdata" \
  OUT="$OUT/fp8" PYTHON="$PYTHON" bash "$HERE/tools/bench/fp8.sh"
{
  echo
  echo "## bench (tessera, then PyTorch, one GPU)"
  grep '^|' "$OUT/bench_tessera.log"
  grep '^| ' "$OUT/bench_torch.log" | grep -v '^| shape'
  grep '^fp8: ' "$OUT/bench_tessera.log"
  echo
  grep -v '^bench_fp8: ' "$OUT/bench_fp8.log"
} >>"$SUMMARY"
note "gpu checks: $fails failed; results in $OUT"
[ $fails -eq 0 ]
