#pragma once
// The collective write of one token file by `tessera data prepare`: every rank holds the tokens
// of a run of consecutive documents and writes them at its offset in /tokens, with their entries
// of /document_offsets, into FILE.tmp through MPI-IO.
#include <mpi.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "io/tokenizer.hpp"

namespace tessera {

// One output file's part on this rank: some of its documents, as ranges of the rank's one token
// array (train and val documents interleave there; no copy is made per file).
struct TokenFileShare {
  const std::vector<uint32_t>* tokens = nullptr;  // this rank's tokens, bos/eot included
  std::vector<std::pair<int64_t, int64_t>> documents;  // [begin, end) in *tokens, in order
  int64_t local_tokens = 0;         // the sum of their lengths
  int64_t first_token = 0;          // this rank's offset in /tokens (MPI_Exscan)
  int64_t first_document = 0;       // its first document's index in the file (MPI_Exscan)
  int64_t num_tokens = 0;           // of the whole file
  int64_t num_documents = 0;
};

// Writes tmp_path collectively (every rank of comm calls it): the root attributes of a token file
// (format, format_version, tokenizer, vocab_size, eot, num_documents, in that order), /tokens
// (contiguous, no filters, 4 KiB-aligned; uint16 up to 65536 ids, else uint32),
// /document_offsets (int64, num_documents + 1 entries) and /tokenizer_model when the tokenizer
// has a model. Returns "" or why this rank failed (every rank makes the same HDF5 calls
// whatever happened, so the caller agrees on the outcome afterwards).
std::string write_token_file(MPI_Comm comm, const std::string& tmp_path, const TokenizerInfo& tok,
                             const TokenFileShare& share);

}  // namespace tessera
