// The mesh's rank arithmetic (docs/architecture.md): mixed-radix numbers over named dimensions.
#include "parallel/mesh_shape.hpp"

#include <algorithm>
#include <stdexcept>

namespace tessera {

namespace {

std::string join(const std::vector<MeshDim>& dims, const char* sep, bool sizes) {
  std::string out;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) out.append(sep);
    out.append(dims[i].name);
    if (sizes) out.append("=").append(std::to_string(dims[i].size));
  }
  return out;
}

}  // namespace

MeshShape::MeshShape(std::vector<MeshDim> base) : views_{std::move(base)} {
  for (size_t i = 0; i < dims().size(); ++i) {
    if (dims()[i].size < 1)
      throw std::logic_error("mesh: " + dims()[i].name + " = " + std::to_string(dims()[i].size));
    for (size_t j = 0; j < i; ++j)
      if (dims()[j].name == dims()[i].name)
        throw std::logic_error("mesh: dimension " + dims()[i].name + " named twice");
  }
}

std::string MeshShape::add_view(const DimNames& merged, std::vector<MeshDim> parts) {
  const std::vector<MeshDim>& base = dims();
  const int first = merged.empty() ? -1 : place(base, merged.front());
  long long whole = 1, cut = 1;
  for (size_t k = 0; k < merged.size(); ++k) {
    if (first < 0 || place(base, merged[k]) != first + int(k))
      throw std::logic_error("mesh: a view re-cuts adjacent dimensions in mesh order");
    whole *= base[size_t(first) + k].size;
  }
  for (const MeshDim& p : parts) {
    if (has(p.name)) throw std::logic_error("mesh: dimension " + p.name + " named twice");
    cut *= p.size;
  }
  if (cut != whole) {
    const std::vector<MeshDim> old(base.begin() + first, base.begin() + first + long(merged.size()));
    return "mesh: " + join(parts, " x ", true) + " = " + std::to_string(cut) + " does not cut " +
           join(old, " x ", true) + " = " + std::to_string(whole);
  }
  std::vector<MeshDim> view(base.begin(), base.begin() + first);
  view.insert(view.end(), parts.begin(), parts.end());
  view.insert(view.end(), base.begin() + first + long(merged.size()), base.end());
  views_.push_back(std::move(view));
  merged_.push_back(merged);
  return "";
}

int MeshShape::place(const std::vector<MeshDim>& view, std::string_view dim) {
  for (size_t i = 0; i < view.size(); ++i)
    if (view[i].name == dim) return int(i);
  return -1;
}

bool MeshShape::has(std::string_view dim) const {
  return std::any_of(views_.begin(), views_.end(),
                     [&](const std::vector<MeshDim>& v) { return place(v, dim) >= 0; });
}

int MeshShape::size(std::string_view dim) const {
  for (const std::vector<MeshDim>& v : views_)
    if (int i = place(v, dim); i >= 0) return v[size_t(i)].size;
  throw std::invalid_argument(unknown({std::string(dim)}));
}

long long MeshShape::world_size() const {
  long long n = 1;
  for (const MeshDim& d : dims()) n *= d.size;
  return n;
}

int MeshShape::view_of(const DimNames& names) const {
  for (size_t v = 0; v < views_.size(); ++v)
    if (std::all_of(names.begin(), names.end(),
                    [&](const std::string& n) { return place(views_[v], n) >= 0; }))
      return int(v);
  return -1;
}

std::string MeshShape::unknown(const DimNames& names) const {
  for (const std::string& n : names) {
    if (has(n)) continue;
    std::string all = join(dims(), ", ", false);
    for (size_t v = 1; v < views_.size(); ++v) {
      std::vector<MeshDim> own;
      for (const MeshDim& d : views_[v])
        if (place(dims(), d.name) < 0) own.push_back(d);
      all += "; " + join(own, ", ", false);
    }
    return "mesh: no dimension \"" + n + "\" (the mesh has " + all + ")";
  }
  if (view_of(names) >= 0) return "";
  // Every name is known but no view holds them all: a base dimension a view re-cut, with one
  // of its parts.
  for (const std::string& a : names)
    for (const std::string& b : names)
      if (in_base(a) && !in_base(b) && view_of({a, b}) < 0) {
        std::string cut;  // the base dimensions b's view re-cuts
        for (const MeshDim& d : dims())
          if (place(views_[size_t(view_of({b}))], d.name) < 0)
            cut += (cut.empty() ? "" : " x ") + d.name;
        return "mesh: no view holds " + a + " with " + b + " (" + b + " re-cuts " + cut + ")";
      }
  return "mesh: no view holds all of the group's dimensions";
}

