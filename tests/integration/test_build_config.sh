#!/usr/bin/env bash
# What the Makefile builds for, by `make -n` (nothing is compiled): with nvcc but no GPU `make`
# builds without the CUDA backend, in build-cpu/, and says so; a CUDA_ARCH named, or the GPUs a
# (fake) nvidia-smi lists, give a CUDA build in build/ for exactly those architectures; `make test`
# compiles the CUDA sources for one architecture (TEST_CUDA_ARCH) where there is no GPU; `make
# cuda-report` for every architecture of CUDA_ARCH_ALL, in build-report/. nvcc is stood in for by
# /bin/true (never run: -n), so this runs on any machine.
source "$(dirname "$0")/lib.sh"
cd "$ROOT" || exit 1
mkdir -p "$WORK/nogpu" "$WORK/gpus"
# nvidia-smi that lists no GPU, and one that lists an A100 and an H100.
printf '#!/bin/sh\nexit 9\n' >"$WORK/nogpu/nvidia-smi"
cat >"$WORK/gpus/nvidia-smi" <<'EOF'
#!/bin/sh
case "$*" in
  *compute_cap*) printf '8.0\n9.0\n9.0\n' ;;
  -L) printf 'GPU 0: A100\nGPU 1: H100\nGPU 2: H100\n' ;;
esac
EOF
chmod +x "$WORK/nogpu/nvidia-smi" "$WORK/gpus/nvidia-smi"
dry() {  # dry SMI_DIR MAKE_ARGS...: `make -n` with that nvidia-smi and a stand-in nvcc
  local dir=$1
  shift
  PATH="$WORK/$dir:$PATH" make -n --no-print-directory NVCC=/bin/true "$@" 2>&1
}
check() {  # check NAME OUTPUT PATTERN [ABSENT_PATTERN]
  if grep -Eq -- "$3" <<<"$2" && { [ -z "${4:-}" ] || ! grep -Eq -- "$4" <<<"$2"; }; then
    pass "$1"
  else
    fail "$1: wanted /$3/${4:+, not /$4/}:"; head -5 <<<"$2" | cut -c1-200 | sed 's/^/    /'
  fi
}

out=$(dry nogpu bin/tessera)
check "no GPU, no CUDA_ARCH: a CPU build in build-cpu/, said in one line" "$out" \
  '^make: nvcc found, but no GPU here and no CUDA_ARCH named: building without the CUDA backend' \
  'build/src/|-DTESSERA_CUDA'
check "no GPU: the CPU build's objects" "$out" '-c src/main.cpp -o build-cpu/src/main.o'
out=$(dry nogpu CUDA_ARCH=90 bin/tessera)
check "CUDA_ARCH=90: sm_90 and its PTX only, in build/" "$out" \
  '-gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 .* -o build/src/backend/cuda/' \
  'compute_80|nvcc found, but'
out=$(dry gpus bin/tessera)
check "GPUs of 8.0 and 9.0 here: sm_80 and sm_90" "$out" \
  '-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90'
out=$(dry nogpu CUDA=1 bin/tessera)
check "CUDA=1 without a GPU: CUDA_ARCH_ALL" "$out" \
  '-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90'
# make test's and make cuda-report's architectures (the variables their recipes pass down; a
# `make -n test` would walk every recursive make).
show() {  # show SMI_DIR VARIABLE MAKE_ARGS...: the variable's value
  local dir=$1 var=$2
  shift 2
  PATH="$WORK/$dir:$PATH" make -s --no-print-directory NVCC=/bin/true "$@" \
    --eval "show-it: ; @echo \"[\$($var)]\"" show-it 2>&1 | tail -1
}
check "make test without a GPU: the CUDA sources for one architecture" "$(show nogpu TEST_ARCH)" '^\[90\]$'
check "make test with CUDA=0: no CUDA build" "$(show nogpu TEST_ARCH CUDA=0)" '^\[\]$'
check "make test on the GPUs here: theirs" "$(show gpus TEST_ARCH)" '^\[80;90\]$'
check "make cuda-report: every architecture" "$(show nogpu REPORT_ARCH)" '^\[80;90\]$'
grep -q 'CUDA_ARCH="$(TEST_ARCH)" bin/tessera bin/unit_tests' Makefile &&
  grep -q 'CUDA=1 CUDA_ARCH="$(REPORT_ARCH)" BUILD=build-report cuda-objects' Makefile &&
  pass "make test and make cuda-report pass them down" || fail "make test and make cuda-report pass them down"
finish
