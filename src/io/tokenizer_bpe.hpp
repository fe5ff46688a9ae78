#pragma once
// Byte-level BPE of the Hugging Face kind (tokenizer.json), as GPT-2 and LLaMA 3 use it:
//   1. pre-tokenization: the text is cut into pieces by a regular expression (GPT-2's, implied by
//      a ByteLevel pre-tokenizer with use_regex, or the pattern of each Split pre-tokenizer, as in
//      LLaMA 3); the text between two matches is a piece too ("Isolated");
//   2. each piece's UTF-8 bytes are its first symbols: one token per byte (the vocabulary spells
//      byte b as the printable character bytes_to_unicode(b): 'Ġ' for a space);
//   3. merges by rank: the adjacent pair of lowest rank (the leftmost of equals) becomes its merged
//      token until no pair has a rank; with ignore_merges (LLaMA 3) a piece that is a token of
//      the vocabulary as a whole is that token at once.
// Decoding joins the tokens' bytes. Special (added) tokens are never produced from text (the
// literal "<|endoftext|>" is encoded as text) and decode to nothing.
//
// Text that is not valid UTF-8 is encoded as bytes: an invalid byte is a piece of its own (the
// pattern never matches across it), so decode(encode(x)) == x for every byte string x.
//
// The regular expressions run on PCRE2 (UTF, Unicode properties, JIT) with \s and \S read as
// Unicode White_Space, as Oniguruma (Hugging Face tokenizers) and tiktoken read them.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tessera {

class JsonAt;

class ByteLevelBpe {
 public:
  // Reads tokenizer.json text. UserError naming `where` and the JSON path for malformed JSON, a
  // value of the wrong kind, a file beyond the limits (common/limits.hpp: its bytes, nesting,
  // pre-tokenizer steps, vocabulary and merges), a kind tessera does not read (another model
  // type, a normalizer, byte fallback, another pre-tokenizer) or an inconsistent file (a merge
  // whose tokens are not in the vocabulary, a byte without a token).
  ByteLevelBpe(const std::string& json, const std::string& where);
  ~ByteLevelBpe();
  ByteLevelBpe(const ByteLevelBpe&) = delete;
  ByteLevelBpe& operator=(const ByteLevelBpe&) = delete;

  // Per-thread state of encode(): the regular expressions' match data and a cache of pieces.
  class Scratch;
  struct ScratchDeleter {
    void operator()(Scratch* s) const;
  };
  using ScratchPtr = std::unique_ptr<Scratch, ScratchDeleter>;
  ScratchPtr make_scratch() const;

  // Appends the ids of text to *out. One Scratch per thread; the tokenizer itself is shared.
  void encode(std::string_view text, Scratch& scratch, std::vector<int32_t>* out) const;
  std::vector<int32_t> encode(std::string_view text) const;
  // The bytes of ids, special tokens and ids outside the vocabulary left out.
  std::string decode(const std::vector<int32_t>& ids) const;

  // One more than the largest id (the vocabulary and the added tokens).
  int64_t vocab_size() const { return int64_t(token_bytes_.size()); }
  // The bytes a token decodes to (empty for special tokens and unused ids).
  const std::string& token_bytes(int32_t id) const { return token_bytes_[size_t(id)]; }
  bool is_special(int32_t id) const { return special_[size_t(id)] != 0; }
  // The ids the tessera section of the file names ("tessera": {"bos_token_id": ..}), -1 if none.
  int64_t bos() const { return bos_; }
  int64_t eos() const { return eos_; }
  int64_t pad() const { return pad_; }
  // The id of an added token by its content, -1 if there is none.
  int64_t added_token(const std::string& content) const;

 private:
  struct Regex;
  void compile_pattern(const std::string& source);
  void read_vocabulary(const JsonAt& model, const JsonAt& added,
                       std::unordered_map<std::string, int32_t>* spelled);
  void read_merges(const JsonAt& model, const std::unordered_map<std::string, int32_t>& spelled);
  void encode_piece(std::string_view piece, Scratch& scratch, std::vector<int32_t>* out) const;
  void split(std::string_view text, Scratch& scratch, std::vector<int32_t>* out) const;

  std::vector<std::unique_ptr<Regex>> patterns_;  // applied in turn: each piece is split again
  bool add_prefix_space_ = false;
  bool ignore_merges_ = false;
  int32_t byte_token_[256] = {};
  std::unordered_map<std::string, int32_t> vocab_;  // token bytes -> id (merges' results)
  std::unordered_map<uint64_t, uint64_t> merges_;   // (left << 32 | right) -> (rank << 32 | id)
  std::vector<std::string> token_bytes_;
  std::vector<uint8_t> special_;
  std::vector<std::pair<std::string, int32_t>> added_;
  int64_t bos_ = -1, eos_ = -1, pad_ = -1;
  std::string where_;
};

}  // namespace tessera
