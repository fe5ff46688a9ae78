// parse_blend: data.train's text -> weighted token sources (config/blend.hpp).
#include "config/blend.hpp"

#include <charconv>
#include <cmath>
#include <sstream>

namespace tessera {

std::string parse_blend(const std::string& text, std::vector<BlendEntry>* out) {
  std::vector<std::string> words;
  std::istringstream in(text);
  for (std::string w; in >> w;) words.push_back(w);
  out->clear();
  if (words.empty()) return "no token source given";
  // Not starting with a number: one source, whose path may hold spaces.
  double first = 0;
  const std::string& w0 = words[0];
  if (auto [end, ec] = std::from_chars(w0.data(), w0.data() + w0.size(), first);
      words.size() == 1 || ec != std::errc() || end != w0.data() + w0.size()) {
    const size_t a = text.find_first_not_of(" \t\n"), b = text.find_last_not_of(" \t\n");
    out->push_back({1.0, text.substr(a, b - a + 1)});
    return "";
  }
  if (words.size() % 2 != 0)
    return "a blend is \"WEIGHT SOURCE WEIGHT SOURCE ...\", got " + std::to_string(words.size()) +
           " words";
  double sum = 0;
  for (size_t i = 0; i < words.size(); i += 2) {
    double w = 0;
    const std::string& t = words[i];
    auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), w);
    if (ec != std::errc() || end != t.data() + t.size() || !std::isfinite(w))
      return "blend weight " + std::to_string(i / 2 + 1) + " is '" + t + "', not a number";
    if (!(w > 0)) return "blend weight " + std::to_string(i / 2 + 1) + " must be > 0, got " + t;
    out->push_back({w, words[i + 1]});
    sum += w;
  }
  if (out->size() > kBlendBlock) return "a blend takes at most 4096 sources";
  for (BlendEntry& e : *out) e.weight /= sum;
  return "";
}

}  // namespace tessera
