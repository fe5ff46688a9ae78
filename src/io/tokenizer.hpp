#pragma once
// The tokenizer that made a token file (docs/data.md), carried from the data into every checkpoint
// so `tessera sample` can turn text into ids and ids back into text.
//   byte           token = byte value 0..255, eot = 256 (vocab 257); needs no model
//   sentencepiece  a BPE model trained by tools/data/prepare_data.py --tokenizer bpe; the serialized
//                  sentencepiece ModelProto travels with the ids (eot = the model's eos id)
//   hf-bpe         a Hugging Face byte-level BPE (GPT-2, LLaMA 3: io/tokenizer_bpe.hpp); the model
//                  is its tokenizer.json, as tools/data/prepare_data.py --tokenizer FILE and
//                  tools/interop/import_weights.py store it, with a "tessera" member naming the special
//                  tokens (bos_token_id, eos_token_id, pad_token_id) of the model it came with
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

class ByteLevelBpe;

struct TokenizerInfo {
  std::string type = "byte";   // "byte" | "sentencepiece" | "hf-bpe" | a name tessera only trains with
  int64_t vocab_size = 0;
  int64_t eot = -1;            // end-of-text id between documents
  std::string model = {};      // serialized sentencepiece ModelProto, or hf-bpe's tokenizer.json;
                               // empty for "byte"
};

// Whether the tokenizer fully defines what its ids mean (byte, or a type with its model), so that
// two of them can be told apart; "none", or "gpt2" without a model, cannot.
bool tokenizer_known(const TokenizerInfo& info);

// A short fingerprint of the tokenizer (type, vocabulary and model): 16 hex digits of FNV-1a.
std::string tokenizer_hash(const TokenizerInfo& info);

// "" when ids of tokenizer `a` (of `a_where`) mean the same as ids of `b`, else one sentence
// saying how they differ (vocab_size, type or model hash). Tokenizers that are not known
// (tokenizer_known) agree with any of the same vocabulary size.
std::string tokenizer_mismatch(const TokenizerInfo& a, const std::string& a_where,
                               const TokenizerInfo& b, const std::string& b_where);

// The model bytes stored as dataset `name` under loc, or "" when there is none. UserError naming
// `file` when it is there but is not a 1-D 8-bit integer dataset or cannot be read.
std::string read_tokenizer_model(hid_t loc, const std::string& file, const std::string& name);

// Creates the 1-D uint8 dataset `name` under loc holding `model` (nothing when model is empty).
// In a parallel file every rank calls it (creation is collective) and only those with write_data
// write, with the transfer property list dxpl (H5P_DEFAULT in a serial file).
void write_tokenizer_model(hid_t loc, const std::string& name, const std::string& model,
                           bool write_data, hid_t dxpl);

// Checks a tokenizer read from `file`: a known type (byte, sentencepiece, hf-bpe, gpt2, llama3,
// none), vocab_size within limits::kVocab (0 only for none), eot an id of the vocabulary or -1
// (none recorded); a sentencepiece or hf-bpe tokenizer must carry a model that loads, whose
// vocabulary has vocab_size ids and holds the eot id. UserError naming the file otherwise.
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
  // The ids of text, without an eot or bos (byte: the bytes; sentencepiece and hf-bpe: as
  // tools/data/prepare_data.py encodes each document).
  std::vector<int32_t> encode(const std::string& text) const;
  // The text of ids: eot and other control ids decode to nothing. Byte and hf-bpe: the raw bytes.
  // Sentencepiece: byte pieces are joined into UTF-8; bytes that form no character become U+FFFD.
  std::string decode(const std::vector<int32_t>& ids) const;
  // The beginning-of-text id tools/data/prepare_data.py puts before each document: hf-bpe's bos when
  // it differs from eot (LLaMA 3's <|begin_of_text|>); -1 for the others.
  int64_t bos() const;
  // How many bytes of text each id stands for (0 for eot, bos and other control ids): the
  // denominator of bits per byte. Byte: 1; sentencepiece: the piece's UTF-8 with U+2581 as a
  // space, byte pieces 1; hf-bpe: the token's bytes.
  std::vector<uint32_t> token_byte_lengths() const;
  // The byte-level BPE of an hf-bpe tokenizer (nullptr for the others), for bulk encoding.
  const ByteLevelBpe* byte_level_bpe() const { return bpe_.get(); }

 private:
  TokenizerInfo info_;
  std::string where_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::unique_ptr<ByteLevelBpe> bpe_;
};

}  // namespace tessera
