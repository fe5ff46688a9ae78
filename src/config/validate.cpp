// The deck's range rules, checked once every value is converted: each key's own range, and the
// rules between keys (reported at whichever was given last). A section at a time, in deck order;
// the parallel layout last, as far as it can be checked before the world size is known.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/fp8_format.hpp"
#include "common/limits.hpp"
#include "config/blend.hpp"
#include "config/deck.hpp"

namespace tessera::deck_internal {
namespace {

std::string num(int v) { return std::to_string(v); }
std::string num(long long v) { return std::to_string(v); }
std::string num(double v) { return shortest(v); }

void at_least(const Deck& deck, std::string_view name, long long v, long long min) {
  if (v < min) deck.fail_key(name, "must be >= " + num(min) + ", got " + num(v));
}

void positive(const Deck& deck, std::string_view name, double v) {
  if (!(v > 0)) deck.fail_key(name, "must be > 0, got " + num(v));
}

void non_negative(const Deck& deck, std::string_view name, double v) {
  if (!(v >= 0)) deck.fail_key(name, "must be >= 0, got " + num(v));
}

void below_one(const Deck& deck, std::string_view name, double v) {
  if (!(v >= 0 && v < 1)) deck.fail_key(name, "must be in [0, 1), got " + num(v));
}

// dp, tp, pp: 0 is how `auto` is stored, so a 0 is only fine where the deck said auto.
void positive_or_auto(const Deck& deck, std::string_view name, int v) {
  const Source& s = deck.sources[deck.index(name)];
  bool said_auto = v == 0 && s.present && s.value.IsScalar() && s.value.Scalar() == "auto";
  if (v < 1 && !said_auto) deck.fail_key(name, "must be >= 1 or auto, got " + num(v));
}

// An upper bound, with the reason it is there.
void at_most(const Deck& deck, std::string_view name, long long v, long long max, const char* why) {
  if (v > max) deck.fail_key(name, "must be <= " + num(max) + " (" + why + "), got " + num(v));
}

void not_empty(const Deck& deck, std::string_view name, const std::string& v, const char* meaning) {
  if (v.empty()) deck.fail_key(name, std::string("must not be empty (") + meaning + ")");
}

void validate_model(const Config& c, const Deck& deck) {
  const ModelConfig& m = c.model;
  const bool llama = m.arch == Arch::Llama;
  at_least(deck, "model.n_layer", m.n_layer, 1);
  at_most(deck, "model.n_layer", m.n_layer, limits::kLayers, limits::kLayersWhy);
  at_least(deck, "model.n_head", m.n_head, 1);
  at_most(deck, "model.n_head", m.n_head, limits::kEmbd, limits::kEmbdWhy);
  at_least(deck, "model.n_kv_head", m.n_kv_head, 0);
  if (m.n_kv_head > 0 && !llama && m.n_kv_head != m.n_head) {
    deck.fail_later("model.arch", "model.n_kv_head",
                    "model.n_kv_head = " + num(m.n_kv_head) +
                        " needs model.arch: llama (GPT-2 has n_head key/value heads)");
  }
  if (m.n_kv_head > 0 && m.n_head % m.n_kv_head != 0) {
    deck.fail_later("model.n_head", "model.n_kv_head",
                    "model.n_kv_head = " + num(m.n_kv_head) + " does not divide model.n_head = " +
                        num(m.n_head));
  }
  at_least(deck, "model.n_embd", m.n_embd, 1);
  at_most(deck, "model.n_embd", m.n_embd, limits::kEmbd, limits::kEmbdWhy);
  if (m.n_embd % m.n_head != 0) {
    deck.fail_later("model.n_embd", "model.n_head",
                    "model.n_embd = " + num(m.n_embd) +
                        " is not a multiple of model.n_head = " + num(m.n_head));
  }
  if (llama && (m.n_embd / m.n_head) % 2 != 0) {
    deck.fail_later("model.n_embd", "model.n_head",
                    "model.n_embd / model.n_head = " + num(m.n_embd / m.n_head) +
                        " is odd: llama's rotary embeddings rotate pairs of a head's values");
  }
  at_least(deck, "model.ffn_hidden", m.ffn_hidden, 0);
  at_most(deck, "model.ffn_hidden", m.ffn_hidden, limits::kFfn, limits::kFfnWhy);
  if (!llama && m.ffn_hidden != 0 && m.ffn_hidden != 4 * m.n_embd) {
    deck.fail_later("model.arch", "model.ffn_hidden",
                    "model.ffn_hidden = " + num(m.ffn_hidden) +
                        " needs model.arch: llama (GPT-2's MLP is 4 n_embd = " +
                        num(4 * m.n_embd) + " wide)");
  }
  at_least(deck, "model.ffn_multiple", m.ffn_multiple, 1);
  at_most(deck, "model.ffn_multiple", m.ffn_multiple, limits::kFfn, limits::kFfnWhy);
  at_least(deck, "model.block_size", m.block_size, 1);
  at_most(deck, "model.block_size", m.block_size, limits::kBlock, limits::kBlockWhy);
  at_least(deck, "model.vocab_size", m.vocab_size, 0);
  at_most(deck, "model.vocab_size", m.vocab_size, limits::kVocab, limits::kVocabWhy);
  at_least(deck, "model.vocab_multiple", m.vocab_multiple, 1);
  at_most(deck, "model.vocab_multiple", m.vocab_multiple, limits::kVocabMultiple,
          limits::kVocabMultipleWhy);
  positive(deck, "model.init_std", m.init_std);
  positive(deck, "model.norm_eps", m.norm_eps);
  if (!llama && m.norm_eps != 1e-5) {
    deck.fail_later("model.arch", "model.norm_eps",
                    "model.norm_eps = " + num(m.norm_eps) +
                        " needs model.arch: llama (GPT-2's LayerNorm uses 1e-5)");
  }
  positive(deck, "model.rope_theta", m.rope_theta);
  if (!llama && m.qk_norm) {
    deck.fail_later("model.arch", "model.qk_norm",
                    "model.qk_norm = true needs model.arch: llama (GPT-2's attention normalises "
                    "no head)");
  }
  if (m.attention == Attention::Fused && m.n_embd % m.n_head == 0 &&
             m.n_embd / m.n_head > limits::kFusedHeadSize) {
    deck.fail_later("model.n_head", "model.attention",
                    "model.attention = fused takes head sizes up to " +
                        num(limits::kFusedHeadSize) + ", and model.n_embd / model.n_head = " +
                        num(m.n_embd / m.n_head) + ": use model.attention: gemm or more heads");
  }
}

void validate_data(const Config& c, const Deck& deck) {
  const ModelConfig& m = c.model;
  not_empty(deck, "data.train", c.data.train, "the training token file");
  std::vector<BlendEntry> blend;
  if (std::string e = parse_blend(c.data.train, &blend); !e.empty()) deck.fail_key("data.train", e);
  const std::string& format = c.data.format;
  if (format != "auto" && format != "hdf5" && format != "llmc" && format != "megatron" &&
      format != "raw") {
    deck.fail_key("data.format", "must be auto, hdf5, llmc, megatron or raw, got " + shown(format));
  }
  if (c.data.dtype != "uint16" && c.data.dtype != "uint32") {
    deck.fail_key("data.dtype", "must be uint16 or uint32, got " + shown(c.data.dtype));
  }
  at_least(deck, "data.seq_len", c.data.seq_len, 1);
  at_least(deck, "data.prefetch", c.data.prefetch, 0);
  at_most(deck, "data.prefetch", c.data.prefetch, limits::kPrefetch, limits::kPrefetchWhy);
  at_least(deck, "data.readers", c.data.readers, 1);
  at_most(deck, "data.readers", c.data.readers, limits::kReaders, limits::kReadersWhy);
  if (c.data.seq_len > m.block_size) {
    deck.fail_later("data.seq_len", "model.block_size",
                    "data.seq_len = " + num(c.data.seq_len) +
                        " is more than model.block_size = " + num(m.block_size));
  }
}

void validate_train(const Config& c, const Deck& deck) {
  const TrainConfig& t = c.train;
  at_least(deck, "train.steps", t.steps, 0);
  at_least(deck, "train.batch_size", t.batch_size, 1);
  at_least(deck, "train.micro_batch", t.micro_batch, 0);
  if (static_cast<long long>(t.batch_size) * c.data.seq_len > limits::kStepTokens) {
    deck.fail_later("train.batch_size", "data.seq_len",
                    "train.batch_size x data.seq_len = " + num(t.batch_size) + " x " +
                        num(c.data.seq_len) + " tokens per step is more than " +
                        num(static_cast<long long>(limits::kStepTokens)) + " (" +
                        limits::kStepTokensWhy + ")");
  }
  at_least(deck, "train.anomaly_window", t.anomaly_window, 2);
  at_most(deck, "train.anomaly_window", t.anomaly_window, 100000, "a window of steps kept in memory");
  non_negative(deck, "train.anomaly_sigma", t.anomaly_sigma);
  at_least(deck, "train.anomaly_max_rollbacks", t.anomaly_max_rollbacks, 1);
  at_most(deck, "train.anomaly_max_rollbacks", t.anomaly_max_rollbacks, 1000,
          "rollbacks per checkpoint");
  if (t.micro_batch > 0 && t.batch_size % t.micro_batch != 0) {
    deck.fail_later("train.batch_size", "train.micro_batch",
                    "train.batch_size = " + num(t.batch_size) +
                        " is not a multiple of train.micro_batch = " + num(t.micro_batch));
  }
}

void validate_optim(const Config& c, const Deck& deck) {
  const OptimConfig& o = c.optim;
  positive(deck, "optim.lr", o.lr);
  non_negative(deck, "optim.min_lr", o.min_lr);
  if (o.min_lr > o.lr) {
    deck.fail_later("optim.lr", "optim.min_lr",
                    "optim.min_lr = " + num(o.min_lr) + " is more than optim.lr = " + num(o.lr));
  }
  at_least(deck, "optim.warmup_steps", o.warmup_steps, 0);
  at_least(deck, "optim.decay_steps", o.decay_steps, 0);
  non_negative(deck, "optim.weight_decay", o.weight_decay);
  below_one(deck, "optim.beta1", o.beta1);
  below_one(deck, "optim.beta2", o.beta2);
  positive(deck, "optim.eps", o.eps);
  non_negative(deck, "optim.grad_clip", o.grad_clip);
  if (o.name != OptimRule::Adafactor) {
    for (const char* key : {"optim.adafactor_eps", "optim.adafactor_decay", "optim.adafactor_clip"})
      if (deck.sources[deck.index(key)].present)
        deck.fail_key(key, std::string(key) + " needs optim.name: adafactor (got " +
                               shown(deck_word(o.name)) + ")");
    return;
  }
  positive(deck, "optim.adafactor_eps", o.adafactor_eps);
  if (!(o.adafactor_decay < 0 && o.adafactor_decay >= -1))
    deck.fail_key("optim.adafactor_decay",
                  "must be in [-1, 0) (beta2 at step t is 1 - t^adafactor_decay), got " +
                      num(o.adafactor_decay));
  positive(deck, "optim.adafactor_clip", o.adafactor_clip);
}

// FP8's keys: only with device.precision fp8 (a key that would do nothing is a mistake).
void validate_fp8(const Config& c, const Deck& deck) {
  const DeviceConfig& d = c.device;
  if (d.precision != Precision::Fp8) {
    for (const char* key : {"device.fp8_format", "device.fp8_amax_history", "device.fp8_amax_algo",
                            "device.fp8_margin", "device.fp8_head"})
      if (deck.sources[deck.index(key)].present)
        deck.fail_key(key, std::string(key) + " needs device.precision: fp8 (got " +
                               shown(deck_word(d.precision)) + ")");
    return;
  }
  at_least(deck, "device.fp8_amax_history", d.fp8_amax_history, 1);
  at_most(deck, "device.fp8_amax_history", d.fp8_amax_history, 1024,
          "Transformer Engine's recipes keep 16 to 1024 steps");
  at_least(deck, "device.fp8_margin", d.fp8_margin, 0);
  // Both recipes quantize the forward's tensors to E4M3, the narrower format: its bound.
  at_most(deck, "device.fp8_margin", d.fp8_margin, fp8_max_margin(Fp8Format::E4M3),
          "beyond it a tensor's largest values are subnormal in E4M3, and from 19 on every value "
          "rounds to zero");
}

void validate_device(const Config& c, const Deck& deck) {
  if (c.device.precision == Precision::Bf16 && c.device.backend == DeviceBackend::Cpu) {
    deck.fail_later("device.backend", "device.precision",
                    "device.precision = bf16 needs device.backend: cuda or auto (the CPU backend "
                    "is fp32)");
  }
  validate_fp8(c, deck);
  at_least(deck, "device.threads", c.device.threads, 0);
  at_most(deck, "device.threads", c.device.threads, limits::kThreads, limits::kThreadsWhy);
}

// model.moe (and parallel.ep, expert_tp and device.expert_gemm, which only MoE layers have a use
// for): with experts = 0 every other moe key is a mistake, as the fp8 keys without fp8.
void validate_moe(const Config& c, const Deck& deck) {
  const MoeConfig& e = c.model.moe;
  at_least(deck, "model.moe.experts", e.experts, 0);
  at_most(deck, "model.moe.experts", e.experts, limits::kExperts, limits::kExpertsWhy);
  at_least(deck, "parallel.ep", c.parallel.ep, 1);
  if (e.experts == 0) {
    for (const Field& f : deck.fields) {
      const std::string name = dotted(f);
      if ((name.rfind("model.moe.", 0) == 0 || name == "device.expert_gemm") &&
          name != "model.moe.experts" && deck.sources[deck.index(name)].present)
        deck.fail_key(name, name + " needs model.moe.experts > 0 (a dense model has no experts)");
    }
    if (c.parallel.expert_tp != 0)
      deck.fail_later("model.moe.experts", "parallel.expert_tp",
                      "parallel.expert_tp = " + num(c.parallel.expert_tp) +
                          " needs model.moe.experts > 0 (a dense model has no experts)");
    if (c.parallel.ep > 1)
      deck.fail_later("model.moe.experts", "parallel.ep",
                      "parallel.ep = " + num(c.parallel.ep) +
                          " needs model.moe.experts > 0 (only experts are split over ep)");
    return;
  }
  at_least(deck, "model.moe.top_k", e.top_k, 1);
  if (e.top_k > e.experts)
    deck.fail_later("model.moe.experts", "model.moe.top_k",
                    "model.moe.top_k = " + num(e.top_k) + " is more than model.moe.experts = " +
                        num(e.experts));
  at_least(deck, "model.moe.ffn", e.ffn, 0);
  at_most(deck, "model.moe.ffn", e.ffn, limits::kFfn, limits::kFfnWhy);
  at_least(deck, "model.moe.shared_experts", e.shared_experts, 0);
  at_most(deck, "model.moe.shared_experts", e.shared_experts, limits::kExperts, limits::kExpertsWhy);
  at_least(deck, "model.moe.every", e.every, 1);
  at_least(deck, "model.moe.first_dense", e.first_dense, 0);
  bool any = false;
  for (int l = e.first_dense; l < c.model.n_layer && !any; ++l) any = (l + 1) % e.every == 0;
  if (!any)
    deck.fail_latest({"model.n_layer", "model.moe.every", "model.moe.first_dense"},
                     "model.moe.every = " + num(e.every) + " and model.moe.first_dense = " +
                         num(e.first_dense) + " leave no MoE layer among model.n_layer = " +
                         num(c.model.n_layer));
  non_negative(deck, "model.moe.aux_loss", e.aux_loss);
  non_negative(deck, "model.moe.z_loss", e.z_loss);
  non_negative(deck, "model.moe.bias_rate", e.bias_rate);
  if (deck.sources[deck.index("model.moe.capacity_factor")].present && !(e.capacity_factor > 0))
    deck.fail_key("model.moe.capacity_factor",
                  "must be > 0 (leave it out for dropless routing), got " +
                      num(e.capacity_factor));
  if (e.experts % c.parallel.ep != 0)
    deck.fail_later("model.moe.experts", "parallel.ep",
                    "model.moe.experts = " + num(e.experts) + " is not divisible by parallel.ep = " +
                        num(c.parallel.ep));
  const ParallelConfig& p = c.parallel;
  at_least(deck, "parallel.expert_tp", p.expert_tp, 0);
  // With whole experts on every tp rank the ep groups fold over tp x dp x cp.
  const bool folded = p.expert_tp == 1 && p.tp > 1;
  if (p.dp > 0 && (folded ? p.tp : 1LL) * p.dp * p.cp % p.ep != 0)
    deck.fail_later("parallel.dp", "parallel.ep",
                    "parallel.ep = " + num(p.ep) + " does not divide " +
                        (folded ? "parallel.tp x " : "") + "parallel.dp x parallel.cp = " +
                        (folded ? num(p.tp) + " x " : "") + num(p.dp) + " x " + num(p.cp) +
                        (folded ? " (with parallel.expert_tp = 1 the expert ranks fold over tp, "
                                  "dp and cp)"
                                : " (the expert ranks are carved from the data-parallel ones)"));
}

// Context parallelism: each sequence in 2 x cp chunks, K/V passed round a ring or all-gathered.
void validate_context_parallel(const Config& c, const Deck& deck) {
  const ParallelConfig& p = c.parallel;
  at_least(deck, "parallel.cp", p.cp, 1);
  if (p.cp <= 1) return;
  const long long chunks = 2LL * p.cp;  // 64 bits: cp alone may be near the int's limit
  if (c.data.seq_len % chunks != 0)
    deck.fail_later("data.seq_len", "parallel.cp",
                    "data.seq_len = " + num(c.data.seq_len) + " is not divisible by 2 x parallel.cp = " +
                        num(chunks) + " (each sequence is cut into 2 x cp equal chunks)");
  if (c.model.attention != Attention::Fused)
    deck.fail_later("model.attention", "parallel.cp",
                    "parallel.cp = " + num(p.cp) + " needs model.attention: fused (got " +
                        shown(deck_word(c.model.attention)) +
                        "): the ring merges blocks by their log-sum-exp");
}

// The layout rules that need no world size; src/parallel/layout.cpp checks the resolved layout
// again (check_layout) once `auto` is known. 0 in dp, tp, pp is auto.
void validate_parallel(const Config& c, const Deck& deck) {
  const ParallelConfig& p = c.parallel;
  positive_or_auto(deck, "parallel.dp", p.dp);
  positive_or_auto(deck, "parallel.tp", p.tp);
  positive_or_auto(deck, "parallel.pp", p.pp);
  const std::pair<std::string_view, int> sizes[] = {
      {"parallel.dp", p.dp}, {"parallel.tp", p.tp}, {"parallel.pp", p.pp}};
  std::vector<std::string_view> autos;
  for (const auto& [key, v] : sizes) {
    if (v == 0) autos.push_back(key);
  }
  if (autos.size() > 1) {
    std::string which(autos[0]);
    for (size_t k = 1; k < autos.size(); k++) {
      which += (k + 1 == autos.size() ? " and " : ", ") + std::string(autos[k]);
    }
    deck.fail_latest(autos, which + " are auto; at most one of dp, tp, pp may be auto");
  }
  if (p.zero < 0 || p.zero > 3) {
    deck.fail_key("parallel.zero", "must be 0, 1, 2 or 3, got " + num(p.zero));
  }
  at_least(deck, "parallel.zero_group", p.zero_group, 0);
  if (p.dp > 0 && p.cp == 1 && p.zero_group > 0 && p.dp % p.zero_group != 0) {
    deck.fail_later("parallel.dp", "parallel.zero_group",
                    "parallel.zero_group = " + num(p.zero_group) + " does not divide parallel.dp = " +
                        num(p.dp) + " (the dp ranks are sharded in groups of zero_group)");
  }
  const long long dpcp = static_cast<long long>(p.dp) * p.cp;  // 64 bits, as every product here
  if (p.dp > 0 && p.cp > 1 && p.zero_group > 0 && dpcp % p.zero_group != 0) {
    deck.fail_later("parallel.dp", "parallel.zero_group",
                    "parallel.zero_group = " + num(p.zero_group) +
                        " does not divide parallel.dp x parallel.cp = " + num(p.dp) + " x " +
                        num(p.cp) + " (the dp x cp ranks are sharded in groups of zero_group)");
  }
  validate_context_parallel(c, deck);
  if (!p.reshard_after_forward && p.zero != 3) {
    deck.fail_later("parallel.zero", "parallel.reshard_after_forward",
                    "parallel.reshard_after_forward = false keeps gathered parameters, which only "
                    "parallel.zero = 3 shards; parallel.zero = " + num(p.zero));
  }

  const ModelConfig& m = c.model;
  if (p.tp > 0 && m.n_head % p.tp != 0) {
    deck.fail_later("parallel.tp", "model.n_head",
                    "parallel.tp = " + num(p.tp) + " does not divide model.n_head = " +
                        num(m.n_head));
  }
  if (p.tp > 0 && m.n_kv_head > 0 && m.n_kv_head % p.tp != 0) {
    deck.fail_later("parallel.tp", "model.n_kv_head",
                    "parallel.tp = " + num(p.tp) + " does not divide model.n_kv_head = " +
                        num(m.n_kv_head) + " (each rank needs whole key/value heads)");
  }
  if (p.tp > 0 && m.ffn_hidden > 0 && m.ffn_hidden % p.tp != 0) {
    deck.fail_later("parallel.tp", "model.ffn_hidden",
                    "parallel.tp = " + num(p.tp) + " does not divide model.ffn_hidden = " +
                        num(m.ffn_hidden));
  }
  at_least(deck, "parallel.virtual_stages", p.virtual_stages, 1);
  if (p.virtual_stages > 1) {
    if (p.schedule != ScheduleKind::OneFOneB)
      deck.fail_later("parallel.schedule", "parallel.virtual_stages",
                      "parallel.virtual_stages = " + num(p.virtual_stages) +
                          " interleaves the 1f1b schedule, but parallel.schedule = " +
                          deck_word(p.schedule));
    if (!p.stage_layers.empty())
      deck.fail_later("parallel.stage_layers", "parallel.virtual_stages",
                      "parallel.virtual_stages = " + num(p.virtual_stages) +
                          " splits the layers evenly: parallel.stage_layers must be []");
    if (p.pp == 1)
      deck.fail_later("parallel.pp", "parallel.virtual_stages",
                      "parallel.virtual_stages = " + num(p.virtual_stages) +
                          " needs parallel.pp >= 2 (one stage has nothing to interleave)");
    if (p.pp > 1 && m.n_layer % (static_cast<long long>(p.pp) * p.virtual_stages) != 0)
      deck.fail_later("model.n_layer", "parallel.virtual_stages",
                      "parallel.virtual_stages = " + num(p.virtual_stages) +
                          " does not divide the layers of each stage (model.n_layer = " +
                          num(m.n_layer) + " over parallel.pp = " + num(p.pp) +
                          "): every virtual stage needs the same number of layers");
  }
  const std::vector<int>& layers = p.stage_layers;
  if (!layers.empty()) {
    const std::string given = "parallel.stage_layers = " + flow(layers);
    long long sum = 0;
    for (int n : layers) {
      if (n < 1) {
        deck.fail_key("parallel.stage_layers",
                      "every stage needs at least one layer, got " + flow(layers));
      }
      sum += n;
    }
    if (p.pp > 0 && static_cast<int>(layers.size()) != p.pp) {
      deck.fail_later("parallel.stage_layers", "parallel.pp",
                      given + " has " + num(static_cast<long long>(layers.size())) +
                          " entries, but parallel.pp = " + num(p.pp));
    }
    if (sum != m.n_layer) {
      deck.fail_later("parallel.stage_layers", "model.n_layer",
                      given + " sums to " + num(sum) + ", but model.n_layer = " + num(m.n_layer));
    }
  } else if (p.pp > m.n_layer) {
    deck.fail_later("parallel.pp", "model.n_layer",
                    "parallel.pp = " + num(p.pp) + " is more than model.n_layer = " +
                        num(m.n_layer) + " (every stage needs at least one layer)");
  }

  // train.micro_batch is per data-parallel rank: a step is batch_size / (dp * micro_batch)
  // micro-batches on every rank; micro_batch 0 is batch_size / dp (no accumulation).
  const TrainConfig& t = c.train;
  if (p.dp > 0) {
    long long per = static_cast<long long>(p.dp) * std::max(t.micro_batch, 1);
    std::string per_text = t.micro_batch > 0
                               ? "parallel.dp x train.micro_batch = " + num(p.dp) + " x " +
                                     num(t.micro_batch) + " = " + num(per)
                               : "parallel.dp = " + num(p.dp);
    const char* problem = t.batch_size < per        ? " is less than "
                          : t.batch_size % per != 0 ? " is not a multiple of "
                                                    : nullptr;
    if (problem) {
      deck.fail_latest({"train.batch_size", "train.micro_batch", "parallel.dp"},
                       "train.batch_size = " + num(t.batch_size) + problem + per_text);
    }
  }
}

}  // namespace

void validate(const Config& c, const Deck& deck) {
  validate_model(c, deck);
  validate_moe(c, deck);
  validate_data(c, deck);
  validate_train(c, deck);
  validate_optim(c, deck);
  // eval, checkpoint, log, run: each key on its own.
  at_least(deck, "eval.every", c.eval.every, 0);
  at_least(deck, "eval.batches", c.eval.batches, 1);
  at_least(deck, "checkpoint.every", c.checkpoint.every, 0);
  at_least(deck, "checkpoint.collective_bytes", c.checkpoint.collective_bytes, 0);
  at_least(deck, "checkpoint.keep", c.checkpoint.keep, 0);
  not_empty(deck, "checkpoint.restart", c.checkpoint.restart, "auto, none or a checkpoint path");
  at_least(deck, "log.every", c.log.every, 1);
  non_negative(deck, "log.peak_gflops", c.log.peak_gflops);
  not_empty(deck, "run.dir", c.run.dir, "the run directory");
  non_negative(deck, "run.max_minutes", c.run.max_minutes);
  non_negative(deck, "run.hang_timeout", c.run.hang_timeout);
  validate_device(c, deck);
  validate_parallel(c, deck);
}

}  // namespace tessera::deck_internal
