// The deck's key table: every section and key, tied to its Config field (fields_of), the
// suggestions for a misspelt name, and the spelling of values, both in messages (one_line, shown)
// and in the resolved deck that to_yaml writes by walking the table.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <iterator>
#include <type_traits>

#include "config/deck.hpp"

namespace tessera {
namespace deck_internal {
namespace {

const char* const kSections[] = {"model", "data", "train", "optim", "eval",
                                 "checkpoint", "log", "run", "device", "parallel"};

// Appends `ch`, a control character as the escape YAML's double quotes use (\n, \t, \x01).
void append_escaped(std::string& out, unsigned char ch) {
  if (ch == '\n') {
    out += "\\n";
  } else if (ch == '\t') {
    out += "\\t";
  } else if (ch < 0x20 || ch == 0x7f) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02X", ch);
    out += buf;
  } else {
    out += static_cast<char>(ch);
  }
}

// Optimal string alignment distance: Levenshtein plus adjacent transpositions, so that
// "n_layres" is one edit from "n_layer".
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); i++) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); j++) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); i++) {
    for (size_t j = 1; j <= b.size(); j++) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// Close enough to be a typo of `candidate` rather than a different word.
bool is_close(std::string_view word, std::string_view candidate) {
  return edit_distance(word, candidate) <= 1 + candidate.size() / 4;
}

// shortest(), spelled so that YAML 1.1 readers (PyYAML) see a float too: they need a '.' and a
// signed exponent, "1.0e-08" rather than "1e-08".
std::string format_double(double v) {
  std::string text = shortest(v);
  size_t e = text.find('e');
  std::string mantissa = text.substr(0, e);
  if (mantissa.find('.') == std::string::npos) mantissa += ".0";
  if (e == std::string::npos) return mantissa;
  std::string power = text.substr(e + 1);
  return mantissa + (power[0] == '-' || power[0] == '+' ? "e" : "e+") + power;
}

// A double-quoted YAML string that yaml-cpp and PyYAML both read back unchanged.
std::string quote(std::string_view s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    append_escaped(out, ch);
  }
  return out + "\"";
}

// Each deck word's spellings, in its enum's order.
template <class E>
struct Words;
#define TESSERA_WORDS(E, ...)                                   \
  template <>                                                   \
  struct Words<E> {                                             \
    static constexpr const char* const words[] = {__VA_ARGS__}; \
  };
TESSERA_WORDS(Arch, "gpt2", "llama")
TESSERA_WORDS(Tie, "auto", "true", "false")
TESSERA_WORDS(Attention, "gemm", "fused")
TESSERA_WORDS(Recompute, "none", "selective", "full")
TESSERA_WORDS(AnomalyAction, "stop", "skip", "rollback")
TESSERA_WORDS(DeviceBackend, "cpu", "cuda", "auto")
TESSERA_WORDS(Precision, "fp32", "bf16", "fp8")
TESSERA_WORDS(Fp8Recipe, "hybrid", "e4m3")
TESSERA_WORDS(AmaxAlgo, "max", "most_recent")
TESSERA_WORDS(ExpertGemm, "loop", "grouped")
TESSERA_WORDS(ScheduleKind, "gpipe", "1f1b")
TESSERA_WORDS(CpComm, "ring", "allgather")
TESSERA_WORDS(OptimRule, "adamw", "adafactor")
TESSERA_WORDS(MoeScore, "softmax", "sigmoid")
TESSERA_WORDS(Breakdown, "auto", "true", "false")
TESSERA_WORDS(Windows, "stride", "documents")
#undef TESSERA_WORDS

template <class E>
Choice choice(E* field) {
  constexpr int n = int(std::size(Words<E>::words));
  return {Words<E>::words, n, [field] { return int(*field); },
          [field](int v) { *field = E(v); }};
}

}  // namespace

std::string word_list(const Choice& c) {
  std::string out;
  for (int i = 0; i < c.count; ++i)
    out += std::string(i == 0 ? "" : i + 1 == c.count ? " or " : ", ") + c.words[i];
  return out;
}

