#pragma once
// A token file's document index (docs/data.md): /document_offsets, 1-D integer, num_documents + 1
// entries, entry d the index in /tokens of document d's first token and the last the number of
// tokens, as `tessera data prepare` and tools/data/prepare_data.py write it. data.windows:
// documents starts the training windows at these offsets: the index is read, the tokens are not
// scanned.
#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

// The offsets of `path`'s documents (num_documents + 1 of them). UserError naming the file when
// there is no index, or it is not 1-D integer, has another length than num_documents + 1 (-1:
// no attribute, any length), does not start at 0, decreases, or does not end at num_tokens.
std::vector<uint64_t> read_document_offsets(const std::string& path, uint64_t num_tokens,
                                            int64_t num_documents);

}  // namespace tessera
