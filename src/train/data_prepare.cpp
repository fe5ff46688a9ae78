// `tessera data prepare`: text files (JSON Lines, plain, gzip or zstd) -> train.h5 and val.h5 on
// every rank of an MPI job. Each rank reads and encodes its share of the inputs
// (train/data_prepare_input.hpp) with the encoder `data encode --stream` uses, the ranks count
// their documents and tokens with MPI_Exscan, and each writes its tokens at its offset of one
// /tokens dataset per file (train/data_prepare_write.hpp). The output depends on the inputs and
// flags alone, not on the number of ranks or threads.
#include <mpi.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "common/cli.hpp"
#include "common/error.hpp"
#include "common/files.hpp"
#include "io/hdf5_util.hpp"
#include "train/data_command.hpp"
#include "train/data_encode.hpp"
#include "train/data_prepare_input.hpp"
#include "train/data_prepare_write.hpp"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kBatchBytes = 16 << 20;  // text gathered before the threads encode it together
constexpr int64_t kKeyCheckLines = 1000;   // lines of the first JSON Lines input checked at once

struct PrepareArgs {
  std::vector<std::string> inputs;
  std::string out_dir, tokenizer = "byte", text_key = "text";
  int64_t val_every = 20;
  int threads = omp_get_max_threads();
  bool strict = false;
  double log_seconds = 2;
};

PrepareArgs parse_prepare(const std::vector<std::string>& args) {
  PrepareArgs a;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& s = args[i];
    if (s == "--strict") {
      a.strict = true;
      continue;
    }
    if (s.rfind("--", 0) != 0) {
      a.inputs.push_back(s);
      continue;
    }
    if (s != "--out-dir" && s != "--tokenizer" && s != "--text-key" && s != "--val-every" &&
        s != "--threads" && s != "--log-seconds")
      throw UserError("tessera data prepare: unknown option " + s + " (see tessera data --help)");
    if (i + 1 >= args.size()) throw UserError("tessera data prepare: " + s + " needs a value");
    const std::string& v = args[++i];
    if (s == "--out-dir") a.out_dir = v;
    else if (s == "--tokenizer") a.tokenizer = v;
    else if (s == "--text-key") a.text_key = v;
    else if (s == "--val-every") a.val_every = parse_int(s, v, 2, INT64_MAX);
    else if (s == "--threads") a.threads = int(parse_int(s, v, 1, 1024));
    else {
      char* end = nullptr;
      a.log_seconds = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(a.log_seconds >= 0 && a.log_seconds <= 86400))
        throw UserError("tessera data prepare: --log-seconds must be a number of seconds in "
                        "0..86400, got '" + v + "'");
    }
  }
  if (a.inputs.empty()) throw UserError("tessera data prepare: no INPUTS given");
  if (a.out_dir.empty()) throw UserError("tessera data prepare: --out-dir DIR is required");
  return a;
}

TokenizerInfo prepare_tokenizer(const std::string& name) {
  TokenizerInfo info;
  if (name == "byte") {
    info.vocab_size = 257;
    info.eot = 256;
    return info;
  }
  info = tokenizer_of(name);
  if (info.eot < 0)
    throw UserError(name + ": the tokenizer names no end-of-text token (no tessera.eos_token_id "
                    "member): give a token file made with it instead (tools/data/prepare_data.py "
                    "--tokenizer " + name + " on any small text finds the special tokens beside it, "
                    "in config.json, and stores them), or add the member");
  return info;
}

// This rank's documents, encoded: all tokens in order (bos and eot included) and where each
// document starts.
struct Encoded {
  std::vector<uint32_t> tokens;
  std::vector<int64_t> starts;
  uint64_t bytes = 0;
  int64_t not_utf8 = 0;  // documents that are not well-formed UTF-8 (encoded as bytes all the same)
};

// Whether text is well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above
// U+10FFFF). The encoders take any bytes (docs/data.md); the summary counts the documents that
// are not text.
bool valid_utf8(std::string_view text) {
  static constexpr uint32_t kLeast[5] = {0, 0, 0x80, 0x800, 0x10000};
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    const int n = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || i + size_t(n) > text.size()) return false;
    uint32_t code = c & (0x7F >> n);
    for (int k = 1; k < n; ++k) {
      const unsigned char d = static_cast<unsigned char>(text[i + size_t(k)]);
      if ((d & 0xC0) != 0x80) return false;
      code = code << 6 | (d & 0x3F);
    }
    if (code < kLeast[n] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return false;
    i += size_t(n);
  }
  return true;
}