std::vector<Field> fields_of(Config& c) {
  return {
      {"model", "arch", choice(&c.model.arch)},
      {"model", "n_layer", &c.model.n_layer},
      {"model", "n_head", &c.model.n_head},
      {"model", "n_kv_head", &c.model.n_kv_head},
      {"model", "n_embd", &c.model.n_embd},
      {"model", "ffn_hidden", &c.model.ffn_hidden},
      {"model", "ffn_multiple", &c.model.ffn_multiple},
      {"model", "block_size", &c.model.block_size},
      {"model", "vocab_size", &c.model.vocab_size},
      {"model", "vocab_multiple", &c.model.vocab_multiple},
      {"model", "init_std", &c.model.init_std},
      {"model", "attention", choice(&c.model.attention)},
      {"model", "tie_embeddings", choice(&c.model.tie_embeddings)},
      {"model", "norm_eps", &c.model.norm_eps},
      {"model", "rope_theta", &c.model.rope_theta},
      {"model", "qk_norm", &c.model.qk_norm},
      {"model", "moe.experts", &c.model.moe.experts},
      {"model", "moe.top_k", &c.model.moe.top_k},
      {"model", "moe.ffn", &c.model.moe.ffn},
      {"model", "moe.shared_experts", &c.model.moe.shared_experts},
      {"model", "moe.every", &c.model.moe.every},
      {"model", "moe.first_dense", &c.model.moe.first_dense},
      {"model", "moe.score", choice(&c.model.moe.score)},
      {"model", "moe.renormalize", &c.model.moe.renormalize},
      {"model", "moe.aux_loss", &c.model.moe.aux_loss},
      {"model", "moe.z_loss", &c.model.moe.z_loss},
      {"model", "moe.bias_rate", &c.model.moe.bias_rate},
      {"model", "moe.capacity_factor", &c.model.moe.capacity_factor},
      {"data", "train", &c.data.train},
      {"data", "val", &c.data.val},
      {"data", "format", &c.data.format},
      {"data", "dtype", &c.data.dtype},
      {"data", "seq_len", &c.data.seq_len},
      {"data", "prefetch", &c.data.prefetch},
      {"data", "readers", &c.data.readers},
      {"data", "direct_io", &c.data.direct_io},
      {"data", "check_tokens", &c.data.check_tokens},
      {"data", "trace", &c.data.trace},
      {"data", "document_mask", &c.data.document_mask},
      {"data", "windows", choice(&c.data.windows)},
      {"train", "steps", &c.train.steps},
      {"train", "batch_size", &c.train.batch_size},
      {"train", "micro_batch", &c.train.micro_batch},
      {"train", "seed", &c.train.seed},
      {"train", "recompute", choice(&c.train.recompute)},
      {"train", "anomaly_window", &c.train.anomaly_window},
      {"train", "anomaly_sigma", &c.train.anomaly_sigma},
      {"train", "anomaly_action", choice(&c.train.anomaly_action)},
      {"train", "anomaly_max_rollbacks", &c.train.anomaly_max_rollbacks},
      {"optim", "lr", &c.optim.lr},
      {"optim", "min_lr", &c.optim.min_lr},
      {"optim", "warmup_steps", &c.optim.warmup_steps},
      {"optim", "decay_steps", &c.optim.decay_steps},
      {"optim", "weight_decay", &c.optim.weight_decay},
      {"optim", "beta1", &c.optim.beta1},
      {"optim", "beta2", &c.optim.beta2},
      {"optim", "eps", &c.optim.eps},
      {"optim", "grad_clip", &c.optim.grad_clip},
      {"optim", "name", choice(&c.optim.name)},
      {"optim", "reset_state", &c.optim.reset_state},
      {"optim", "adafactor_eps", &c.optim.adafactor_eps},
      {"optim", "adafactor_decay", &c.optim.adafactor_decay},
      {"optim", "adafactor_clip", &c.optim.adafactor_clip},
      {"eval", "every", &c.eval.every},
      {"eval", "batches", &c.eval.batches},
      {"checkpoint", "dir", &c.checkpoint.dir},
      {"checkpoint", "every", &c.checkpoint.every},
      {"checkpoint", "restart", &c.checkpoint.restart},
      {"checkpoint", "init_from", &c.checkpoint.init_from},
      {"checkpoint", "collective_bytes", &c.checkpoint.collective_bytes},
      {"checkpoint", "reserve", &c.checkpoint.reserve},
      {"checkpoint", "keep", &c.checkpoint.keep},
      {"checkpoint", "async", &c.checkpoint.async},
      {"log", "every", &c.log.every},
      {"log", "peak_gflops", &c.log.peak_gflops},
      {"log", "breakdown", choice(&c.log.breakdown)},
      {"run", "dir", &c.run.dir},
      {"run", "max_minutes", &c.run.max_minutes},
      {"run", "hang_timeout", &c.run.hang_timeout},
      {"device", "backend", choice(&c.device.backend)},
      {"device", "precision", choice(&c.device.precision)},
      {"device", "fp8_format", choice(&c.device.fp8_format)},
      {"device", "fp8_amax_history", &c.device.fp8_amax_history},
      {"device", "fp8_amax_algo", choice(&c.device.fp8_amax_algo)},
      {"device", "fp8_margin", &c.device.fp8_margin},
      {"device", "fp8_head", &c.device.fp8_head},
      {"device", "threads", &c.device.threads},
      {"device", "nccl_overlap", &c.device.nccl_overlap},
      {"device", "expert_gemm", choice(&c.device.expert_gemm)},
      {"parallel", "dp", IntOrAuto{&c.parallel.dp}},
      {"parallel", "tp", IntOrAuto{&c.parallel.tp}},
      {"parallel", "pp", IntOrAuto{&c.parallel.pp}},
      {"parallel", "cp", &c.parallel.cp},
      {"parallel", "ep", &c.parallel.ep},
      {"parallel", "expert_tp", &c.parallel.expert_tp},
      {"parallel", "cp_comm", choice(&c.parallel.cp_comm)},
      {"parallel", "schedule", choice(&c.parallel.schedule)},
      {"parallel", "zero", &c.parallel.zero},
      {"parallel", "zero_group", &c.parallel.zero_group},
      {"parallel", "reshard_after_forward", &c.parallel.reshard_after_forward},
      {"parallel", "zero_prefetch", &c.parallel.zero_prefetch},
      {"parallel", "stage_layers", &c.parallel.stage_layers},
      {"parallel", "sequence_parallel", &c.parallel.sequence_parallel},
      {"parallel", "virtual_stages", &c.parallel.virtual_stages},
  };
}

