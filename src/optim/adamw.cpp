#include "optim/adamw.hpp"

#include "backend/cpu/backend.hpp"
#ifdef TESSERA_CUDA
#include "backend/cuda/backend.hpp"
#endif

namespace tessera {

template <class Backend>
AdamWRule<Backend>::AdamWRule(const AdamWHyper& hyper, const RuleSetup<Backend>& setup)
    : hyper_(hyper), tile_(*setup.tile), pieces_(*setup.pieces) {}

template <class Backend>
void AdamWRule<Backend>::step(const StepView<Backend>& view, double lr, long t) {
  const std::vector<float*>& m = (*view.state)[0];
  const std::vector<float*>& v = (*view.state)[1];
  for (size_t p = 0; p < pieces_.size(); ++p) {
    const LocalTensor& tensor = tile_.tensors[size_t(pieces_[p].tensor)];
    Backend::adamw_update(view.master[p], view.copy[p], view.grads[p], m[p], v[p], pieces_[p].n,
                          tile_.canon(tensor).weight_decay, hyper_, lr, t);
  }
}

template class AdamWRule<CpuBackend>;
#ifdef TESSERA_CUDA
template class AdamWRule<CudaBackend<float>>;
template class AdamWRule<CudaBackend<cuda::bf16>>;
#endif

}  // namespace tessera