// Progress of rank 0's share on stderr every log_seconds (documents, MB, tokens/s and the time
// its share has left: the others' shares are as large, so it stands for the job's).
class PrepareProgress {
 public:
  PrepareProgress(bool speak, double every, uint64_t share_bytes, int ranks)
      : speak_(speak), every_(every), share_(share_bytes), ranks_(ranks) {}
  // Called after every document, and after every encoded batch (batch_end): with every = 0 a
  // line per batch, not per document.
  void update(const Encoded& e, const ShareStats& s, uint64_t lo, bool batch_end) {
    if (!speak_ || (every_ == 0 && !batch_end)) return;
    const double t = std::chrono::duration<double>(Clock::now() - t0_).count();
    if (t - last_ < every_) return;
    last_ = t;
    const double done = double(std::min<uint64_t>(s.position > lo ? s.position - lo : 0, share_));
    const double eta = done > 0 ? t * (double(share_) - done) / done : 0;
    std::fprintf(stderr,
                 "prepare: rank 0 of %d: %zu documents, %.1f MB of text (%.0f%% of its share), "
                 "%zu tokens, %.0f tokens/s, ETA %.0f s\n",
                 ranks_, e.starts.size(), double(e.bytes) / 1e6,
                 share_ ? 100.0 * done / double(share_) : 100.0, e.tokens.size(),
                 double(e.tokens.size()) / std::max(t, 1e-9), eta);
  }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

 private:
  bool speak_;
  double every_;
  uint64_t share_;
  int ranks_;
  Clock::time_point t0_ = Clock::now();
  double last_ = 0;
};

void encode_batch(DocumentEncoder& encoder, int64_t bos, int64_t eot,
                  std::vector<std::string>& batch, Encoded* out) {
  const std::vector<std::vector<int32_t>> ids =
      encoder.encode(std::vector<std::string_view>(batch.begin(), batch.end()));
  for (size_t d = 0; d < ids.size(); ++d) {
    out->starts.push_back(int64_t(out->tokens.size()));
    if (bos >= 0) out->tokens.push_back(uint32_t(bos));
    out->tokens.insert(out->tokens.end(), ids[d].begin(), ids[d].end());
    out->tokens.push_back(uint32_t(eot));
    out->bytes += batch[d].size();
    out->not_utf8 += !valid_utf8(batch[d]);
  }
  batch.clear();
}

// Every rank throws the failure of the lowest failing rank (its message and exit status), or
// returns when no rank failed. Collective.
void agree_or_throw(MPI_Comm comm, const std::string& failure, int code) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int lowest = failure.empty() ? size : rank;
  MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, comm);
  if (lowest == size) return;
  int header[2] = {code, int(failure.size())};
  MPI_Bcast(header, 2, MPI_INT, lowest, comm);
  std::string message = failure;
  message.resize(size_t(header[1]));
  MPI_Bcast(message.data(), header[1], MPI_CHAR, lowest, comm);
  throw UserError(message, header[0]);
}

// Every rank's strings, in rank order, on every rank. Collective.
std::vector<std::string> all_gather(MPI_Comm comm, const std::vector<std::string>& mine) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  std::string packed;
  for (const std::string& s : mine) packed += s + '\n';
  int n = int(packed.size());
  std::vector<int> counts(static_cast<size_t>(size)), displs(static_cast<size_t>(size), 0);
  MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, comm);
  for (int r = 1; r < size; ++r) displs[size_t(r)] = displs[size_t(r - 1)] + counts[size_t(r - 1)];
  std::string all(size_t(displs.back() + counts.back()), '\0');
  MPI_Allgatherv(packed.data(), n, MPI_CHAR, all.data(), counts.data(), displs.data(), MPI_CHAR, comm);
  std::vector<std::string> out;
  for (size_t at = 0, nl; (nl = all.find('\n', at)) != std::string::npos; at = nl + 1)
    out.push_back(all.substr(at, nl - at));
  return out;
}

