#pragma once
// The one document encoder: `tessera data encode --stream` (tools/data/prepare_data.py's) and
// `tessera data prepare` both turn documents into ids through it, so the two cannot drift apart.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "io/tokenizer.hpp"
#include "io/tokenizer_bpe.hpp"

namespace tessera {

// The tokenizer a file holds: a token file's, or a tokenizer.json's (hf-bpe; eot = its
// tessera.eos_token_id, else -1).
TokenizerInfo tokenizer_of(const std::string& path);

// Encodes batches of documents on `threads` OpenMP threads; a long document is cut at points
// where no token can cross (chunks() in data_encode.cpp), so its ids do not depend on the cut.
class DocumentEncoder {
 public:
  DocumentEncoder(const Tokenizer& tokenizer, int threads);
  // ids[d]: the ids of docs[d], without eot or bos.
  std::vector<std::vector<int32_t>> encode(const std::vector<std::string_view>& docs);

 private:
  const Tokenizer& tokenizer_;
  int threads_;
  std::vector<ByteLevelBpe::ScratchPtr> scratch_;
};

}  // namespace tessera
