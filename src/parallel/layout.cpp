// The layout of the world: its resolution, its checks, its mesh (docs/architecture.md).
#include "parallel/layout.hpp"

#include <cstdio>
#include <stdexcept>

namespace tessera {
namespace {

std::string num(long long v) { return std::to_string(v); }

// "[3, 3, 2]"
std::string list(const std::vector<int>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); i++) out += (i ? ", " : "") + num(v[i]);
  return out + "]";
}

std::string ranks(long long n) { return num(n) + (n == 1 ? " rank" : " ranks"); }

// "parallel: dp=2 x tp=2 x pp=2 = 8 ranks, but the job has 6" (" x cp=2" after dp with cp > 1)
std::string size_mismatch(const ParallelLayout& l, int world_size) {
  long long n = static_cast<long long>(l.dp) * l.cp * l.tp * l.pp;
  return "parallel: dp=" + num(l.dp) + (l.cp > 1 ? " x cp=" + num(l.cp) : "") + " x tp=" +
         num(l.tp) + " x pp=" + num(l.pp) + " = " + ranks(n) + ", but the job has " +
         num(world_size);
}

}  // namespace

std::string resolve_layout(const ParallelConfig& cfg, int world_size, ParallelLayout* out) {
  const char* const names[3] = {"dp", "tp", "pp"};
  int value[3] = {cfg.dp, cfg.tp, cfg.pp};
  std::vector<int> autos;
  const int cp = cfg.cp < 1 ? 1 : cfg.cp;
  long long fixed = cp;
  std::string fixed_text = cp > 1 ? "cp=" + num(cp) : "";  // "tp=4 x pp=1"
  for (int i = 0; i < 3; i++) {
    if (value[i] < 0) {
      return "parallel." + std::string(names[i]) + " = " + num(value[i]) + " must be >= 1 or auto";
    }
    if (value[i] == 0) {
      autos.push_back(i);
    } else {
      fixed *= value[i];
      fixed_text += (fixed_text.empty() ? "" : " x ") + std::string(names[i]) + "=" + num(value[i]);
    }
  }
  if (autos.size() > 1) {
    std::string which;
    for (size_t k = 0; k < autos.size(); k++) {
      const char* sep = k == 0 ? "" : k + 1 == autos.size() ? " and " : ", ";
      which += sep + std::string(names[autos[k]]);
    }
    return "parallel: " + which + " are auto; at most one of dp, tp, pp may be auto";
  }
  if (autos.empty()) {
    ParallelLayout l{value[0], value[1], value[2], 0, cp};
    if (fixed != world_size) return size_mismatch(l, world_size);
  } else {
    int a = autos[0];
    if (world_size % fixed != 0) {
      return "parallel: world size " + num(world_size) + " is not divisible by " + fixed_text +
             " (" + names[a] + "=auto)";
    }
    value[a] = static_cast<int>(world_size / fixed);
  }
  *out = ParallelLayout{value[0], value[1], value[2], cfg.zero_group, cp, cfg.ep < 1 ? 1 : cfg.ep,
                        cfg.expert_tp == 1 && value[1] > 1};
  if (cfg.zero_group > 0 && out->dpcp() % cfg.zero_group != 0)
    return "parallel.zero_group = " + num(cfg.zero_group) + " does not divide parallel.dp" +
           (cp > 1 ? " x cp = " + num(value[0]) + " x " + num(cp) : " = " + num(value[0])) +
           " (the dp" + (cp > 1 ? " x cp" : "") + " ranks are sharded in groups of zero_group)";
  return check_expert_groups(*out);
}

std::vector<std::pair<int, int>> stage_layer_ranges(int n_layer, int pp,
                                                    const std::vector<int>& stage_layers) {
  std::vector<std::pair<int, int>> ranges;
  int first = 0;
  for (int s = 0; s < pp; s++) {
    int count = stage_layers.empty() ? n_layer / pp + (s < n_layer % pp ? 1 : 0)
                                     : stage_layers.at(s);
    ranges.emplace_back(first, first + count);
    first += count;
  }
  return ranges;
}

