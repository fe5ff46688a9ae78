#pragma once
// The training data of a run: one or more token sources mixed by weight (a blend), and the map
// from a global sample index to the window of a source that it reads. Like the single-source order
// (io/sample_order.hpp) the map is a pure function of (seed, global sample index): every layout,
// every restart and every dp size reads the same sequence.
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config/blend.hpp"
#include "io/token_source.hpp"

namespace tessera {

struct SampleRef {
  int source = 0;
  uint64_t window = 0;         // window of that source: T + 1 tokens from its window_start()
  uint64_t source_sample = 0;  // k: the sample's place in its source's own sequence
};

// Global samples are dealt out in blocks of kBlock: block b gives source s exactly counts()[s]
// samples (the largest-remainder rounding of its weight, at least 1), at positions a seeded
// permutation of the block picks, and those samples are source samples k in
// [b * counts[s], (b + 1) * counts[s]), in that permuted order. Source sample k reads the
// source's window permute(k mod n_s) of epoch k / n_s, as a single source does: every window once
// per epoch of the source.
class Blend {
 public:
  static constexpr uint64_t kBlock = kBlendBlock;
  Blend(const std::vector<double>& weights, const std::vector<uint64_t>& windows, uint64_t seed);
  SampleRef at(uint64_t g) const;
  // Samples of source s among global samples [0, g).
  uint64_t consumed(int s, uint64_t g) const;
  const std::vector<uint64_t>& counts() const { return counts_; }

 private:
  std::vector<uint64_t> counts_, starts_, windows_;
  uint64_t seed_;
};

class Dataset {
 public:
  // Opens every source of the blend; throws UserError for any malformed file.
  Dataset(const std::string& blend_text, const std::string& format, const std::string& dtype,
          int seq_len, uint64_t seed);

  const std::vector<TokenSource>& sources() const { return sources_; }
  const std::vector<BlendEntry>& entries() const { return entries_; }
  const Blend& blend() const { return blend_; }
  int seq_len() const { return seq_len_; }
  uint64_t seed() const { return seed_; }
  SampleRef sample(uint64_t g) const { return blend_.at(g); }
  // A restart keeps the checkpoint's seed, whatever the deck says.
  void reseed(uint64_t seed);
  // data.windows: documents: every source's windows start at its documents' starts
  // (TokenSource::use_document_windows), and the blend deals those out.
  void use_document_windows();
  // Reads global sample g: inputs (T) and targets (T); ids must be below vocab (else UserError
  // naming the file and byte offset). Main thread (HDF5).
  void read_sample(uint64_t g, int vocab, int32_t* inputs, int32_t* targets) const;
  // "epoch" of each source at global sample g (samples drawn / windows), for the log.
  std::string position(uint64_t g) const;
  // The sources as a checkpoint records them: "W SPEC (N tokens)" per source.
  std::string describe() const;

 private:
  std::vector<BlendEntry> entries_;
  std::vector<TokenSource> sources_;
  Blend blend_;
  int seq_len_;
  uint64_t seed_;
};

// Every rank scans its 1/size share of the source's tokens; an id >= vocab anywhere is one
// UserError on every rank, naming the file and the byte offset of the first such token. Returns
// the largest id seen. Collective over comm. `interrupted`, asked between chunks, ends a rank's
// scan early (a stop signal: the caller then stops the run).
uint32_t check_token_ids(MPI_Comm comm, const TokenSource& source, int vocab,
                         const std::function<bool()>& interrupted = {});

}  // namespace tessera
