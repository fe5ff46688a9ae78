#!/usr/bin/env bash
# `make gpu-bundle`: one tarball that runs tessera's GPU checks and GPU bench on a node that has
# none of the build's packages (no MPICH, HDF5, yaml-cpp, sentencepiece or OpenBLAS), only a CUDA
# driver, cuBLAS and NCCL of its own (a CUDA toolkit, modules, or a PyTorch install's nvidia
# wheels) and a Python with PyTorch for the comparison bench.
#
#   tools/gpu/bundle.sh OUT.tar.xz
#
# The tarball holds tessera-gpu/: bin/ (tessera, gpu_tests, MPICH's hydra mpiexec and its proxy),
# lib/ (every shared library the binaries need that is neither glibc nor CUDA's, debug info
# stripped; UCX's transport modules in lib/ucx), the GPU test scripts and the tools they call,
# the test decks' token data (build/testdata), tools/bench/gpu_torch.py, and run.sh
# (tools/gpu/bundle_run.sh), which finds the node's CUDA libraries and runs everything.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:?usage: tools/gpu/bundle.sh OUT.tar.xz}
case $OUT in /*) ;; *) OUT=$PWD/$OUT ;; esac
STAGE=$(mktemp -d "${TMPDIR:-/tmp}/tessera_bundle.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
B=$STAGE/tessera-gpu
mkdir -p "$B/bin" "$B/lib/ucx" "$B/lib/cxx" "$B/tests/gpu" "$B/tests/integration" "$B/tools/bench" "$B/build/testdata"

for exe in tessera gpu_tests; do
  [ -x "$ROOT/bin/$exe" ] || { echo "gpu_bundle: bin/$exe missing: build with CUDA first" >&2; exit 1; }
  strip --strip-debug -o "$B/bin/$exe" "$ROOT/bin/$exe"
done
# MPICH's launcher: hydra finds its proxy next to itself or on PATH (run.sh puts bin/ first).
cp "$(readlink -f "$(command -v mpiexec.hydra)")" "$B/bin/mpiexec"
cp "$(readlink -f "$(command -v hydra_pmi_proxy)")" "$B/bin/hydra_pmi_proxy"

# Libraries: everything ldd resolves for the binaries, but glibc (the node's own, at least the
# version printed below) and CUDA's runtime, cuBLAS and NCCL (the node's own, matching its driver).
is_system() {
  case $(basename "$1") in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|ld-linux*|\
    libcudart.so.*|libcublas.so.*|libcublasLt.so.*|libnccl.so.*|libcuda.so.*) return 0 ;;
  esac
  return 1
}
ucx=$(dirname "$(readlink -f "$(ldconfig -p | awk '/libucs.so.0 /{print $NF; exit}')")")/ucx
libs=$( { ldd "$ROOT/bin/tessera" "$ROOT/bin/gpu_tests" "$B/bin/mpiexec" "$B/bin/hydra_pmi_proxy"
          find "$ucx" -name '*.so.?' -exec ldd {} + 2>/dev/null; } | awk '$3 ~ /^\// {print $1 " " $3}' | sort -u)
# The C++ runtime goes to lib/cxx: run.sh takes the node's own when it is new enough (this one
# needs the build machine's glibc).
while read -r soname path; do
  is_system "$soname" && continue
  case $soname in libstdc++.so.*|libgcc_s.so.*) dir=$B/lib/cxx ;; *) dir=$B/lib ;; esac
  strip --strip-debug -o "$dir/$soname" "$(readlink -f "$path")"
done <<<"$libs"
for m in "$ucx"/*.so.?; do
  [ -e "$m" ] && strip --strip-debug -o "$B/lib/ucx/$(basename "$m")" "$(readlink -f "$m")"
done

cp "$ROOT/tools/gpu/bundle_run.sh" "$B/run.sh"
cp "$ROOT/tools/bench/gpu_torch.py" "$ROOT/tools/bench/fp8.sh" "$ROOT/tools/bench/breakdown.sh" \
  "$B/tools/bench/"
cp "$ROOT/tests/gpu/test_trainer.sh" "$ROOT/tests/gpu/test_device_choice.sh" \
  "$ROOT/tests/gpu/floor_refs.sh" "$ROOT/tests/gpu/fp32_floor.py" "$ROOT/tests/gpu/compare_amax.py" \
  "$B/tests/gpu/"
cp "$ROOT/tests/integration/lib.sh" "$ROOT/tests/integration/compare_runs.py" "$B/tests/integration/"
# The token files the test decks read (lib.sh makes them with h5py, which the node may lack).
PYTHON=${PYTHON:-/usr/bin/python3}
[ -f "$ROOT/build/testdata/train.h5" ] ||
  "$PYTHON" "$ROOT/tools/data/prepare_data.py" --stdlib --out-dir "$ROOT/build/testdata" >/dev/null
cp "$ROOT/build/testdata/train.h5" "$ROOT/build/testdata/val.h5" "$B/build/testdata/"
# The float64 references of test_trainer.sh's derived fp32 bound, made here (torch and h5py)
# with this build's tessera on the CPU: the node's Python may have neither.
TESSERA="$ROOT/bin/tessera" PYTHON="$PYTHON" bash "$ROOT/tests/gpu/floor_refs.sh" "$B/build/floor" >&2
# What the binaries were built with: the CUDA runtime's version of the headers (run.sh looks for
# its major version's libraries), cuBLAS's, NCCL's and the architectures of the CUDA objects.
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
define() { sed -n "s/^#define $2 *\([0-9]*\).*/\1/p" "$CUDA_HOME/include/$1" | head -1; }
cudart=$(define cuda_runtime_api.h CUDART_VERSION)
arch=$(sed -n 's/.* arch=//p' "$ROOT/bin/.build" 2>/dev/null)
{
  echo "cuda=$((cudart / 1000)).$((cudart % 1000 / 10))"
  echo "cuda_major=$((cudart / 1000))"
  echo "cublas=$(define cublas_api.h CUBLAS_VER_MAJOR).$(define cublas_api.h CUBLAS_VER_MINOR)"
  nccl_h=$CUDA_HOME/include/nccl.h
  [ -n "${NCCL_HOME:-}" ] && nccl_h=$NCCL_HOME/include/nccl.h
  echo "nccl=$(sed -n 's/^#define NCCL_MAJOR \([0-9]*\)/\1/p' "$nccl_h").$(sed -n 's/^#define NCCL_MINOR \([0-9]*\)/\1/p' "$nccl_h").$(sed -n 's/^#define NCCL_PATCH \([0-9]*\)/\1/p' "$nccl_h")"
  echo "arch=${arch:-unknown}"
  echo "nvcc=$("$CUDA_HOME/bin/nvcc" --version 2>/dev/null | grep -o 'V[0-9][0-9.]*' | tr -d V)"
} >"$B/BUILD_INFO"
# What the node must have: glibc for everything but lib/cxx (GLIBC_MIN), the C++ runtime's
# version for the node's own libstdc++ (GLIBCXX_MIN), and glibc for lib/cxx (GLIBC_MIN_CXX).
newest() { objdump -T "$@" 2>/dev/null | grep -o "$PATTERN" | sort -V -u | tail -1; }
glibc=$(PATTERN='GLIBC_[0-9.]*' newest "$B/bin/"* "$B/lib/"*.so* "$B/lib/ucx/"*)
echo "${glibc#GLIBC_}" >"$B/GLIBC_MIN"
PATTERN='GLIBCXX_[0-9.]*' newest "$B/bin/"* "$B/lib/"*.so* >"$B/GLIBCXX_MIN"
glibc_cxx=$(PATTERN='GLIBC_[0-9.]*' newest "$B/lib/cxx/"*)
echo "${glibc_cxx#GLIBC_}" >"$B/GLIBC_MIN_CXX"
git -C "$ROOT" describe --always --dirty >"$B/VERSION" 2>/dev/null || echo unknown >"$B/VERSION"

tar -C "$STAGE" -cf - tessera-gpu | xz -6 -T2 >"$OUT"
echo "gpu_bundle: wrote $OUT ($(du -h "$OUT" | cut -f1), $(find "$B/lib" -name '*.so*' | wc -l) libraries;" \
  "the node needs glibc >= ${glibc#GLIBC_} and $(cat "$B/GLIBCXX_MIN"), or glibc >= ${glibc_cxx#GLIBC_})"