std::string dotted(const Field& f) { return std::string(f.section) + "." + f.key; }

bool is_group(const std::vector<Field>& fields, std::string_view section, std::string_view key) {
  for (const Field& f : fields) {
    const std::string_view k = f.key;
    if (section == f.section && k.size() > key.size() && k.substr(0, key.size()) == key &&
        k[key.size()] == '.')
      return true;
  }
  return false;
}

bool is_section(std::string_view name) {
  return std::find(std::begin(kSections), std::end(kSections), name) != std::end(kSections);
}

std::string one_line(std::string_view s) {
  std::string out;
  for (unsigned char ch : s) append_escaped(out, ch);
  return out;
}

std::string shown(std::string_view s) {
  std::string text = one_line(s);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return "'" + text + "'";
}

std::string suggest_key(const std::vector<Field>& fields, std::string_view section,
                        std::string_view key) {
  const Field* best = nullptr;
  size_t best_score = 0;
  for (const Field& f : fields) {
    if (!is_close(key, f.key)) continue;
    size_t score = edit_distance(key, f.key) + (section == f.section ? 0 : 1);
    if (!best || score < best_score) {
      best = &f;
      best_score = score;
    }
  }
  if (best) return " (did you mean " + dotted(*best) + "?)";
  std::string known;
  for (const Field& f : fields) {
    if (section != f.section) continue;
    known += (known.empty() ? "" : ", ") + std::string(f.key);
  }
  return " (" + std::string(section) + " has: " + known + ")";
}

std::string suggest_section(const std::vector<Field>& fields, std::string_view name) {
  for (const Field& f : fields) {
    if (name == f.key) return " (did you mean " + dotted(f) + "? keys go inside their section)";
  }
  const char* best = nullptr;
  size_t best_distance = 0;
  for (const char* s : kSections) {
    size_t d = edit_distance(name, s);
    if (is_close(name, s) && (!best || d < best_distance)) {
      best = s;
      best_distance = d;
    }
  }
  if (best) return " (did you mean " + std::string(best) + "?)";
  std::string known;
  for (const char* s : kSections) known += (known.empty() ? "" : ", ") + std::string(s);
  return " (sections: " + known + ")";
}

