// The checkpoint format both directions share: the order-free checksums of tensors and of the
// restart state, the value check that keeps non-finite state out of a checkpoint, the name
// MPI-IO is given for a path, and the tile selections and transfer modes that writes and reads
// use alike (io/checkpoint_format.hpp).
#include "io/checkpoint_format.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/rng.hpp"

namespace tessera {

uint64_t element_hash(uint64_t canonical_index, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return mix64((canonical_index << 32) ^ bits ^ 0x5DEECE66DULL);
}

uint64_t tile_checksum(const LocalLayout& layout, const LocalTensor& t, const float* values) {
  // A sum of per-element hashes is independent of how the tensor is split between ranks and of
  // the order in which the parts are added.
  uint64_t sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
  for (size_t i = 0; i < t.numel; ++i)
    sum += element_hash(layout.canonical_index(t, i), values[i]);
  return sum;
}

std::string state_text(const TrainState& st, const ModelShape& s) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "step=%lld tokens_seen=%lld next_sample=%lld seed=%llu lr=%.17g n_layer=%d "
                "n_head=%d n_embd=%d block_size=%d vocab_size=%d padded_vocab=%d arch=%s "
                "n_kv_head=%d ffn_hidden=%d tied=%d norm_eps=%.17g rope_theta=%.17g",
                (long long)st.step, (long long)st.tokens_seen, (long long)st.next_sample,
                (unsigned long long)st.seed, st.lr, s.n_layer, s.n_head, s.n_embd, s.block_size,
                s.vocab_size, s.padded_vocab, arch_name(s.arch), s.n_kv_head, s.ffn_hidden,
                s.tied ? 1 : 0, s.norm_eps, s.rope_theta);
  // The optimizer's own step count only where it differs (a reset state): the text, and so the
  // checksum, of every checkpoint before it stays what it was.
  const std::string optim =
      st.optim_step >= 0 && st.optim_step != st.step
          ? " optim_step=" + std::to_string(st.optim_step)
          : "";
  // The MoE shape only for an MoE model: a dense checkpoint's text and checksum are unchanged.
  const MoeShape& m = s.moe;
  const std::string moe = m.experts > 0 ? " moe=" + std::to_string(m.experts) + "," +
                                              std::to_string(m.top_k) + "," + std::to_string(m.ffn) +
                                              "," + std::to_string(m.every) + "," +
                                              std::to_string(m.first_dense)
                                        : "";
  // q/k norms only where the model has them, likewise.
  const std::string qk = s.qk_norm ? " qk_norm=1" : "";
  return std::string(buf) + optim + moe + qk + " data_sources=" + st.data_sources +
         " data_position=" + st.data_position;
}

uint64_t state_checksum(const TrainState& state, const ModelShape& shape) {
  return mix64(fnv1a64(state_text(state, shape)));
}

std::string first_bad_value(const std::string& name, const float* values, size_t n,
                            bool non_negative) {
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(values[i]) || (non_negative && values[i] < 0)) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%g", double(values[i]));
      return name + " holds " + buf + " at element " + std::to_string(i) + " of this rank's tile";
    }
  return "";
}

ModelBuffers::ModelBuffers(float* params, float* exp_avg, float* exp_avg_sq) : params(params) {
  if (!exp_avg && !exp_avg_sq) return;
  rule = "adamw";
  const std::vector<StateSpec> specs = rule_state_names(rule);
  state = {{specs[0], exp_avg}, {specs[1], exp_avg_sq}};
}

ModelBuffers::ModelBuffers(float* params, std::string rule, std::vector<StateBuffer> state)
    : params(params), rule(std::move(rule)), state(std::move(state)) {}

std::string mpiio_name(const std::string& path) {
  return path.find(':') == std::string::npos ? path : "ufs:" + path;
}

namespace ckpt {

H5Handle transfer(H5FD_mpio_xfer_t mode) {
  H5Handle dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  H5Pset_dxpl_mpio(dxpl.get(), mode);
  return dxpl;
}

void select_tile(hid_t space, const LocalTensor* t) {
  if (t == nullptr) {
    H5Sselect_none(space);
    return;
  }
  bool first = true;
  for (const Block& b : t->blocks) {
    const hsize_t start[2] = {b.row0, b.col0}, count[2] = {b.rows, b.cols};
    H5Sselect_hyperslab(space, first ? H5S_SELECT_SET : H5S_SELECT_OR, start, nullptr, count,
                        nullptr);
    first = false;
  }
}

H5Handle memory_space(const LocalTensor* t) {
  const hsize_t n = t ? t->numel : 1;
  H5Handle mem(H5Screate_simple(1, &n, nullptr), H5Sclose);
  if (!t) H5Sselect_none(mem.get());
  return mem;
}

H5FD_mpio_xfer_t transfer_mode(const ParamTensor& c, long collective_bytes) {
  return double(c.numel) * sizeof(float) >= double(collective_bytes) ? H5FD_MPIO_COLLECTIVE
                                                                     : H5FD_MPIO_INDEPENDENT;
}

std::vector<TensorDataset> tensor_datasets(const ParamTensor& c,
                                           const std::vector<StateSpec>& state) {
  std::vector<TensorDataset> out = {{"model/" + c.name, -1, c.shape}};
  for (size_t k = 0; k < state.size(); ++k)
    if (state[k].holds(c))
      out.push_back({"optim/" + state[k].name + "/" + c.name, int(k), state[k].shape_of(c)});
  return out;
}

bool holds_first_element(const LocalTensor* t) {
  return t && t->owner && !t->blocks.empty() && t->blocks[0].row0 == 0 && t->blocks[0].col0 == 0;
}

std::vector<const LocalTensor*> tiles_by_canonical(const LocalLayout& layout) {
  std::vector<const LocalTensor*> tiles(layout.canonical.tensors.size(), nullptr);
  for (const LocalTensor& t : layout.tensors) tiles[t.canonical] = &t;
  return tiles;
}

}  // namespace ckpt

}  // namespace tessera