// The malformed lines of every rank, with their line numbers in their files (the lines of a file
// on the ranks before this one counted with MPI_Exscan); stops the job under --strict or when no
// JSON line has the text key. Returns the summary's words on them ("" when there were none).
std::string check_lines(MPI_Comm comm, const PrepareArgs& a, const std::vector<PrepareInput>& inputs,
                        const ShareStats& stats, bool complete) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::vector<int64_t> before(inputs.size(), 0);
  MPI_Exscan(stats.lines.data(), before.data(), int(inputs.size()), MPI_INT64_T, MPI_SUM, comm);
  if (rank == 0) std::fill(before.begin(), before.end(), 0);
  std::vector<std::string> mine;
  for (const MalformedLine& m : stats.first)
    mine.push_back(inputs[m.file].path + ":" + std::to_string(before[m.file] + m.line + 1) + ": " +
                   m.why);
  const std::vector<std::string> reports = all_gather(comm, mine);
  int64_t counts[4] = {stats.malformed, stats.json_lines, stats.with_key, complete ? 0 : 1};
  MPI_Allreduce(MPI_IN_PLACE, counts, 4, MPI_INT64_T, MPI_SUM, comm);
  if (counts[3] > 0 && !reports.empty())
    throw UserError(reports.front() + " (--strict stops at the first malformed line)");
  if (counts[1] > 0 && counts[2] == 0)
    throw UserError("--text-key " + a.text_key + ": none of the " + std::to_string(counts[1]) +
                    " JSON lines of the input has a \"" + a.text_key + "\" member (" +
                    (reports.empty() ? "" : "e.g. " + reports.front()) + "): name the key "
                    "holding the text");
  if (counts[0] == 0) return "";
  if (rank == 0)
    for (size_t i = 0; i < reports.size() && i < 5; ++i)
      std::fprintf(stderr, "prepare: malformed line skipped: %s\n", reports[i].c_str());
  return "; " + std::to_string(counts[0]) + " malformed lines skipped (of " +
         std::to_string(counts[1]) + " JSON lines)";
}

// Document g of the inputs goes to val.h5 when g % val_every == val_every - 1 (as
// tools/data/prepare_data.py decides): by its index in the whole input, whatever the ranks.
// The shares point into enc.tokens, which must outlive them.
void split_documents(MPI_Comm comm, int64_t val_every, Encoded& enc, TokenFileShare split[2]) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  int64_t local = int64_t(enc.starts.size()), first = 0;
  MPI_Exscan(&local, &first, 1, MPI_INT64_T, MPI_SUM, comm);
  if (rank == 0) first = 0;
  for (int64_t d = 0; d < local; ++d) {
    const bool val = (first + d) % val_every == val_every - 1;
    const int64_t begin = enc.starts[size_t(d)];
    const int64_t end = d + 1 < local ? enc.starts[size_t(d + 1)] : int64_t(enc.tokens.size());
    TokenFileShare& s = split[val ? 1 : 0];
    s.documents.emplace_back(begin, end);
    s.local_tokens += end - begin;
  }
  enc.starts = {};
  split[0].tokens = split[1].tokens = &enc.tokens;
  int64_t counts[4] = {int64_t(split[0].documents.size()), split[0].local_tokens,
                       int64_t(split[1].documents.size()), split[1].local_tokens};
  int64_t before[4] = {0, 0, 0, 0}, total[4];
  MPI_Exscan(counts, before, 4, MPI_INT64_T, MPI_SUM, comm);
  if (rank == 0) std::fill(before, before + 4, 0);
  MPI_Allreduce(counts, total, 4, MPI_INT64_T, MPI_SUM, comm);
  for (int v = 0; v < 2; ++v) {
    split[v].first_document = before[2 * v];
    split[v].first_token = before[2 * v + 1];
    split[v].num_documents = total[2 * v];
    split[v].num_tokens = total[2 * v + 1];
  }
  if (total[0] == 0 || total[2] == 0)
    throw UserError(std::to_string(total[0] + total[2]) + " documents with --val-every " +
                    std::to_string(val_every) + " leave the " + (total[2] == 0 ? "val" : "train") +
                    " split empty: give more input or a smaller --val-every");
}

}  // namespace

