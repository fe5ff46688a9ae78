#pragma once
// The tokenizer that made a token file (DESIGN §8), carried from the data into every checkpoint
// so `tessera sample` can turn text into ids and ids back into text.
//   byte           token = byte value 0..255, eot = 256 (vocab 257); needs no model
//   sentencepiece  a BPE model trained by tools/prepare_data.py --tokenizer bpe; the serialized
//                  sentencepiece ModelProto travels with the ids (eot = the model's eos id)
// Other types (e.g. "gpt2" of an llm.c shard, "none") train, but cannot be encoded or decoded here.
//
// In HDF5 the type, vocab_size and eot are attributes (named "tokenizer", "vocab_size", "eot" on a
// token file's root group; "type", "vocab_size", "eot" on a checkpoint's /tokenizer group) and the
// model is a 1-D uint8 dataset beside them (/tokenizer_model in a token file, /tokenizer/model in a
// checkpoint), absent for the byte tokenizer.
#include <hdf5.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace tessera {

struct TokenizerInfo {
  std::string type = "byte";   // "byte" | "sentencepiece" | a name tessera only trains with
  int64_t vocab_size = 0;
  int64_t eot = -1;            // end-of-text id between documents
  std::string model = {};      // serialized sentencepiece ModelProto; empty for "byte"
};

// The model bytes stored as dataset `name` under loc, or "" when there is none. UserError naming
// `file` when it is there but is not a 1-D 8-bit integer dataset or cannot be read.
std::string read_tokenizer_model(hid_t loc, const std::string& file, const std::string& name);

// Creates the 1-D uint8 dataset `name` under loc holding `model` (nothing when model is empty).
// In a parallel file every rank calls it (creation is collective) and only those with write_data
// write, with the transfer property list dxpl (H5P_DEFAULT in a serial file).
void write_tokenizer_model(hid_t loc, const std::string& name, const std::string& model,
                           bool write_data, hid_t dxpl);

// Checks a tokenizer read from `file`: a known type (byte, sentencepiece, gpt2, llama3, none),
// vocab_size within limits::kVocab (0 only for none), eot an id of the vocabulary or -1 (none
// recorded); a sentencepiece tokenizer must carry a model that loads, whose piece count is
// vocab_size and which holds the eot id. UserError naming the file otherwise.
void check_tokenizer(const TokenizerInfo& info, const std::string& file);

// Whether two token files were made by the same tokenizer (type, vocabulary and model), so their
// ids mean the same and they may be concatenated or blended.
inline bool same_tokenizer(const TokenizerInfo& a, const TokenizerInfo& b) {
  return a.type == b.type && a.vocab_size == b.vocab_size && a.model == b.model;
}

// Text <-> ids with the tokenizer of a token file or checkpoint (`where` names it in errors).
class Tokenizer {
 public:
  // UserError when the type cannot be encoded here or the model fails to load.
  Tokenizer(const TokenizerInfo& info, const std::string& where);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  const TokenizerInfo& info() const { return info_; }
  // The ids of text, without an eot (byte: the bytes; sentencepiece: as tools/prepare_data.py
  // encodes each document).
  std::vector<int32_t> encode(const std::string& text) const;
  // The text of ids: eot and other control ids decode to nothing. Byte: the raw bytes.
  // Sentencepiece: byte pieces are joined into UTF-8; bytes that form no character become U+FFFD.
  std::string decode(const std::vector<int32_t>& ids) const;

 private:
  TokenizerInfo info_;
  std::string where_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

}  // namespace tessera
