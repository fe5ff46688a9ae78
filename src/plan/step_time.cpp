#include "plan/step_time.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "backend/peak.hpp"
#include "model/cost.hpp"
#include "model/options.hpp"
#include "plan/compute.hpp"

namespace tessera {

namespace {

struct Costs {
  const Machine& m;
  double peak;
  ComputeModel model;  // plan/compute.hpp
  // One product C(M,N) = op(A)(M,K) op(B)(K,N) on the device: on `cpu` timed at its shape (with
  // the transposes backend/cpu/matmul.cpp uses), elsewhere the shape-aware model.
  double gemm(double M, double N, double K, bool ta = false, bool tb = true) const {
    if (m.measured) return measure_sgemm_seconds(ta, tb, int(M), int(N), int(K), false);
    return gemm_seconds(model, M, N, K);
  }
  // A linear layer's forward, its input gradient and its weight gradient.
  double gemm_fwd_bwd(double M, double N, double K) const {
    return gemm(M, N, K, false, true) + gemm(M, K, N, false, false) + gemm(N, K, M, true, false);
  }
  double bytes(double b) const { return stream_seconds(model, b); }
  // A streaming op: its bytes at the memory bandwidth, or its exps at the exp rate if slower.
  double stream(double b, double exps) const {
    return std::max(bytes(b), m.exp_rate > 0 ? exps / m.exp_rate : 0.0);
  }
};

// Causal attention's products for b sequences of nh query heads (nkv kv heads) of size hs,
// forward and backward. On `cpu` as backend/cpu/attention.cpp runs them: one single-threaded
// product per (sequence, head) and thread, query rows in blocks of 64 that skip the masked keys;
// elsewhere the T x T products at the device's efficiency for their shape: whole for the GEMM
// attention (its scores are a full product, masked after), the causal half of the tiles for the
// fused one (backend/cuda/attention_fused.cu never loads a tile above the diagonal, nor do
// FlashAttention and cuDNN).
struct AttentionCost {
  double fwd = 0, bwd = 0;
};
AttentionCost attention_gemms(const Costs& c, double b, double T, double nh, double nkv, double hs,
                              bool fused) {
  AttentionCost a;
  if (!c.m.measured) {
    const double tile = c.m.gemm_tile > 0 ? c.m.gemm_tile : 1;
    const double share = fused ? std::min(1.0, 0.5 * (1 + tile / T)) : 1.0;
    a.fwd = share * b * nh * (c.gemm(T, T, hs) + c.gemm(T, hs, T));
    a.bwd = 2 * a.fwd;
    return a;
  }
  const double threads = omp_get_max_threads();
  auto one = [](bool ta, bool tb, int M, int N, int K) {
    return measure_sgemm_seconds(ta, tb, M, N, K, true);
  };
  constexpr int kRowBlock = 64;
  const int t = int(T), h = int(hs);
  double fwd = 0, dq = 0, dkv = 0;
  for (int i0 = 0; i0 < t; i0 += kRowBlock) {
    const int i1 = std::min(t, i0 + kRowBlock);
    fwd += one(false, true, i1 - i0, i1, h) + one(false, false, i1 - i0, h, i1);
    dq += one(false, true, i1 - i0, i1, h) + one(false, false, i1 - i0, h, i1);
    dkv += 2 * one(true, false, i1 - i0, h, t - i0);
  }
  // (sequence, query head) tasks for the forward and dq; (sequence, kv head) tasks of nh/nkv
  // heads each for dk and dv; static schedule, so the busiest thread takes the ceiling.
  a.fwd = std::ceil(b * nh / threads) * fwd;
  a.bwd = std::ceil(b * nh / threads) * dq + std::ceil(b * nkv / threads) * (nh / nkv) * dkv;
  return a;
}

// A layer's linear layers (model/cost.hpp) for n rows: their forwards, and their forwards and
// backwards, in all and each (each timed once: on `cpu` a time is a measurement).
struct LinearTimes {
  double fwd = 0, fwd_bwd = 0;
  std::vector<double> each_fwd, each_fwd_bwd;
};
LinearTimes linear_times(const Costs& c, double n, const std::vector<LinearGemm>& gemms) {
  LinearTimes t;
  for (const LinearGemm& g : gemms) {
    t.each_fwd.push_back(c.gemm(n, g.out, g.in));
    t.each_fwd_bwd.push_back(c.gemm_fwd_bwd(n, g.out, g.in));
    t.fwd += t.each_fwd.back();
    t.fwd_bwd += t.each_fwd_bwd.back();
  }
  return t;
}

// One layer, one micro-batch, forward and backward: the seconds, and the same by the kind of op
// the trainer's breakdown times (what has no slot, the kernel launches, in `other`).
struct LayerTime {
  double total = 0, other = 0;
  op_clock::Seconds ops{};
};

// FP8's casts to one-byte codes in one layer and micro-batch (model/fp8.hpp), streaming: each
// GEMM's input (n rows) in the forward and again transposed in the backward, its output gradient
// into both layouts; the weights (codes and transposes) `weight_bytes` per weight element a
// micro-batch (step_time says how many). a: bytes of an activation.
double fp8_cast_seconds(const Costs& c, double n, const std::vector<LinearGemm>& gemms, double a,
                        double weight_bytes) {
  double in = 0, out = 0, weight = 0;  // columns, and weight elements, of the layer's GEMMs
  for (const LinearGemm& g : gemms) {
    in += g.in;
    out += g.out;
    weight += double(g.out) * g.in;
  }
  const double inputs = 2 * n * in * (a + 1);
  const double grads = n * out * (a + 2);
  const double weights = weight * weight_bytes;
  return c.stream(inputs + grads + weights, 0);
}

// The bytes a GEMM weight element's codes move a micro-batch. A cast reads the value and writes
// both layouts (a + 2): once per step, shared by the micro-batches, or where the codes take turns
// (model_options' rule, Fp8Linear's places) at each forward and backward; then, gathered as codes
// (ZeRO-3 with resharding), each rank casts its 1 / n part (a + 1) and the GEMMs place the
// gathered codes (read 1, write 2).
double fp8_weight_bytes(const Config& cfg, const RunLayout& run, double a) {
  if (!model_options(cfg).fp8.layer_codes) return (a + 2) / std::max(run.n_micro, 1);
  if (cfg.parallel.zero == 3 && cfg.parallel.reshard_after_forward)
    return 2 * (3 + (a + 1) / run.layout.shard_size());
  return 2 * (a + 2);
}

// The step's parts after the pipeline's (dp, the tied embedding's sum, the optimizer), its
// total, model FLOPs, tokens/s and MFU into *out, whose compute is set.
void finish_step(const Config& cfg, const ModelShape& shape, const RunLayout& run,
                 const Machine& machine, bool bf16, uint64_t param_buffer, const Costs& lin,
                 double slowest_bwd, const CommBytes& slowest_comm, StepTime* out_ptr) {
  StepTime& out = *out_ptr;
  const ParallelLayout& l = run.layout;
  const Costs c{machine, machine.peak(bf16), machine.compute(bf16)};
  const Network net = machine.network();
  const double C = shape.n_embd, T = cfg.data.seq_len;
  // dp: without ZeRO each layer's sum starts once the step's last backward has it; a GPU's
  // collectives run on their own stream meanwhile, MPI's progress only inside MPI calls, so on
  // the CPU nothing overlaps. ZeRO-1's reduce-scatter and all-gather follow the backward (with
  // ep its sums are ZeRO-0's, its gather by unit follows the update). ZeRO-2's
  // reduce-scatters and ZeRO-3's gathers run beside every micro-batch's compute on a GPU (the
  // next unit's gather while this one computes); ZeRO-2's gather after the update does not.
  const int zero = cfg.parallel.zero;
  // The shard group's reduce-scatters and all-gathers (n ranks, tp apart), the all-reduce over
  // dp x cp (no sharding) or across replicas (dp x cp / n ranks, n tp apart): the gradients'
  // group is dp x cp, cp ranks nearest.
  const int n_shard = zero >= 1 ? l.shard_size() : 1;
  // (ZeRO-1 with ep all-reduces over dp x cp as ZeRO-0 does, and gathers over the shard group.)
  const bool zero1_ep = zero == 1 && l.ep > 1;
  const int n_reduce = n_shard > 1 && !zero1_ep ? l.dpcp() / n_shard : l.dpcp();
  // Expert parallelism: the experts' gradients over the edp ranks holding the same experts
  // (ep groups of consecutive dp x cp ranks: edp members tp ep apart).
  const bool any = l.dpcp() > 1;
  const double sharded_time =
      any ? ring_half(net, place(net, n_shard, l.tp), slowest_comm.dp_sharded) : 0;
  const double dense_time =
      any ? all_reduce(net, place(net, n_reduce, l.tp * (zero1_ep ? 1 : n_shard)),
                       slowest_comm.dp_all_reduce).seconds
          : 0;
  const double experts_time =
      any ? all_reduce(net,
                       l.experts_whole ? place(net, l.tp * l.dpcp() / l.ep, l.ep)
                                       : place(net, l.dpcp() / l.ep, l.tp * l.ep),
                       slowest_comm.dp_experts)
                .seconds
          : 0;
  const double dp_time = sharded_time + dense_time + experts_time;
  const double reduce_time = dense_time + experts_time;
  if (!machine.gpu || (zero == 1 && !zero1_ep))
    out.dp = dp_time;
  else if (zero == 0)
    out.dp = std::max(0.0, dp_time - slowest_bwd);
  else if (zero1_ep)  // the sums under the backward as ZeRO-0's, the gather after the update
    out.dp = std::max(0.0, reduce_time - slowest_bwd) + sharded_time;
  else
    out.dp = std::max(0.0, dp_time - out.compute);
  // The tied embedding's sum between the first and the last stage.
  out.embed = all_reduce(net, place(net, 2, l.tp * l.cp * l.dp * (l.pp - 1)), slowest_comm.payload[Traffic::embed]).seconds;
  // AdamW: parameter, gradient, two moments read, three written (fp32), over this rank's shard;
  // zeroing the gradients and the norm's read over the whole buffer.
  // On `cpu` each pass at its measured rate: dp rank 0 sums the norm over the shard, clipping
  // scales it (charged always: early in training the norm is above the clip), AdamW updates it,
  // and the whole gradient buffer is zeroed at the step's start.
  const double shard = zero >= 1 ? double(param_buffer) / l.shard_size() : double(param_buffer);
  const OptimizerRates& o = machine.optimizer;
  out.optimizer = machine.measured
                      ? shard * (o.adamw + o.norm + o.scale) + double(param_buffer) * o.zero
                      : c.bytes(28 * shard + (bf16 ? 2 * shard : 0) + 8.0 * double(param_buffer));
  out.total = out.compute + out.tp + out.pp + out.cp + out.ep + out.bubble + out.dp + out.embed +
              out.optimizer;
  // Model FLOPs: FORMULAS.md's 6 N_matmul + 12 L C T per token (attention not halved for causal),
  // N_matmul the active parameters' (an MoE layer's router and top_k of its experts).
  const double n_matmul = active_matmul_params(shape) + double(shape.padded_vocab) * C;
  const double tokens = double(cfg.train.batch_size) * T;
  out.model_flops = tokens * (6 * n_matmul + 12.0 * shape.n_layer * C * T);
  const double attention_fwd = 4.0 * shape.n_layer * C * T;
  const Recompute rc = cfg.train.recompute;
  out.recompute_flops =
      tokens * (rc == Recompute::Full ? 2 * active_matmul_params(shape) + attention_fwd
                : rc == Recompute::Selective ? attention_fwd
                                             : 0);
  out.tokens_per_s = tokens / out.total;
  // MFU against the peak of the precision the linear layers run at (FP8's under fp8).
  out.mfu = out.model_flops / out.total / (double(l.dp) * l.cp * l.tp * l.pp * lin.peak);
}

// What one layer's time depends on besides its kind (step_time's locals).
struct LayerInputs {
  const Config& cfg;
  const RunLayout& run;
  const Machine& machine;
  const Costs &c, &lin;   // the device's costs, and the linear layers' (FP8's peak)
  double a, b, T, n, tp;  // activation bytes, micro-batch, sequence, this rank's rows, tp
  double nh, QKV;         // query heads, the qkv width (per tp rank)
  int cp;
  bool gemm_attention, fp8;
  Recompute rc;
  AttentionCost att;      // this rank's attention products (per cp rank)
};

// One layer of `k`'s kind, one micro-batch: forward and backward.
LayerTime layer_time(const LayerInputs& x, const BlockCost& k) {
  const Costs &c = x.c, &lin = x.lin;
  const double a = x.a, b = x.b, T = x.T, n = x.n, tp = x.tp, nh = x.nh, QKV = x.QKV;
  const bool gemm_attention = x.gemm_attention;
  const Recompute rc = x.rc;
  const AttentionCost& att = x.att;
  LayerTime out;
  LinearTimes linear = linear_times(lin, n, k.gemms);
  const bool full = rc == Recompute::Full;
  for (size_t i = 0; i < k.gemms.size(); ++i)
    out.ops[op_clock::linear_slot(k.gemms[i].gemm)] +=
        linear.each_fwd_bwd[i] + (full ? linear.each_fwd[i] : 0);
  // The MoE MLP: the router on all n rows (in the compute type under fp8 too), each of the E
  // experts on its balanced n k / E (FP8's, as the linear layers').
  const MoeCost& moe = k.moe;
  double dispatch = 0, dispatch_exps = 0;  // forward elements and exps
  if (moe.experts > 0) {
    const LinearTimes router = linear_times(c, n, {moe.router});
    const LinearTimes expert = linear_times(lin, n * moe.top_k / moe.experts, moe.expert);
    linear.fwd += router.fwd + moe.experts * expert.fwd;
    linear.fwd_bwd += router.fwd_bwd + moe.experts * expert.fwd_bwd;
    out.ops[op_clock::kRouting] += router.fwd_bwd + (full ? router.fwd : 0);
    out.ops[op_clock::kExperts] += moe.experts * (expert.fwd_bwd + (full ? expert.fwd : 0));
    dispatch = n * (moe.dispatch_elems + moe.route_elems);
    dispatch_exps = n * moe.route_exps;
  }
  const double layer_gemm = linear.fwd_bwd + att.fwd + att.bwd;
  // Streaming ops of a layer, forward bytes (the backward reads and writes about twice as
  // much): the norms and residual adds on the residual stream's rows, a pass over the GEMMs'
  // outputs; the MLP's activation (an exp per element each way: GELU's tanh, SwiGLU's SiLU);
  // the attention's T x T softmax (an exp per causal score), or, fused, its q, k, v read once
  // per block of rows and the scores' exps again in the backward; an MoE layer's routing and
  // its rows gathered and combined.
  const double rows = x.cfg.parallel.sequence_parallel && tp > 1 ? n / tp : n;
  const double other = a * (rows * k.residual_elems + n * k.gemm_out_elems);
  const double act = a * n * k.activation_elems, act_exps = n * k.activation_exps;
  const double soft = gemm_attention ? 3 * a * b * nh * T * T : 4 * a * n * QKV;
  const double soft_exps = b * nh * T * (T + 1) / 2 / x.cp;
  // Each streaming term forward and backward, and forward alone (what a rerun costs).
  const double other_time = c.stream(3 * other, 0), other_fwd = c.stream(other, 0);
  const double act_time = c.stream(3 * act, 2 * act_exps), act_fwd = c.stream(act, act_exps);
  const double soft_time = c.stream(3 * soft, (gemm_attention ? 1 : 2) * soft_exps);
  const double soft_fwd = c.stream(soft, soft_exps);
  const double dispatch_time = c.stream(3 * a * dispatch, dispatch_exps);
  const double dispatch_fwd = c.stream(a * dispatch, dispatch_exps);
  const double layer_mem = other_time + act_time + soft_time + dispatch_time;
  const double fwd_mem = other_fwd + act_fwd + soft_fwd + dispatch_fwd;
  const double recompute = full                            ? linear.fwd + att.fwd + fwd_mem
                           : rc == Recompute::Selective ? att.fwd + (gemm_attention ? soft_fwd : 0)
                                                        : 0;
  // Kernel launches of a layer: its forward's, and twice that backward, the full recompute's
  // forward again.
  const double launches = double(k.forward_kernels) * (3 + (full ? 1 : 0));
  // The experts' casts: their n k rows through fc1 and fc2, the E experts' weights.
  const double weight_bytes = x.fp8 ? fp8_weight_bytes(x.cfg, x.run, a) : 0;
  const double casts =
      x.fp8 ? fp8_cast_seconds(c, n, k.gemms, a, weight_bytes) +
                  (moe.experts > 0 ? fp8_cast_seconds(c, n * moe.top_k, moe.expert, a,
                                                      moe.experts * weight_bytes)
                                   : 0)
            : 0;
  out.other = x.machine.measured ? 0 : launches * x.machine.kernel_overhead;
  out.total = layer_gemm + layer_mem + recompute + casts + out.other;
  // The attention's products and softmax passes (a selective recompute reruns them), the
  // routing's dispatch; the rest of the streaming ops (norms, residuals, activations,
  // biases) are elementwise.
  out.ops[op_clock::kAttention] +=
      att.fwd + att.bwd + soft_time +
      (rc == Recompute::None ? 0 : att.fwd + (full || gemm_attention ? soft_fwd : 0));
  out.ops[op_clock::kRouting] += dispatch_time + (full ? dispatch_fwd : 0);
  out.ops[op_clock::kFp8Casts] += casts;
  double named = out.other;
  for (double slot : out.ops) named += slot;
  out.ops[op_clock::kElementwise] += out.total - named;
  return out;
}

}  // namespace

StepTime step_time(const Config& cfg, const ModelShape& shape, const RunLayout& run,
                   const Machine& machine, bool bf16, uint64_t param_buffer) {
  const ParallelLayout& l = run.layout;
  const Costs c{machine, machine.peak(bf16), machine.compute(bf16)};
  const double a = bf16 ? 2 : 4;  // activation bytes
  // fp8 on a GPU: linear layers' GEMMs at the FP8 peak, the rest bf16; on a CPU fp32's.
  const bool fp8 = cfg.device.precision == Precision::Fp8 && machine.gpu && machine.peak_fp8 > 0;
  const Costs lin = fp8 ? Costs{machine, machine.peak_fp8, machine.compute_fp8()} : c;
  // n: this rank's rows of a micro-batch (T / cp tokens of each sequence under context
  // parallelism, whose causal attention work is 1 / cp of the whole sequence's on every rank).
  const double b = run.micro_batch, T = cfg.data.seq_len, C = shape.n_embd, n = b * T / l.cp;
  const double tp = l.tp;
  // The layer as its family describes it (model/cost.hpp): its GEMMs, streaming ops, sections;
  // an MoE layer's (model.moe) in place of the dense MLP, its router, experts and dispatch.
  const BlockCost cost = block_cost(shape, l.tp);
  const BlockWidths& w = cost.width;
  const double hs = w.hs, nh = w.nh, QKV = w.qkv;
  const bool gemm_attention = cfg.model.attention != Attention::Fused;
  const Recompute rc = cfg.train.recompute;
  AttentionCost att = attention_gemms(c, b, T, nh, w.nkv, hs, !gemm_attention);
  att.fwd /= l.cp;
  att.bwd /= l.cp;
  const LayerInputs inputs{cfg, run, machine, c, lin, a, b, T, n, tp, nh, QKV, l.cp,
                           gemm_attention, fp8, rc, att};
  const LayerTime per_layer = layer_time(inputs, cost);
  const LayerTime per_moe_layer =
      shape.moe.experts > 0 ? layer_time(inputs, block_cost(shape, l.tp, true)) : LayerTime{};
  // Where a rank's peers are (plan/network.hpp): ranks are numbered tp fastest, then cp, dp, pp.
  const Network net = machine.network();
  const Placement tp_group = place(net, l.tp, 1);
  const bool sp_on = cfg.parallel.sequence_parallel && l.tp > 1;
  const double tp_ops = tp_collectives(cost, sp_on, rc == Recompute::Full);

  StepTime out;
  double slowest = 0, slowest_bwd = 0;
  CommBytes slowest_comm;
  for (int s = 0; s < l.pp; ++s) {
    double layers = 0, moe = 0;
    for (const LayerRange& r : run.stage_chunks[size_t(s)]) {
      layers += r.end - r.begin;
      moe += moe_layers(shape, r.begin, r.end);
    }
    double t = (layers - moe) * per_layer.total + moe * per_moe_layer.total;
    LayerTime stage;  // this stage's breakdown, one micro-batch
    for (int k = 0; k < op_clock::kSlots; ++k)
      stage.ops[size_t(k)] = (layers - moe) * per_layer.ops[size_t(k)] +
                             moe * per_moe_layer.ops[size_t(k)];
    stage.other = (layers - moe) * per_layer.other + moe * per_moe_layer.other;
    if (s == l.pp - 1) {  // the LM head and the loss
      stage.ops[op_clock::kHead] =
          (cfg.device.fp8_head ? lin : c).gemm_fwd_bwd(n, double(shape.padded_vocab) / tp, C);
      stage.ops[op_clock::kCrossEntropy] =
          c.stream(3 * 4.0 * n * shape.padded_vocab / tp, double(n) * shape.padded_vocab / tp);
      t += stage.ops[op_clock::kHead] + stage.ops[op_clock::kCrossEntropy];
    }
    if (s == 0) {  // embedding and its gradient
      stage.ops[op_clock::kEmbedding] = c.bytes(2 * a * n * C * 2);
      t += stage.ops[op_clock::kEmbedding];
    }
    const CommBytes bytes = comm_bytes(cfg, shape, run, s, param_buffer, int(a));
    // tp: blocking collectives inside the layers, each with its latency (model/cost.hpp's
    // tp_collectives: 4 all-reduces per layer and micro-batch, 6 with a full recompute, or under
    // sequence parallelism 10 (14) all-gathers and reduce-scatters); an MoE layer's backward
    // all-reduces its gates' gradient besides.
    const double gates = bytes.moe_gates / run.n_micro;
    const double tp_bytes = bytes.payload[Traffic::tp] / run.n_micro - gates,
                 ops = tp_ops * std::max(1.0, layers);
    const double tp_time =
        l.tp <= 1 ? 0
                  : (sp_on ? ring_half(net, tp_group, tp_bytes, ops)
                           : all_reduce(net, tp_group, tp_bytes, ops).seconds) +
                        (gates > 0 ? all_reduce(net, tp_group, gates, moe).seconds : 0);
    // pp: a micro-batch's sends and receives, not overlapped with compute.
    const double pp_time =
        l.pp > 1 ? send(net, l.tp * l.cp * l.dp, bytes.payload[Traffic::pp] / run.n_micro, 2) : 0;
    // cp: the ring's K/V transfers (to the next cp rank, tp apart) overlap the attention of the
    // block in hand; what the attention (forward, backward, a rerun) does not cover is exposed,
    // with each hop's latency. The all-gather's collectives wait before the attention: exposed
    // whole. An MoE layer's forward sums its router statistics over cp, blocking.
    const double att_time = layers * (att.fwd + att.bwd + (rc == Recompute::None ? 0 : att.fwd));
    const bool ring = cfg.parallel.cp_comm != CpComm::AllGather;
    const double hops = layers * (ring ? 3.0 * (l.cp - 1) : 3.0);
    const double stats = bytes.moe_stats / run.n_micro;
    const double cp_payload = (bytes.payload[Traffic::cp] / run.n_micro - stats) *
                              (ring ? 1.0 : (l.cp - 1.0) / l.cp);
    const double cp_wire = send(net, l.tp, cp_payload, hops);
    const double cp_latency = send(net, l.tp, 0, hops);
    const double cp_time =
        l.cp > 1 ? (ring ? std::max(cp_latency, cp_wire - att_time) : cp_wire) +
                       (moe > 0 ? all_reduce(net, place(net, l.cp, l.tp), stats,
                                             moe * (rc == Recompute::Full ? 2 : 1)).seconds
                                : 0)
                 : 0;
    // ep: each MoE layer's all-to-alls (ep members of consecutive dp x cp ranks, tp apart),
    // blocking: the experts wait for their rows, the next layer for their outputs.
    // (Whole experts: ep consecutive ranks of tp x dp x cp, 1 apart.)
    const double ep_time = all_to_all(net, place(net, l.ep, l.experts_whole ? 1 : l.tp),
                                      bytes.payload[Traffic::ep] / run.n_micro, bytes.ep_exchanges);
    const double mb = t + tp_time + pp_time + cp_time + ep_time;
    if (mb > slowest) {
      out.ep = ep_time * run.n_micro;
      out.cp = cp_time * run.n_micro;
      out.attention = att_time * run.n_micro;
      slowest = mb;
      slowest_bwd = 2.0 / 3.0 * t;
      slowest_comm = bytes;
      out.tp = tp_time * run.n_micro;
      out.pp = pp_time * run.n_micro;
      out.compute = t * run.n_micro;
      for (int k = 0; k < op_clock::kSlots; ++k)
        out.ops[size_t(k)] = stage.ops[size_t(k)] * run.n_micro;
      out.launches = stage.other * run.n_micro;
    }
  }
  const double v = run.virtual_stages;
  out.bubble = (l.pp - 1) / v * slowest;
  finish_step(cfg, shape, run, machine, bf16, param_buffer, lin, slowest_bwd, slowest_comm, &out);
  return out;
}

}  // namespace tessera