int data_prepare(const std::vector<std::string>& args) {
  MPI_Comm comm = MPI_COMM_WORLD;
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  hdf5_quiet();
  const PrepareArgs a = parse_prepare(args);
  const TokenizerInfo info = prepare_tokenizer(a.tokenizer);
  const Tokenizer tokenizer(info, a.tokenizer);
  std::vector<std::string> warnings;
  const std::vector<PrepareInput> inputs = collect_prepare_inputs(a.inputs, &warnings);
  if (rank == 0)
    for (const std::string& w : warnings) std::fprintf(stderr, "prepare: warning: %s\n", w.c_str());
  const uint64_t total = inputs.back().start + inputs.back().bytes;
  const uint64_t lo = uint64_t((unsigned __int128)total * unsigned(rank) / unsigned(size));
  const uint64_t hi = rank == size - 1
                          ? UINT64_MAX
                          : uint64_t((unsigned __int128)total * unsigned(rank + 1) / unsigned(size));
  std::string early;
  int early_code = kExitBadInput;
  try {
    if (rank == 0) early = check_text_key(inputs, a.text_key, kKeyCheckLines);
  } catch (const UserError& e) {
    early = e.what();
    early_code = e.exit_code;
  }
  agree_or_throw(comm, early, early_code);
  agree_or_throw(comm, rank == 0 ? make_directories(a.out_dir) : "", kExitIO);

  Encoded enc;
  ShareStats stats;
  bool complete = true;
  std::string failure;
  int code = 0;
  PrepareProgress progress(rank == 0, a.log_seconds, std::min(hi, total) - lo, size);
  try {
    DocumentEncoder encoder(tokenizer, a.threads);
    std::vector<std::string> batch;
    size_t batch_bytes = 0;
    complete = read_share(inputs, lo, hi, a.text_key, a.strict, &stats, [&](std::string&& doc) {
      batch_bytes += doc.size() + 64;  // many empty documents are a batch too
      batch.push_back(std::move(doc));
      if (batch_bytes < kBatchBytes) return progress.update(enc, stats, lo, false);
      encode_batch(encoder, tokenizer.bos(), info.eot, batch, &enc);
      batch_bytes = 0;
      progress.update(enc, stats, lo, true);
    });
    encode_batch(encoder, tokenizer.bos(), info.eot, batch, &enc);
    progress.update(enc, stats, lo, true);
  } catch (const UserError& e) {
    failure = e.what();
    code = e.exit_code;
  }
  agree_or_throw(comm, failure, code);
  const double encode_seconds = progress.seconds();
  const std::string malformed = check_lines(comm, a, inputs, stats, complete);
  uint64_t text_bytes = enc.bytes;
  MPI_Allreduce(MPI_IN_PLACE, &text_bytes, 1, MPI_UINT64_T, MPI_SUM, comm);
  int64_t not_utf8 = enc.not_utf8;
  MPI_Allreduce(MPI_IN_PLACE, &not_utf8, 1, MPI_INT64_T, MPI_SUM, comm);
  TokenFileShare split[2];
  split_documents(comm, a.val_every, enc, split);

  const std::string names[2] = {"train.h5", "val.h5"};
  std::string paths[2], tmps[2];
  failure.clear();
  for (int v = 0; v < 2; ++v) {
    paths[v] = (std::filesystem::path(a.out_dir) / names[v]).string();
    tmps[v] = paths[v] + ".tmp";
    const std::string why = write_token_file(comm, tmps[v], info, split[v]);
    if (failure.empty()) failure = why;
  }
  // Rename only when every rank wrote both files: a failed run leaves no file under its name.
  int lowest = failure.empty() ? size : rank;
  MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, comm);
  if (lowest == size && rank == 0)
    for (int v = 0; v < 2 && failure.empty(); ++v)
      if (std::rename(tmps[v].c_str(), paths[v].c_str()) != 0)
        failure = "cannot rename " + tmps[v] + " to " + paths[v] + ": " + std::strerror(errno);
  if (rank == 0 && (lowest != size || !failure.empty()))
    for (int v = 0; v < 2; ++v) unlink(tmps[v].c_str());
  agree_or_throw(comm, failure, kExitIO);

  if (rank == 0) {
    const double s = progress.seconds();
    const int64_t tokens = split[0].num_tokens + split[1].num_tokens;
    std::fprintf(stderr,
                 "prepare: %lld documents, %.1f MB of input (%.1f MB of text), %lld tokens in "
                 "%.2f s (encode %.2f s, write %.2f s) on %d ranks x %d threads: %.1f MB/s, "
                 "%.0f tokens/s%s%s\n",
                 (long long)(split[0].num_documents + split[1].num_documents), double(total) / 1e6,
                 double(text_bytes) / 1e6, (long long)tokens, s, encode_seconds, s - encode_seconds,
                 size, a.threads, double(text_bytes) / 1e6 / s, double(tokens) / s,
                 malformed.c_str(),
                 not_utf8 == 0 ? ""
                               : ("; " + std::to_string(not_utf8) +
                                  " documents not UTF-8 (encoded as bytes: docs/data.md)").c_str());
    for (int v = 0; v < 2; ++v)
      std::fprintf(stderr, "prepare: %s: %lld documents, %lld tokens\n", paths[v].c_str(),
                   (long long)split[v].num_documents, (long long)split[v].num_tokens);
  }
  return 0;
}

}  // namespace tessera
