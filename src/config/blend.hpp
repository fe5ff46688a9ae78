#pragma once
// data.train's blend syntax: one token source, or several mixed by weight. Read here, below io/,
// so that the deck's validation refuses a malformed blend by its key before any file is opened;
// io/dataset.hpp opens the sources and deals the samples out.
#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

// Samples are dealt out to a blend's sources in blocks of this many, every source at least one
// per block (io/dataset.hpp's Blend::kBlock), so a blend holds at most this many sources.
inline constexpr uint64_t kBlendBlock = 4096;

struct BlendEntry {
  double weight = 1;
  std::string spec;
};

// data.train as the deck gives it: "SPEC" alone (spaces allowed unless it starts with a number),
// or Megatron's blend syntax "W1 SPEC1 W2 SPEC2 ..." with positive weights (normalised to sum 1).
// Returns "" or the problem.
std::string parse_blend(const std::string& text, std::vector<BlendEntry>* out);

}  // namespace tessera
