#include "plan/command.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>

#include "common/cli.hpp"
#include "common/error.hpp"
#include "common/files.hpp"
#include "common/memory.hpp"
#include "engine/memory.hpp"
#include "io/json.hpp"
#include "io/token_source.hpp"
#include "model/cost.hpp"
#include "plan/comm.hpp"
#include "plan/machine.hpp"
#include "plan/step_time.hpp"

namespace tessera {

const char* const kPlanUsage =
    R"(usage: tessera plan DECK.yaml [section.key=value ...] --ranks N
                   [--machine NAME | --machine-file FILE] [--search] [--json]

Predicts, without launching anything, what `tessera train DECK` would take on N ranks: per rank
role (pipeline stage, tensor-parallel rank) the bytes of parameters, gradients, optimizer state,
activations (for the schedule, recompute and sequence parallelism), other buffers and the data
loader's ring, counted from the trainer's own buffer declarations; the bytes per step on each
communicator (tp, dp, pp, embed, cp, ep); the pipeline bubble; the step time, tokens/s and MFU.
  --machine NAME       a100-40gb, a100-80gb, h100-sxm-700w, h100-sxm-500w (power-capped),
                       h100-sxm (= h100-sxm-700w), h200, gh200, or cpu (this machine, measured
                       now); default cpu for device.backend cpu, else h100-sxm
  --machine-file FILE  a YAML machine description (input/README.md, "Machine files")
  --search             every layout of N ranks (dp, tp, pp, virtual stages, micro-batch, ZeRO
                       stage, recompute, sequence parallelism) that fits, fastest first, and why
                       the others do not
  --json               one JSON object instead of text
Exit status: 0, or 2 for a bad deck, machine file or argument, or when nothing fits.
)";