std::string check_layout(const ParallelLayout& layout, int n_head, int padded_vocab, int n_layer,
                         const std::vector<int>& stage_layers, int batch_size, int micro_batch) {
  const int dp = layout.dp, tp = layout.tp, pp = layout.pp;
  if (n_head % tp != 0) {
    return "parallel.tp = " + num(tp) + " does not divide model.n_head = " + num(n_head);
  }
  if (padded_vocab % tp != 0) {
    return "parallel.tp = " + num(tp) + " does not divide the padded vocabulary Vp = " +
           num(padded_vocab) + " (make model.vocab_multiple a multiple of " + num(tp) + ")";
  }

  if (stage_layers.empty()) {
    if (pp > n_layer) {
      return "parallel.pp = " + num(pp) + " is more than model.n_layer = " + num(n_layer) +
             " (every stage needs at least one layer)";
    }
  } else {
    const std::string given = "parallel.stage_layers = " + list(stage_layers);
    if (static_cast<int>(stage_layers.size()) != pp) {
      return given + " has " + num(stage_layers.size()) + " entries, but parallel.pp = " + num(pp);
    }
    long long sum = 0;
    for (size_t s = 0; s < stage_layers.size(); s++) {
      if (stage_layers[s] < 1) {
        return given + " gives stage " + num(s) + " no layers (every stage needs at least one)";
      }
      sum += stage_layers[s];
    }
    if (sum != n_layer) {
      return given + " sums to " + num(sum) + ", but model.n_layer = " + num(n_layer);
    }
  }

  // Each step is batch_size / (dp * micro_batch) micro-batches of micro_batch sequences per rank.
  if (batch_size < dp) {
    return "train.batch_size = " + num(batch_size) + " is less than parallel.dp = " + num(dp) +
           " (every data-parallel rank needs at least one sequence per step)";
  }
  if (micro_batch < 1) return "the micro-batch size must be >= 1, got " + num(micro_batch);
  long long per_micro_step = static_cast<long long>(dp) * micro_batch;
  std::string per_text = "parallel.dp = " + num(dp) + " x micro-batch " + num(micro_batch) +
                         " = " + num(per_micro_step);
  if (batch_size < per_micro_step) {
    return "train.batch_size = " + num(batch_size) + " is less than " + per_text;
  }
  if (batch_size % per_micro_step != 0) {
    return "train.batch_size = " + num(batch_size) + " is not a multiple of " + per_text;
  }
  return "";
}

std::string check_expert_groups(const ParallelLayout& l) {
  if (l.experts_whole) {
    // Folded over tp: each ep group takes whole tp groups, so that a dense tensor's tp slices
    // are owned by one group's first tp ranks (model/shard.cpp).
    if (l.ep % l.tp != 0)
      return "parallel.ep = " + num(l.ep) + " is not a multiple of parallel.tp = " + num(l.tp) +
             " (with parallel.expert_tp = 1 each ep group takes whole tp groups)";
    if (static_cast<long long>(l.tp) * l.dpcp() % l.ep != 0)
      return "parallel.ep = " + num(l.ep) + " does not divide tp x dp x cp = " +
             num(static_cast<long long>(l.tp) * l.dpcp()) +
             " (with parallel.expert_tp = 1 the expert ranks fold over tp, dp and cp)";
    if (l.zero_group > 0)
      return "parallel.zero_group = " + num(l.zero_group) + " with parallel.expert_tp = 1: hybrid "
             "sharding is not combined with experts folded over tp yet; use zero_group 0";
    return "";
  }
  // Hybrid sharding with expert parallelism: each ZeRO group holds whole expert groups, so that
  // the experts' state splits over the group's ranks holding the same experts.
  if (l.zero_group > 0 && l.ep > 1 && l.zero_group % l.ep != 0)
    return "parallel.zero_group = " + num(l.zero_group) + " is not a multiple of parallel.ep = " +
           num(l.ep) + " (each ZeRO group must hold whole groups of the ep ranks that split "
           "the experts)";
  return "";
}

