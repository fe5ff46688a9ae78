#pragma once
// The inputs of `tessera data prepare`: which files, how each is read (JSON Lines or a whole-file
// document; plain, gzip or zstd), and the documents of one rank's share of them.
//
// The inputs are laid end to end in sorted path order, each taking its size on disk, and rank r
// of P takes positions [total*r/P, total*(r+1)/P). A JSON line belongs to the rank whose range
// holds its position: in a plain file the offset of its first byte (a rank seeks to its start
// and skips the partial line there); in a gzip or zstd stream, the compressed bytes the decoder
// had been fed when the line's first byte came out. Every rank decodes such a stream from its
// start with the same calls on the same fixed-size input blocks, so it sees the same positions;
// it stops after its range. A whole-file document belongs to the rank holding the file's start.
// Which rank takes a document thus depends only on the files and P, and the documents of the
// ranks in rank order are the documents of the inputs in order.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tessera {

struct PrepareInput {
  enum class Codec { kPlain, kGzip, kZstd };
  std::string path;
  uint64_t bytes = 0;     // size on disk
  uint64_t start = 0;     // position of its first byte with the inputs laid end to end
  Codec codec = Codec::kPlain;
  bool json_lines = false;  // .jsonl / .json (before .gz / .zst): a document per line
};

// The files of INPUTS (files, directories searched recursively, globs), sorted, each once; a
// path given twice (or found twice) is taken once and named in *warnings. A Parquet file, a
// path that does not exist or a pattern matching nothing is a UserError (exit 2).
std::vector<PrepareInput> collect_prepare_inputs(const std::vector<std::string>& args,
                                                 std::vector<std::string>* warnings);

struct MalformedLine {
  size_t file = 0;
  int64_t line = 0;  // index among the lines of the file this rank read (0-based)
  std::string why;
};

struct ShareStats {
  std::vector<int64_t> lines;       // per input: lines this rank took
  int64_t json_lines = 0;           // non-blank JSON lines taken
  int64_t with_key = 0;             // of them, objects holding the text key
  int64_t malformed = 0;            // lines not taken as documents (missing key included)
  std::vector<MalformedLine> first; // the first few of them
  uint64_t position = 0;            // how far this rank has read, for progress
  int64_t line_limit = INT64_MAX;   // reading stops after this many JSON lines
};

// Reads the share [lo, hi) of inputs, calling on_document with each document's bytes in order.
// A malformed line is counted (with --strict reading stops there and the function returns false).
// Unreadable or truncated input is a UserError.
bool read_share(const std::vector<PrepareInput>& inputs, uint64_t lo, uint64_t hi,
                const std::string& text_key, bool strict, ShareStats* stats,
                const std::function<void(std::string&&)>& on_document);

// "" when one of the first `lines` JSON lines of the first JSON Lines input holds text_key (or
// there is no such input), else the line that stops the run at once: a wrong --text-key (or a
// file that is not JSON Lines) is seen before hours of reading. Reads on the calling rank alone.
std::string check_text_key(const std::vector<PrepareInput>& inputs, const std::string& text_key,
                           int64_t lines);

}  // namespace tessera