namespace {

struct Options {
  std::string deck, machine, machine_file;
  std::vector<std::string> overrides;
  long ranks = 0;
  bool search = false, json = false;
};

// One candidate: a deck with its parallel and train keys set, and what the plan makes of it.
struct Candidate {
  Config cfg;
  ModelShape shape;
  RunLayout run;
  std::vector<RankMemory> roles;  // distinct (pp, tp) roles, dp rank 0
  std::vector<CommBytes> comm;    // by role
  StepTime time;
  double need = 0;                // the largest rank's device bytes (host bytes of a node: cpu)
  int worst = 0;                  // its role
  std::string refused;            // "" when it fits
};

std::string gb(double bytes) { return human_bytes(bytes); }

// "1.24 B", "350.2 M", "786.4 K": a parameter count.
std::string count(double n) {
  char buf[32];
  if (n >= 1e9) std::snprintf(buf, sizeof buf, "%.2f B", n / 1e9);
  else if (n >= 1e6) std::snprintf(buf, sizeof buf, "%.1f M", n / 1e6);
  else if (n >= 1e3) std::snprintf(buf, sizeof buf, "%.1f K", n / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

// A rank's parameter, gradient and optimizer bytes split between the experts' tensors and the
// dense ones by their share of its parameters (every parameter carries the same state).
struct StateSplit {
  double dense = 0, expert = 0;
};
StateSplit state_split(const RankMemory& m) {
  const double state = double(m.params) + double(m.grads) + double(m.optimizer) +
                       double(m.transient);
  const double share = m.param_elems ? double(m.expert_elems) / double(m.param_elems) : 0;
  return {state * (1 - share), state * share};
}

// "activations 42.2 GB the largest": which of a rank's buffers dominates its need.
std::string largest_term(const RankMemory& m) {
  const std::pair<const char*, uint64_t> terms[] = {
      {"parameters", m.params},       {"gradients", m.grads},  {"optimizer", m.optimizer},
      {"activations", m.activations}, {"ZeRO transient", m.transient},
      {"pipeline buffers", m.pipeline}, {"other", m.other - m.pipeline}};
  const auto* top = &terms[0];
  for (const auto& t : terms)
    if (t.second > top->second) top = &t;
  return std::string(top->first) + " " + gb(double(top->second)) + " the largest";
}

std::string layout_text(const Config& c, const RunLayout& r) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "dp=%d%s%s tp=%d pp=%d v=%d mb=%d zero=%d recompute=%s sp=%d",
                r.layout.dp,
                r.layout.cp > 1 ? (" cp=" + std::to_string(r.layout.cp)).c_str() : "",
                r.layout.ep > 1 ? (" ep=" + std::to_string(r.layout.ep)).c_str() : "",
                r.layout.tp, r.layout.pp, r.virtual_stages, r.micro_batch,
                c.parallel.zero, deck_word(c.train.recompute),
                int(c.parallel.sequence_parallel && r.layout.tp > 1));
  return buf;
}

// The plan of cfg on `ranks` of `machine`: its memory, communication and time, or why not.
// all_roles: every (pp, tp) role; else only the first and last stage's tp rank 0 (the largest
// tiles: the first stages take a balanced split's extra layers and hold the most micro-batches,
// the last holds the head), as the search needs.
Candidate plan(const Config& cfg, const ModelShape& shape, const ParallelLayout& layout,
               const Machine& machine, bool all_roles) {
  Candidate c;
  c.cfg = cfg;
  c.shape = shape;
  // The trainer's engine on this machine (fp8 on a GPU: bf16 beside the FP8 GEMMs).
  const EngineKind kind = engine_kind(cfg, machine.gpu);
  const bool bf16 = bf16_activations(kind);
  // MoE decks the trainer refuses are refused here by the same words.
  const std::string refused = make_run_layout(cfg, shape, layout, &c.run);
  if (!refused.empty()) {
    c.refused = refused;
    c.run.layout = layout;
    c.run.micro_batch = cfg.train.micro_batch;
    c.run.virtual_stages = cfg.parallel.virtual_stages;
    return c;
  }
  const int node = machine.devices_per_node;
  const std::vector<int> stages = all_roles ? [&] {
    std::vector<int> s;
    for (int i = 0; i < layout.pp; ++i) s.push_back(i);
    return s;
  }() : std::vector<int>{0, layout.pp - 1};
  for (int s : stages) {
    if (!all_roles && s == 0 && layout.pp == 1 && !c.roles.empty()) continue;
    for (int t = 0; t < (all_roles ? layout.tp : 1); ++t) {
      if (!all_roles && !c.roles.empty() && c.roles.back().pp_rank == s) continue;
      const long long rank = mesh_shape(layout).rank_at({{"tp", t}, {"pp", s}});
      c.roles.push_back(rank_memory(cfg, shape, c.run, rank, kind));
      c.comm.push_back(comm_bytes(cfg, shape, c.run, s, c.roles.back().buffer_size,
                                  bf16 ? 2 : 4));
    }
  }
  uint64_t buffer = 0;
  for (size_t i = 0; i < c.roles.size(); ++i) {
    const RankMemory& m = c.roles[i];
    const double need = machine.gpu ? double(m.arena) + machine.reserved : double(m.host());
    if (need > c.need) {
      c.need = need;
      c.worst = int(i);
    }
    buffer = std::max(buffer, m.buffer_size);
  }
  c.time = step_time(cfg, shape, c.run, machine, bf16, buffer);
  if (layout.tp > node)
    c.refused = "tp=" + std::to_string(layout.tp) + " crosses a node of " + std::to_string(node) +
                (machine.gpu ? " GPUs" : " devices");
  const RankMemory& w = c.roles[size_t(c.worst)];
  const std::string who = "stage " + std::to_string(w.pp_rank) + " tp " + std::to_string(w.tp_rank);
  if (machine.gpu && c.refused.empty() && c.need > machine.memory)
    c.refused = who + " needs " + gb(c.need) + " of " + gb(machine.memory) + " (short by " +
                gb(c.need - machine.memory) + "; " + largest_term(w) + ")";
  if (!machine.gpu && c.refused.empty()) {
    // The ranks of one node share its host memory, as the trainer's node check counts them.
    const double per_node =
        c.need * std::min<long>(node, long(layout.dp) * layout.cp * layout.tp * layout.pp);
    const double available = double(available_host_memory());
    if (per_node > available)
      c.refused = "a node's ranks need " + gb(per_node) + " of host memory, " + gb(available) +
                  " is available";
  }
  return c;
}

// A byte or element count that the planner carries as a double, written as an integer.
int64_t whole(double v) { return std::llround(v); }

JsonRow json_role(const RankMemory& m, const CommBytes& b) {
  JsonRow r = {{"pp_rank", m.pp_rank},
               {"tp_rank", m.tp_rank},
               {"param_bytes", 4ull * m.param_elems},
               {"grad_bytes", 4ull * m.param_elems},
               {"optim_bytes", m.moments},
               {"activation_bytes", m.activations},
               {"in_flight", m.in_flight},
               {"param_buffer_bytes", m.params},
               {"grad_buffer_bytes", m.grads},
               {"optimizer_buffer_bytes", m.optimizer},
               {"transient_bytes", m.transient},
               {"pipeline_buffer_bytes", m.pipeline},
               {"other_bytes", m.other},
               {"arena_bytes", m.arena},
               {"engine_host_bytes", m.engine_host},
               {"loader_bytes", m.loader},
               {"checkpoint_copy_bytes", m.checkpoint}};
  // model.moe: dense and expert parameters and their state, the MoE layers' buffers by name.
  const StateSplit split = state_split(m);
  r["dense_param_elems"] = m.param_elems - m.expert_elems;
  r["expert_param_elems"] = m.expert_elems;
  r["dense_state_bytes"] = whole(split.dense);
  r["expert_state_bytes"] = whole(split.expert);
  JsonRow buffers = JsonRow::object();
  for (int k = 0; k < RankMemory::kMoeBuffers; ++k)
    buffers[RankMemory::kMoeBufferNames[k]] = m.moe_buffers[k];
  r["moe_buffer_bytes"] = buffers;
  // Each group's payload, by the names the trainer's per-rank lines use (parallel/traffic.hpp).
  for (int k = 0; k < kTraffic; ++k)
    r[std::string(kTrafficNames[k]) + "_bytes_per_step"] = whole(b.payload.bytes[k]);
  return r;
}

// x to 4 significant digits.
std::string fixed(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", x);
  return text;
}

// The predicted step by the kinds of the trainer's step breakdown (metrics.jsonl's breakdown_ms,
// docs/running.md#step-breakdown), ms a step: the slowest stage's ops, the waits, the launches
// as `other`, the step; their sum is the step.
std::vector<std::pair<std::string, double>> breakdown_ms(const StepTime& t) {
  op_clock::Seconds ops = t.ops;
  ops[op_clock::kOptimizer] = t.optimizer;
  return op_clock::rows(ops, {t.tp, t.dp, t.cp, t.ep, t.pp + t.bubble, t.embed, 0.0}, t.launches,
                        t.total, 1e3);
}

// The step's time and its parts, added to `row`.
void add_time(JsonRow& row, const Candidate& c) {
  const StepTime& t = c.time;
  JsonRow breakdown;
  for (const auto& [name, ms] : breakdown_ms(t)) breakdown[name] = ms;
  row["breakdown_ms"] = breakdown;
  row.update(JsonRow{{"bubble", pipeline_bubble(c.run)},
                     {"step_seconds", t.total},
                     {"compute_seconds", t.compute},
                     {"tp_seconds", t.tp},
                     {"pp_seconds", t.pp},
                     {"bubble_seconds", t.bubble},
                     {"dp_seconds", t.dp},
                     {"embed_seconds", t.embed},
                     {"optimizer_seconds", t.optimizer},
                     {"tokens_per_s", t.tokens_per_s},
                     {"mfu", t.mfu},
                     {"model_flops_per_step", t.model_flops},
                     {"max_rank_bytes", whole(c.need)},
                     {"cp_seconds", t.cp},
                     {"attention_seconds", t.attention},
                     {"recompute_flops_per_step", t.recompute_flops},
                     {"ep_seconds", t.ep}});
}

// --search --json's list: every layout tried, with its time or why it was refused.
JsonRow json_layouts(const std::vector<Candidate>& all) {
  JsonRow items = JsonRow::array();
  for (const Candidate& c : all) {
    JsonRow item = {{"layout", layout_text(c.cfg, c.run)}, {"fits", c.refused.empty()}};
    if (c.refused.empty()) add_time(item, c);
    else item["refused"] = c.refused;
    items.push_back(item);
  }
  return items;
}

void print_plan(const Candidate& c, const Machine& machine, long ranks) {
  std::printf("plan: %ld ranks on %s: %s, schedule %s, %d micro-batch%s per step\n", ranks,
              machine.name.c_str(), layout_text(c.cfg, c.run).c_str(),
              deck_word(c.cfg.parallel.schedule), c.run.n_micro, c.run.n_micro > 1 ? "es" : "");
  const ModelShape& shape = c.shape;
  if (shape.moe.experts > 0) {
    const ParamCounts p = param_counts(shape);
    std::printf("  model: %s parameters, %s active per token (top-%d of %d experts in %d of %d "
                "layers; experts %s, dense %s); FLOPs and MFU on the active ones\n",
                count(p.total).c_str(), count(p.active).c_str(), shape.moe.top_k,
                shape.moe.experts, moe_layers(shape, 0, shape.n_layer), shape.n_layer,
                count(p.expert).c_str(), count(p.total - p.expert).c_str());
  }
  // Roles with identical counts (tp ranks usually are) share a line.
  for (size_t i = 0; i < c.roles.size(); ++i) {
    size_t j = i;
    while (j + 1 < c.roles.size() && c.roles[j + 1].pp_rank == c.roles[i].pp_rank &&
           c.roles[j + 1].arena == c.roles[i].arena && c.roles[j + 1].loader == c.roles[i].loader)
      ++j;
    const RankMemory& m = c.roles[i];
    const double need = machine.gpu ? double(m.arena) + machine.reserved : double(m.host());
    std::string of = machine.gpu ? "+ " + gb(machine.reserved) + " runtime = " + gb(need) +
                                       " of " + gb(machine.memory)
                                 : "(host: " + gb(need) + " with loader and checkpoint copies)";
    std::string line = memory_line(m, of);
    if (j > i) line.replace(line.find(" tp ") + 4, std::to_string(m.tp_rank).size(),
                            std::to_string(m.tp_rank) + "-" + std::to_string(c.roles[j].tp_rank));
    std::printf("  %s\n", line.c_str());
    if (shape.moe.experts > 0) {
      // Dense and expert state, and the dispatch's buffers (kept with the activations, the
      // scratch with `other`).
      const StateSplit split = state_split(m);
      std::string buffers;
      double total = 0;
      for (int k = 0; k < RankMemory::kMoeBuffers; ++k) {
        buffers += std::string(k ? ", " : "") + RankMemory::kMoeBufferNames[k] + " " +
                   gb(double(m.moe_buffers[k]));
        total += double(m.moe_buffers[k]);
      }
      std::printf("    dense: %s parameters, %s with gradients and optimizer; experts: %s "
                  "parameters, %s; MoE buffers %s (%s)\n",
                  count(double(m.param_elems - m.expert_elems)).c_str(), gb(split.dense).c_str(),
                  count(double(m.expert_elems)).c_str(), gb(split.expert).c_str(),
                  gb(total).c_str(), buffers.c_str());
    }
    // Each group's payload (cp and ep only where there is context or expert parallelism).
    std::string bytes;
    for (int k = 0; k < kTraffic; ++k) {
      const double b = c.comm[i].payload.bytes[k];
      if ((Traffic(k) != Traffic::cp && Traffic(k) != Traffic::ep) || b > 0)
        bytes += std::string(bytes.empty() ? "" : ", ") + kTrafficNames[k] + " " + gb(b);
    }
    std::printf("    bytes per step: %s\n", bytes.c_str());
    i = j;
  }
  const StepTime& t = c.time;
  char ep[32] = "";  // expert parallelism's all-to-alls, where there are any
  if (c.run.layout.ep > 1) std::snprintf(ep, sizeof ep, " + ep %.3g", t.ep);
  std::printf("  bubble %.3f; step %.4g s = compute %.4g + tp %.3g + pp %.3g%s + bubble %.3g + "
              "dp %.3g + embed %.3g + optimizer %.3g; %.4g tokens/s, MFU %.1f%%\n",
              pipeline_bubble(c.run), t.total, t.compute, t.tp, t.pp, ep, t.bubble, t.dp,
              t.embed, t.optimizer, t.tokens_per_s, 100 * t.mfu);
  std::string kinds;  // the breakdown's largest kinds, as the trainer's table names them
  std::vector<std::pair<std::string, double>> parts = breakdown_ms(t);
  parts.pop_back();  // the step
  std::stable_sort(parts.begin(), parts.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  for (const auto& [name, ms] : parts)
    if (ms >= 0.005 * 1e3 * t.total)
      kinds += std::string(kinds.empty() ? "" : ", ") + name + " " + fixed(ms);
  std::printf("  by kind (ms, as the run's breakdown): %s\n", kinds.c_str());
  if (c.run.layout.cp > 1)
    std::printf("  context parallelism: cp %d, K/V by %s; attention %.4g s, exposed cp "
                "communication %.3g s (in the step above)\n",
                c.run.layout.cp, deck_word(c.cfg.parallel.cp_comm), t.attention, t.cp);
  if (!c.refused.empty()) std::printf("  does not fit: %s\n", c.refused.c_str());
}

// Every layout the search tries: (dp, tp, pp) of `ranks`, virtual stages, micro-batches (powers
// of two), the ZeRO stages, recompute, sequence parallelism; the deck's schedule, zero_group,
// expert parallelism and other keys kept.
std::vector<Candidate> search(const Config& deck, const ModelShape& shape, long ranks,
                              const Machine& machine) {
  std::vector<Candidate> out;
  const int cp = std::max(1, deck.parallel.cp);  // the deck's context parallelism, kept
  const int ep = std::max(1, deck.parallel.ep);  // and its expert parallelism
  for (int tp = 1; tp <= ranks; ++tp) {
    if (ranks % (long(tp) * cp)) continue;
    for (int pp = 1; pp <= ranks / tp / cp; ++pp) {
      if ((ranks / tp / cp) % pp) continue;
      const int dp = int(ranks / tp / cp / pp);
      const int group = deck.parallel.zero_group > 0 && dp % deck.parallel.zero_group == 0
                            ? deck.parallel.zero_group
                            : 0;
      const ParallelLayout layout{dp, tp, pp, group, cp, ep, deck.parallel.expert_tp == 1 && tp > 1};
      const int ranks_ep = (layout.experts_whole ? tp : 1) * dp * cp;  // the ranks ep cuts
      Config base = deck;
      base.parallel.dp = dp;
      base.parallel.tp = tp;
      base.parallel.pp = pp;
      if (pp > 1 && deck.parallel.stage_layers.size() != size_t(pp)) base.parallel.stage_layers = {};
      if (pp == 1) base.parallel.stage_layers = {};
      const int per_dp = deck.train.batch_size / dp;
      bool any = false;
      for (int mb = 1; mb <= std::max(1, per_dp); mb *= 2)
        for (int v = 1; v <= (pp > 1 ? 4 : 1); v *= 2)
          for (int zero = 0; zero <= (dp > 1 ? 3 : 0); ++zero)
            for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full})
              for (int sp = 0; sp <= (tp > 1 ? 1 : 0); ++sp) {
                if (deck.train.batch_size % dp || per_dp % mb || ranks_ep % ep) continue;
                Config cfg = base;
                cfg.train.micro_batch = mb;
                cfg.parallel.virtual_stages = v;
                cfg.parallel.zero = zero;
                cfg.train.recompute = rc;
                cfg.parallel.sequence_parallel = sp;
                out.push_back(plan(cfg, shape, layout, machine, false));
                any = true;
              }
      if (!any) {
        Candidate c;
        c.cfg = base;
        c.run.layout = layout;
        c.refused = ranks_ep % ep ? "parallel.ep = " + std::to_string(ep) + " does not divide " +
                                        (layout.experts_whole ? "tp x " : "") + "dp x cp = " +
                                        std::to_string(ranks_ep)
                                  : "train.batch_size = " + std::to_string(deck.train.batch_size) +
                                        " is not a multiple of dp = " + std::to_string(dp);
        out.push_back(std::move(c));
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    if (a.refused.empty() != b.refused.empty()) return a.refused.empty();
    return a.refused.empty() ? a.time.total < b.time.total : false;
  });
  return out;
}

int vocab_of(const Config& cfg, std::string* note) {
  if (cfg.model.vocab_size > 0) return cfg.model.vocab_size;
  try {
    const TokenSource src(cfg.data.train, cfg.data.format, cfg.data.dtype);
    if (src.tokenizer().vocab_size > 0) return int(src.tokenizer().vocab_size);
  } catch (const UserError&) {
  }
  // No data here (a login node before the data is staged): the family's usual tokenizer.
  const Family& family = tessera::family(cfg.model.arch);
  *note = std::string("model.vocab_size = 0 and data.train unreadable here: ") +
          family.tokenizer + "'s " + std::to_string(family.vocab) + " tokens assumed";
  return family.vocab;
}

}  // namespace

