#include "model/options.hpp"

namespace tessera {

ModelOptions model_options(const Config& c) {
  ModelOptions o;
  o.fused_attention = c.model.attention == Attention::Fused;
  o.sequence_parallel = c.parallel.sequence_parallel;
  o.cp_allgather = c.parallel.cp_comm == CpComm::AllGather;
  o.recompute = c.train.recompute;
  const DeviceConfig& d = c.device;
  o.fp8.on = d.precision == Precision::Fp8;
  o.fp8.grad = d.fp8_format == Fp8Recipe::E4M3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
  o.fp8.history = d.fp8_amax_history;
  o.fp8.most_recent = d.fp8_amax_algo == AmaxAlgo::MostRecent;
  o.fp8.margin = d.fp8_margin;
  o.fp8.head = d.fp8_head;
  o.fp8.layer_codes = c.parallel.zero == 3;
  const MoeConfig& m = c.model.moe;
  o.moe.routing.experts = m.experts;
  o.moe.routing.top_k = m.top_k;
  o.moe.routing.sigmoid = m.score == MoeScore::Sigmoid;
  o.moe.routing.renormalize = m.renormalize;
  o.moe.aux_loss = m.aux_loss;
  o.moe.z_loss = m.z_loss;
  o.moe.capacity_factor = m.capacity_factor;
  o.moe.bias_rate = m.bias_rate;
  o.document_mask = c.data.document_mask;
  return o;
}

}  // namespace tessera
