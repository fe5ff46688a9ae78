#pragma once
// One token stream behind one interface (docs/data.md), whatever prepared the data:
//   hdf5      tessera's token file: /tokens (uint16 or uint32) and the tokenizer's attributes
//   llmc      llm.c .bin shards: a 256 x int32 little-endian header (magic 20240520, version 1 =
//             uint16 GPT-2 tokens or 2 = uint32, token count) then the tokens
//   megatron  Megatron-LM indexed dataset: PREFIX.idx (sizes, pointers, documents) + PREFIX.bin
//   raw       headerless little-endian uint16 or uint32 (nanoGPT's train.bin); dtype from the deck
// A source named by a glob is the concatenation of its files in sorted order. Every format except
// a chunked HDF5 dataset is a list of extents: contiguous runs of tokens at a byte offset of a
// file, which the prefetcher reads with O_DIRECT.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/token_file.hpp"

namespace tessera {

enum class TokenFormat { hdf5, llmc, megatron, raw };
const char* format_name(TokenFormat format);

// Tokens [first_token, first_token + tokens) of the stream are at `offset` bytes into `file`.
struct TokenExtent {
  std::string file;
  uint64_t offset = 0;
  uint64_t tokens = 0;
  uint64_t first_token = 0;
};

class TokenSource {
 public:
  // spec: a file, a glob, or a Megatron prefix (PREFIX.idx + PREFIX.bin). format: auto | hdf5 |
  // llmc | megatron | raw; dtype: uint16 | uint32, for raw files only. Every malformed file is a
  // UserError naming the file and the offset or index where it went wrong (exit 2; a missing file
  // exit 1), raised alike on every rank.
  TokenSource(const std::string& spec, const std::string& format, const std::string& dtype);
  TokenSource(TokenSource&&) noexcept;
  TokenSource& operator=(TokenSource&&) = delete;  // would have to close the held descriptors
  ~TokenSource();

  const std::string& spec() const { return spec_; }
  TokenFormat format() const { return format_; }
  int token_bytes() const { return token_bytes_; }
  uint64_t num_tokens() const { return num_tokens_; }
  int64_t num_documents() const { return documents_; }  // -1: the format does not record them
  const std::vector<std::string>& files() const { return files_; }
  // Empty for a chunked or compressed HDF5 dataset, which only HDF5 itself can read.
  const std::vector<TokenExtent>& extents() const { return extents_; }
  // vocab_size 0 where the format does not say (Megatron, raw): the deck's model.vocab_size rules.
  const TokenizerInfo& tokenizer() const { return tokenizer_; }

  // Windows of seq_len + 1 tokens: at stride seq_len, or after use_document_windows() one at
  // each document start with seq_len tokens after it.
  uint64_t num_windows(int seq_len) const {
    if (document_windows_) return window_starts_.size();
    return num_tokens_ < 2 ? 0 : (num_tokens_ - 1) / uint64_t(seq_len);
  }
  // The first token of window w.
  uint64_t window_start(uint64_t w, int seq_len) const {
    return document_windows_ ? window_starts_[w] : w * uint64_t(seq_len);
  }
  // data.windows: documents: windows start at the documents' starts, from the HDF5 files' index
  // (io/document_index.hpp); a window runs on into the next documents where its own is shorter.
  // UserError for a source of another format, a file without the index, or no document with
  // seq_len tokens after its start.
  void use_document_windows(int seq_len);
  // Tokens [first, first + count) as uint32, with plain pread (or HDF5 for a chunked dataset, which
  // only the main thread may do: HDF5 is not thread-safe).
  void read(uint64_t first, uint64_t count, uint32_t* out) const;
  // "FILE at byte B" for token i: where a message points a user.
  std::string locate(uint64_t token) const;
  // Calls fn(extent, byte offset in its file, tokens) for each piece of tokens
  // [first, first + count), in order: a range may straddle shards.
  template <typename Fn>
  void for_each_piece(uint64_t first, uint64_t count, Fn&& fn) const;
  // ids[i] is token first + i; UserError naming the file and byte offset of the first id that is
  // not below vocab (every_rank: whether all ranks meet it alike).
  void check_ids(const uint32_t* ids, uint64_t count, uint64_t first, int vocab,
                 bool every_rank) const;
  // A window's T + 1 ids (tokens first .. first + T) -> model inputs (T) and targets (T, the
  // inputs shifted by one), after check_ids (an error only this rank meets).
  void to_sample(const uint32_t* window, uint64_t first, int T, int vocab, int32_t* inputs,
                 int32_t* targets) const;

 private:
  std::string spec_;
  TokenFormat format_ = TokenFormat::hdf5;
  int token_bytes_ = 2;
  uint64_t num_tokens_ = 0;
  int64_t documents_ = -1;
  std::vector<std::string> files_;
  std::vector<TokenExtent> extents_;
  std::vector<int> fds_;                 // one per extent, O_RDONLY
  TokenizerInfo tokenizer_;
  std::unique_ptr<TokenFile> hdf5_;      // a chunked HDF5 dataset
  bool document_windows_ = false;
  std::vector<uint64_t> window_starts_;  // document windows' first tokens
};

template <typename Fn>
void TokenSource::for_each_piece(uint64_t first, uint64_t count, Fn&& fn) const {
  // The extent holding `first` (binary search: a glob may hold thousands of shards), then on.
  auto x = std::upper_bound(extents_.begin(), extents_.end(), first,
                            [](uint64_t t, const TokenExtent& e) { return t < e.first_token; });
  for (--x; count > 0 && x != extents_.end(); ++x) {
    const uint64_t in = first - x->first_token, n = std::min(count, x->tokens - in);
    fn(*x, x->offset + in * uint64_t(token_bytes_), n);
    first += n;
    count -= n;
  }
}

// Token ids as stored (little-endian uint16 or uint32) -> uint32.
void decode_tokens(const unsigned char* bytes, int token_bytes, uint64_t count, uint32_t* out);

}  // namespace tessera