std::string shortest(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, ec == std::errc() ? end : buf);
}

std::string flow(const std::vector<int>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); i++) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

}  // namespace deck_internal

using namespace deck_internal;

#define TESSERA_DECK_WORD(E) \
  const char* deck_word(E v) { return Words<E>::words[int(v)]; }
TESSERA_DECK_WORD(Arch)
TESSERA_DECK_WORD(Tie)
TESSERA_DECK_WORD(Attention)
TESSERA_DECK_WORD(Recompute)
TESSERA_DECK_WORD(AnomalyAction)
TESSERA_DECK_WORD(DeviceBackend)
TESSERA_DECK_WORD(Precision)
TESSERA_DECK_WORD(Fp8Recipe)
TESSERA_DECK_WORD(AmaxAlgo)
TESSERA_DECK_WORD(ExpertGemm)
TESSERA_DECK_WORD(ScheduleKind)
TESSERA_DECK_WORD(CpComm)
TESSERA_DECK_WORD(OptimRule)
TESSERA_DECK_WORD(MoeScore)
TESSERA_DECK_WORD(Windows)
#undef TESSERA_DECK_WORD

RestartFrom restart_from(const CheckpointConfig& c) {
  return c.restart == "auto" ? RestartFrom::Auto
         : c.restart == "none" ? RestartFrom::None
                               : RestartFrom::Path;
}

std::string to_yaml(const Config& config) {
  Config copy = config;  // fields_of points into a Config it may write through
  std::string out;
  const char* section = "";
  std::string_view group;
  for (const Field& f : fields_of(copy)) {
    // The FP8 keys are a deck error without device.precision fp8: written only with it.
    if (std::string_view(f.key).rfind("fp8_", 0) == 0 && config.device.precision != Precision::Fp8)
      continue;
    // Likewise Adafactor's keys without optim.name adafactor.
    if (std::string_view(f.key).rfind("adafactor_", 0) == 0 && config.optim.name != OptimRule::Adafactor)
      continue;
    // model.moe's keys only with experts (each is a deck error without).
    const std::string_view key = f.key;
    if ((key.rfind("moe.", 0) == 0 || key == "expert_gemm") && config.model.moe.experts == 0)
      continue;
    // model.qk_norm only where it is on: the resolved decks of models without it stay as they were.
    if (key == "qk_norm" && !config.model.qk_norm) continue;
    // Dropless routing is capacity_factor left out: a 0 written back would be refused on reading.
    if (key == "moe.capacity_factor" && !(config.model.moe.capacity_factor > 0)) continue;
    if (std::string_view(section) != f.section) {
      section = f.section;
      group = "";
      out += std::string(section) + ":\n";
    }
    // A group's keys (moe.experts) as a map under the group's name.
    const size_t dot = key.find('.');
    const std::string_view in_group = dot == std::string_view::npos ? "" : key.substr(0, dot);
    if (in_group != group) {
      group = in_group;
      if (!group.empty()) out += "  " + std::string(group) + ":\n";
    }
    out += (group.empty() ? "  " : "    ") + std::string(key.substr(dot + 1)) + ": ";
    std::visit(
        [&](auto field) {
          using T = decltype(field);
          if constexpr (std::is_same_v<T, std::string*>) {
            out += quote(*field);
          } else if constexpr (std::is_same_v<T, double*>) {
            out += format_double(*field);
          } else if constexpr (std::is_same_v<T, bool*>) {
            out += *field ? "true" : "false";
          } else if constexpr (std::is_same_v<T, IntOrAuto>) {
            out += *field.value == 0 ? "auto" : std::to_string(*field.value);
          } else if constexpr (std::is_same_v<T, std::vector<int>*>) {
            out += flow(*field);
          } else if constexpr (std::is_same_v<T, Choice>) {
            out += quote(field.words[field.get()]);
          } else {
            out += std::to_string(*field);
          }
        },
        f.ref);
    out += "\n";
  }
  return out;
}

}  // namespace tessera