int plan_command(const std::vector<std::string>& args) {
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw UserError("tessera plan: " + a + " needs a value");
      return args[++i];
    };
    if (a == "--help" || a == "-h") {
      std::fputs(kPlanUsage, stdout);
      return 0;
    } else if (a == "--ranks") {
      o.ranks = long(parse_int("--ranks", value(), 1, 1 << 20));
    } else if (a == "--machine") {
      o.machine = value();
    } else if (a == "--machine-file") {
      o.machine_file = value();
    } else if (a == "--search") {
      o.search = true;
    } else if (a == "--json") {
      o.json = true;
    } else if (a.starts_with("-")) {
      throw UserError("tessera plan: unknown option " + a + " (see tessera plan --help)");
    } else if (o.deck.empty()) {
      o.deck = a;
    } else if (a.find('=') != std::string::npos) {
      o.overrides.push_back(a);
    } else {
      throw UserError("tessera plan: unexpected argument '" + a + "' (see tessera plan --help)");
    }
  }
  if (o.deck.empty()) throw UserError("tessera plan: a deck is required (see tessera plan --help)");
  if (o.ranks == 0) throw UserError("tessera plan: --ranks N is required");
  if (!o.machine.empty() && !o.machine_file.empty())
    throw UserError("tessera plan: --machine and --machine-file exclude each other");
  const Config cfg = load_deck(o.deck, o.overrides);
  const Machine machine =
      !o.machine_file.empty() ? load_machine(o.machine_file)
                              : builtin_machine(!o.machine.empty() ? o.machine
                                                : cfg.device.backend == DeviceBackend::Cpu ? "cpu"
                                                                              : "h100-sxm",
                                                cfg.device.threads, o.ranks);
  if (cfg.device.precision == Precision::Bf16 && machine.peak_bf16 <= 0)
    throw UserError(o.deck + ": device.precision = bf16: machine " + machine.name +
                    " has no bf16 (a GPU machine, or device.precision=fp32)");
  if (cfg.device.precision == Precision::Fp8 && machine.gpu && machine.peak_fp8 <= 0)
    throw UserError(o.deck + ": device.precision = fp8: machine " + machine.name +
                    " has no FP8 (it needs compute capability 8.9 or later: H100, H200, GH200; "
                    "or device.precision=bf16)");
  std::string note;
  const ModelShape shape = make_model_shape(cfg.model, vocab_of(cfg, &note));
  const auto t0 = std::chrono::steady_clock::now();
  const std::clock_t cpu0 = std::clock();

  if (!o.search) {
    ParallelLayout layout;
    if (std::string e = resolve_layout(cfg.parallel, int(o.ranks), &layout); !e.empty())
      throw UserError(o.deck + ": " + e);
    const Candidate c = plan(cfg, shape, layout, machine, true);
    if (c.roles.empty()) throw UserError(o.deck + ": " + c.refused);
    if (o.json) {
      const ParamCounts p = param_counts(shape);
      JsonRow out = {{"ranks", o.ranks},
                     {"machine", machine.name},
                     {"dp", layout.dp},
                     {"tp", layout.tp},
                     {"pp", layout.pp},
                     {"cp", layout.cp},
                     {"micro_batches", c.run.n_micro},
                     {"fits", c.refused.empty()},
                     {"params_total", whole(p.total)},
                     {"params_active", whole(p.active)},
                     {"params_expert", whole(p.expert)},
                     {"moe_layers", moe_layers(shape, 0, shape.n_layer)},
                     {"experts", shape.moe.experts},
                     {"top_k", shape.moe.experts > 0 ? shape.moe.top_k : 0}};
      add_time(out, c);
      JsonRow roles = JsonRow::array();
      for (size_t i = 0; i < c.roles.size(); ++i) roles.push_back(json_role(c.roles[i], c.comm[i]));
      out["roles"] = roles;
      std::printf("%s\n", json_text(out).c_str());
    } else {
      if (!note.empty()) std::printf("note: %s\n", note.c_str());
      print_plan(c, machine, o.ranks);
    }
    if (!c.refused.empty()) {
      std::fprintf(stderr, "%s: %s does not fit: %s\n", o.deck.c_str(),
                   layout_text(c.cfg, c.run).c_str(), c.refused.c_str());
      return kExitBadInput;
    }
    return 0;
  }

  const std::vector<Candidate> all = search(cfg, shape, o.ranks, machine);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The search's own cost: on a shared login node its wall time also counts other users' load.
  const double cpu_seconds = double(std::clock() - cpu0) / CLOCKS_PER_SEC;
  size_t fits = 0;
  while (fits < all.size() && all[fits].refused.empty()) ++fits;
  if (o.json) {
    const JsonRow out = {{"ranks", o.ranks},        {"machine", machine.name},
                         {"fits", fits},            {"seconds", seconds},
                         {"cpu_seconds", cpu_seconds}, {"layouts", json_layouts(all)}};
    std::printf("%s\n", json_text(out).c_str());
  } else {
    if (!note.empty()) std::printf("note: %s\n", note.c_str());
    std::printf("search: %zu layouts of %ld ranks on %s, %zu fit (%.3f s, %.3f s of CPU); fastest "
                "first:\n",
                all.size(), o.ranks, machine.name.c_str(), fits, seconds, cpu_seconds);
    for (size_t i = 0; i < std::min<size_t>(fits, 10); ++i) {
      const Candidate& c = all[i];
      std::printf("  %2zu. %-66s step %.4g s, %.4g tokens/s, MFU %.1f%%, max rank %s\n", i + 1,
                  layout_text(c.cfg, c.run).c_str(), c.time.total, c.time.tokens_per_s,
                  100 * c.time.mfu, gb(c.need).c_str());
    }
    if (fits > 10) std::printf("  ... %zu more that fit (--json lists all)\n", fits - 10);
    // Why the others do not: the (dp, tp, pp) none of whose variants fits, with its reason.
    std::map<std::string, std::string> why;
    std::map<std::string, bool> fit_triples;
    for (const Candidate& c : all) {
      const std::string k = "dp=" + std::to_string(c.run.layout.dp) + " tp=" +
                            std::to_string(c.run.layout.tp) + " pp=" + std::to_string(c.run.layout.pp);
      if (c.refused.empty()) fit_triples[k] = true;
      else if (!why.count(k)) why[k] = c.refused;
    }
    for (const auto& [k, reason] : why)
      if (!fit_triples.count(k)) std::printf("  refused %s: %s\n", k.c_str(), reason.c_str());
    if (fits > 0 && fits < all.size())
      std::printf("  (%zu variants refused in all, --json gives each its reason)\n", all.size() - fits);
  }
  if (fits == 0) {
    // The smallest shortfall among the refusals for memory.
    const Candidate* best = nullptr;
    for (const Candidate& c : all)
      if (!c.roles.empty() && (!best || c.need < best->need)) best = &c;
    std::string line = o.deck + ": no layout of " + std::to_string(o.ranks) + " ranks fits " +
                       machine.name;
    if (best && machine.gpu)
      line += ": the smallest, " + layout_text(best->cfg, best->run) + ", needs " +
              gb(best->need) + " per GPU of " + gb(machine.memory) + " (short by " +
              gb(best->need - machine.memory) + ")";
    else if (best)
      line += ": the smallest, " + layout_text(best->cfg, best->run) + ": " + best->refused;
    std::fprintf(stderr, "%s\n", line.c_str());
    return kExitBadInput;
  }
  return 0;
}

}  // namespace tessera