std::vector<int> MeshShape::coords(const std::vector<MeshDim>& view, long long world_rank) const {
  std::vector<int> c(view.size());
  for (size_t i = 0; i < view.size(); ++i) {
    c[i] = int(world_rank % view[i].size);
    world_rank /= view[i].size;
  }
  return c;
}

int MeshShape::coord(long long world_rank, std::string_view dim) const {
  for (const std::vector<MeshDim>& v : views_)
    if (int i = place(v, dim); i >= 0) return coords(v, world_rank)[size_t(i)];
  throw std::invalid_argument(unknown({std::string(dim)}));
}

long long MeshShape::rank_at(const std::vector<MeshDim>& at) const {
  for (const MeshDim& c : at)
    if (place(dims(), c.name) < 0) throw std::invalid_argument(unknown({c.name}));
  long long rank = 0;
  for (size_t i = dims().size(); i-- > 0;) {
    int c = 0;
    for (const MeshDim& a : at)
      if (a.name == dims()[i].name) c = a.size;
    rank = rank * dims()[i].size + c;
  }
  return rank;
}

int MeshShape::group_size(const DimNames& names) const {
  const int v = view_of(names);
  if (v < 0) throw std::invalid_argument(unknown(names));
  long long n = 1;
  for (const MeshDim& d : views_[size_t(v)])
    if (std::find(names.begin(), names.end(), d.name) != names.end()) n *= d.size;
  return int(n);
}

int MeshShape::group_rank(long long world_rank, const DimNames& names) const {
  const int v = view_of(names);
  if (v < 0) throw std::invalid_argument(unknown(names));
  const std::vector<MeshDim>& view = views_[size_t(v)];
  const std::vector<int> c = coords(view, world_rank);
  long long rank = 0;
  for (size_t i = view.size(); i-- > 0;)
    if (std::find(names.begin(), names.end(), view[i].name) != names.end())
      rank = rank * view[i].size + c[i];
  return int(rank);
}

long long MeshShape::group_color(long long world_rank, const DimNames& names) const {
  const int v = view_of(names);
  if (v < 0) throw std::invalid_argument(unknown(names));
  const std::vector<MeshDim>& view = views_[size_t(v)];
  const std::vector<int> c = coords(view, world_rank);
  long long color = 0;
  for (size_t i = view.size(); i-- > 0;)
    if (std::find(names.begin(), names.end(), view[i].name) == names.end())
      color = color * view[i].size + c[i];
  return color;
}

std::string MeshShape::group_name(const DimNames& names) const {
  int v = view_of(names);
  if (v < 0) throw std::invalid_argument(unknown(names));
  DimNames set = names;
  if (v > 0) {
    // Every part of the cut named: the base dimensions it re-cuts instead.
    const DimNames& merged = merged_[size_t(v - 1)];
    bool all = true;
    for (const MeshDim& d : views_[size_t(v)])
      if (!in_base(d.name) && std::find(names.begin(), names.end(), d.name) == names.end())
        all = false;
    if (all) {
      set.clear();
      for (const std::string& n : names)
        if (in_base(n)) set.push_back(n);
      set.insert(set.end(), merged.begin(), merged.end());
      v = 0;
    }
  }
  const std::vector<MeshDim>& view = views_[size_t(v)];
  std::string out;
  for (size_t i = view.size(); i-- > 0;)
    if (std::find(set.begin(), set.end(), view[i].name) != set.end()) out += view[i].name;
  return out;
}

std::string MeshShape::describe() const { return join(dims(), " x ", true); }

}  // namespace tessera
