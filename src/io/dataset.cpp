#include "io/dataset.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "common/error.hpp"
#include "common/rng.hpp"
#include "io/sample_order.hpp"

namespace tessera {

Blend::Blend(const std::vector<double>& weights, const std::vector<uint64_t>& windows,
             uint64_t seed)
    : windows_(windows), seed_(seed) {
  const size_t n = weights.size();
  // Largest remainder, every source at least one sample per block.
  std::vector<double> quota(n);
  uint64_t total = 0;
  counts_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    quota[i] = weights[i] * double(kBlock);
    counts_[i] = std::max<uint64_t>(1, uint64_t(std::floor(quota[i])));
    total += counts_[i];
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  auto remainder = [&](size_t i) { return quota[i] - double(counts_[i]); };
  while (total < kBlock) {
    const size_t i = *std::max_element(order.begin(), order.end(),
                                       [&](size_t a, size_t b) { return remainder(a) < remainder(b); });
    counts_[i] += 1;
    total += 1;
  }
  while (total > kBlock) {
    const size_t i = *std::min_element(order.begin(), order.end(), [&](size_t a, size_t b) {
      return counts_[a] > 1 && (counts_[b] <= 1 || remainder(a) < remainder(b));
    });
    counts_[i] -= 1;
    total -= 1;
  }
  starts_.resize(n);
  std::exclusive_scan(counts_.begin(), counts_.end(), starts_.begin(), uint64_t(0));
}

SampleRef Blend::at(uint64_t g) const {
  // One source: exactly the single-file order of io/sample_order.hpp (and tools/data/tessera_data.py).
  if (counts_.size() == 1) return {0, sample_window(g, windows_[0], seed_), g};
  const uint64_t block = g / kBlock;
  const uint64_t p = permute(g % kBlock, kBlock, stream_key(seed_, "blend"), block);
  const int s = int(std::upper_bound(starts_.begin(), starts_.end(), p) - starts_.begin()) - 1;
  const uint64_t k = block * counts_[size_t(s)] + (p - starts_[size_t(s)]);
  const uint64_t source_seed = mix64(stream_key(seed_, "source") + uint64_t(s));
  return {s, sample_window(k, windows_[size_t(s)], source_seed), k};
}

uint64_t Blend::consumed(int s, uint64_t g) const {
  if (counts_.size() == 1) return g;
  const uint64_t block = g / kBlock, lo = starts_[size_t(s)], hi = lo + counts_[size_t(s)];
  uint64_t n = block * counts_[size_t(s)];
  for (uint64_t j = 0; j < g % kBlock; ++j) {
    const uint64_t p = permute(j, kBlock, stream_key(seed_, "blend"), block);
    n += p >= lo && p < hi;
  }
  return n;
}

namespace {

std::vector<BlendEntry> entries_of(const std::string& text) {
  std::vector<BlendEntry> entries;
  if (std::string e = parse_blend(text, &entries); !e.empty())
    throw UserError("data.train = '" + text + "': " + e);
  return entries;
}

std::vector<TokenSource> open_sources(const std::vector<BlendEntry>& entries,
                                      const std::string& format, const std::string& dtype,
                                      int seq_len) {
  std::vector<TokenSource> sources;
  for (const BlendEntry& e : entries) {
    sources.emplace_back(e.spec, format, dtype);
    const TokenSource& s = sources.back();
    if (s.num_windows(seq_len) == 0)
      throw UserError(e.spec + ": " + std::to_string(s.num_tokens()) +
                      " tokens hold no window of data.seq_len + 1 = " + std::to_string(seq_len + 1));
    const TokenizerInfo& a = sources.front().tokenizer();
    if (!same_tokenizer(s.tokenizer(), a))
      throw UserError("data.train: the blend mixes tokenizers: " + entries.front().spec + " (" +
                      a.type + ", vocab " + std::to_string(a.vocab_size) + ") and " + e.spec +
                      " (" + s.tokenizer().type + ", vocab " +
                      std::to_string(s.tokenizer().vocab_size) + ")");
  }
  return sources;
}

std::vector<double> weights_of(const std::vector<BlendEntry>& entries) {
  std::vector<double> w;
  for (const BlendEntry& e : entries) w.push_back(e.weight);
  return w;
}

std::vector<uint64_t> windows_of(const std::vector<TokenSource>& sources, int seq_len) {
  std::vector<uint64_t> w;
  for (const TokenSource& s : sources) w.push_back(s.num_windows(seq_len));
  return w;
}

}  // namespace

Dataset::Dataset(const std::string& blend_text, const std::string& format,
                 const std::string& dtype, int seq_len, uint64_t seed)
    : entries_(entries_of(blend_text)),
      sources_(open_sources(entries_, format, dtype, seq_len)),
      blend_(weights_of(entries_), windows_of(sources_, seq_len), seed),
      seq_len_(seq_len),
      seed_(seed) {}

void Dataset::use_document_windows() {
  for (TokenSource& s : sources_) s.use_document_windows(seq_len_);
  blend_ = Blend(weights_of(entries_), windows_of(sources_, seq_len_), seed_);
}

void Dataset::reseed(uint64_t seed) {
  seed_ = seed;
  blend_ = Blend(weights_of(entries_), windows_of(sources_, seq_len_), seed);
}

void Dataset::read_sample(uint64_t g, int vocab, int32_t* inputs, int32_t* targets) const {
  const SampleRef r = blend_.at(g);
  const TokenSource& s = sources_[size_t(r.source)];
  std::vector<uint32_t> buf(size_t(seq_len_) + 1);
  const uint64_t first = s.window_start(r.window, seq_len_);
  s.read(first, buf.size(), buf.data());
  s.to_sample(buf.data(), first, seq_len_, vocab, inputs, targets);
}

std::string Dataset::position(uint64_t g) const {
  std::string out;
  for (size_t s = 0; s < sources_.size(); ++s) {
    const double epoch = double(blend_.consumed(int(s), g)) /
                         double(sources_[s].num_windows(seq_len_));
    char buf[64];
    std::snprintf(buf, sizeof buf, "%sepoch %.3f", s ? ", " : "", epoch);
    out += buf;
    if (sources_.size() > 1) out += " of " + entries_[s].spec;
  }
  return out;
}

std::string Dataset::describe() const {
  std::string out;
  for (size_t s = 0; s < sources_.size(); ++s) {
    char w[32];
    std::snprintf(w, sizeof w, "%.6g", entries_[s].weight);
    out += std::string(s ? "; " : "") + w + " " + entries_[s].spec + " (" +
           format_name(sources_[s].format()) + ", " + std::to_string(sources_[s].num_tokens()) +
           " tokens)";
  }
  return out;
}

uint32_t check_token_ids(MPI_Comm comm, const TokenSource& source, int vocab,
                         const std::function<bool()>& interrupted) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const uint64_t n = source.num_tokens();
  const uint64_t lo = n * uint64_t(rank) / uint64_t(size), hi = n * uint64_t(rank + 1) / uint64_t(size);
  constexpr uint64_t kChunk = 1 << 20;
  std::vector<uint32_t> buf(size_t(std::min(kChunk, hi - lo)));
  uint64_t first_bad = n;
  uint32_t max_id = 0;
  // A read error here is one rank's; turned into the same message on every rank below.
  for (uint64_t t = lo; t < hi && first_bad == n; t += kChunk) {
    if (interrupted && interrupted()) break;
    const uint64_t count = std::min(kChunk, hi - t);
    source.read(t, count, buf.data());
    for (uint64_t i = 0; i < count; ++i) {
      max_id = std::max(max_id, buf[i]);
      if (buf[i] >= uint32_t(vocab)) {
        first_bad = t + i;
        break;
      }
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, &first_bad, 1, MPI_UINT64_T, MPI_MIN, comm);
  MPI_Allreduce(MPI_IN_PLACE, &max_id, 1, MPI_UINT32_T, MPI_MAX, comm);
  if (first_bad < n) {
    uint32_t id = 0;
    source.read(first_bad, 1, &id);
    source.check_ids(&id, 1, first_bad, vocab, true);
  }
  return max_id;
}

}  // namespace tessera
