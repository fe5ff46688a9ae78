// Column sums over many rows in two passes (common.cuh says why): the split of the rows into
// chunks, which depends on the shape alone, and pass 2, which adds each column's chunk partials
// in order onto the output.
#include <algorithm>

#include "backend/cuda/common.cuh"

namespace tessera::cuda {

namespace {

// Pass 1's grid aims at this many blocks: about two per SM of the largest GPUs, whatever GPU runs,
// so the order of the additions (and the bits) does not depend on the device.
constexpr int kColumnBlocks = 256;

__global__ void add_column_partials_kernel(float* out, const float* partial, int chunks,
                                           int cols) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float total = 0.0f;
  for (int c = 0; c < chunks; c++) total += partial[size_t(c) * cols + col];
  out[col] += total;
}

}  // namespace

ColumnSplit column_split(int rows, int cols, int outputs) {
  const int tiles = (cols + kWarp - 1) / kWarp;
  const int most = std::max(1, (rows + kWarp - 1) / kWarp);  // a chunk has a row per thread row
  int chunks = std::clamp((kColumnBlocks + tiles - 1) / tiles, 1, most);
  const size_t room = device::kColumnScratchFloats / (size_t(outputs) * cols);
  chunks = std::max(1, std::min(chunks, int(room)));
  const int per = (rows + chunks - 1) / chunks;
  return {std::max(1, (rows + per - 1) / std::max(per, 1)), std::max(per, 1)};
}

void add_column_partials(float* out, const float* partial, int chunks, int cols) {
  constexpr int kThreads = 256;
  launch<add_column_partials_kernel>(blocks_for(size_t(cols), kThreads), kThreads, 0,
                                     stream(), out, partial, chunks, cols);
  CUDA_CHECK_LAUNCH();
}

}  // namespace tessera::cuda