MeshShape mesh_shape(const ParallelLayout& l) {
  MeshShape mesh({{"tp", l.tp}, {"cp", l.cp}, {"dp", l.dp}, {"pp", l.pp}});
  const int group = l.shard_size();
  // resolve_layout checked that zero_group divides dp x cp.
  if (std::string e = mesh.add_view({"cp", "dp"}, {{"shard", group}, {"replica", l.dpcp() / group}});
      !e.empty())
    throw std::logic_error(e);
  // Expert parallelism (a view only where there is any: a dense run's groups stay as they were):
  // ep consecutive ranks split the experts; the others holding the same experts (edp)
  // are the ZeRO group's eshard = zero_group / ep of them, which split the experts' state, times
  // the ereplica groups holding the same parts (the replica groups: with one ZeRO group, 1).
  // With whole experts on every tp rank the cut takes tp x cp x dp (tp fastest; not hybrid).
  if (l.ep > 1 && l.experts_whole)
    if (std::string e = mesh.add_view({"tp", "cp", "dp"}, {{"ep", l.ep},
                                                           {"eshard", l.tp * l.dpcp() / l.ep},
                                                           {"ereplica", 1}});
        !e.empty())
      throw std::logic_error(e);
  if (l.ep > 1 && !l.experts_whole)
    if (std::string e = mesh.add_view({"cp", "dp"}, {{"ep", l.ep},
                                                     {"eshard", group / l.ep},
                                                     {"ereplica", l.dpcp() / group}});
        !e.empty())
      throw std::logic_error(e);
  return mesh;
}

std::string rank_grid(const MeshShape& mesh,
                      const std::vector<std::vector<std::pair<int, int>>>& stage_chunks,
                      const std::string& first_extra, const std::string& last_extra,
                      const std::string& both_extra) {
  auto width = [](long long n) { return static_cast<int>(num(n - 1).size()); };
  // The coordinates shown, slowest first, the stage last.
  std::vector<MeshDim> shown;
  for (auto d = mesh.dims().rbegin(); d != mesh.dims().rend(); ++d)
    if (d->name != "pp" && (d->size > 1 || d->name == "dp" || d->name == "tp")) shown.push_back(*d);
  shown.push_back({"pp", mesh.size("pp")});
  const long long world = mesh.world_size();
  std::string out;
  for (long long r = 0; r < world; r++) {
    if (r > 0) out += "\n";
    char line[200];
    std::snprintf(line, sizeof line, "rank %*lld: ", width(world), r);
    out += line;
    for (const MeshDim& d : shown) {
      std::snprintf(line, sizeof line, "%s %*d ", d.name.c_str(), width(d.size),
                    mesh.coord(r, d.name));
      out += line;
    }
    out += ' ';
    const int stage = mesh.coord(r, "pp");
    const auto& chunks = stage_chunks.at(size_t(stage));
    const bool one = chunks.size() == 1 && chunks[0].second - chunks[0].first == 1;
    out += one ? "layer " : "layers ";
    for (size_t k = 0; k < chunks.size(); ++k) {
      auto [first, last] = chunks[k];
      if (k > 0) out += ", ";
      out += num(first);
      if (last - first > 1) {
        out += '-';
        out += num(last - 1);
      }
    }
    const bool is_first = stage == 0, is_last = stage == mesh.size("pp") - 1;
    if (is_first && is_last) {
      out += " (+ " + both_extra + ")";
    } else if (is_first) {
      out += " (+ " + first_extra + ")";
    } else if (is_last) {
      out += " (+ " + last_extra + ")";
    }
  }
  return out;
}

}  // namespace tessera
