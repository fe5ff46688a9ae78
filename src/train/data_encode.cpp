// `tessera data encode|decode`: text <-> ids with a tokenizer, for people (one text, one line of
// ids) and for tools/data/prepare_data.py (--stream: every document of a corpus, on every core).
#include <omp.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>

#include "common/cli.hpp"
#include "common/error.hpp"
#include "common/files.hpp"
#include "common/limits.hpp"
#include "io/json.hpp"
#include "io/token_file.hpp"
#include "io/tokenizer.hpp"
#include "io/tokenizer_bpe.hpp"
#include "train/data_command.hpp"
#include "train/data_encode.hpp"

namespace tessera {

namespace {

constexpr size_t kBatchBytes = 16 << 20;  // documents read before they are encoded together
constexpr size_t kChunkBytes = 64 << 10;  // a longer document is encoded in parts of about this

// Where text may be cut without changing its ids: after a newline that ends a line of visible
// text and comes before visible ASCII. Neither GPT-2's nor LLaMA 3's pattern (nor a
// sentencepiece piece) matches across such a point.
std::vector<std::string_view> chunks(std::string_view text) {
  std::vector<std::string_view> out;
  auto visible = [](char c) { return c > ' ' && c < 0x7F; };
  size_t at = 0;
  while (text.size() - at > kChunkBytes) {
    size_t cut = std::string_view::npos;
    for (size_t i = at + kChunkBytes; i + 1 < text.size(); ++i)
      if (text[i] == '\n' && visible(text[i - 1]) && visible(text[i + 1])) {
        cut = i + 1;
        break;
      }
    if (cut == std::string_view::npos) break;
    out.push_back(text.substr(at, cut - at));
    at = cut;
  }
  out.push_back(text.substr(at));
  return out;
}

bool read_exact(void* data, size_t n) {
  return n == 0 || std::fread(data, 1, n, stdin) == n;
}

void write_exact(const void* data, size_t n) {
  if (n > 0 && std::fwrite(data, 1, n, stdout) != n)
    throw UserError("tessera data encode: cannot write the ids to standard output: " +
                        std::string(std::strerror(errno)),
                    kExitIO);
}

// Documents on stdin (a little-endian uint64 byte count, then the bytes), their ids on stdout
// (a uint64 count, then uint32 ids), in order; with verify, decode(encode(doc)) == doc checked.
int stream(const Tokenizer& tokenizer, int threads, bool verify) {
  DocumentEncoder encoder(tokenizer, threads);
  uint64_t document = 0, total_bytes = 0, total_ids = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (bool more = true; more;) {
    std::vector<std::string> docs;
    size_t bytes = 0;
    while (bytes < kBatchBytes) {
      uint64_t n = 0;
      if (std::fread(&n, 1, 8, stdin) != 8) {
        more = false;
        break;
      }
      if (n > uint64_t(limits::kTokenizerModelBytes))
        throw UserError("tessera data encode --stream: document " + std::to_string(document + docs.size()) +
                        " declares " + std::to_string(n) + " bytes (at most 1 GiB a document)");
      docs.emplace_back(size_t(n), '\0');
      if (!read_exact(docs.back().data(), size_t(n)))
        throw UserError("tessera data encode --stream: standard input ended inside document " +
                        std::to_string(document + docs.size() - 1));
      bytes += size_t(n);
    }
    const std::vector<std::vector<int32_t>> ids =
        encoder.encode(std::vector<std::string_view>(docs.begin(), docs.end()));
    for (size_t d = 0; d < docs.size(); ++d, ++document) {
      const std::vector<int32_t>& all = ids[d];
      if (verify && tokenizer.decode(all) != docs[d])
        throw UserError("tessera data encode --verify: document " + std::to_string(document) +
                        " does not decode back to its text");
      const uint64_t n = all.size();
      write_exact(&n, 8);
      write_exact(all.data(), all.size() * sizeof(int32_t));
      total_ids += n;
      total_bytes += docs[d].size();
    }
    std::fflush(stdout);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr,
               "encode: %llu documents, %.1f MB, %llu tokens in %.2f s on %d threads (%.1f MB/s, "
               "%.0f tokens/s)%s\n",
               (unsigned long long)document, double(total_bytes) / 1e6,
               (unsigned long long)total_ids, s, threads, double(total_bytes) / 1e6 / s,
               double(total_ids) / s, verify ? "; every document decodes to its text" : "");
  return 0;
}

}  // namespace

TokenizerInfo tokenizer_of(const std::string& path) {
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    TokenizerInfo info;
    info.type = "hf-bpe";
    std::error_code error;
    const uintmax_t bytes = std::filesystem::file_size(path, error);  // read_regular_file says why not
    if (!error)
      check_json_bytes(int64_t(bytes), path, "tokenizer.json", limits::kTokenizerJsonBytes,
                       limits::kTokenizerJsonBytesWhy);
    info.model = read_regular_file(path, "tokenizer.json", size_t(limits::kTokenizerJsonBytes));
    const ByteLevelBpe bpe(info.model, path);
    info.vocab_size = bpe.vocab_size();
    info.eot = bpe.eos();
    return info;
  }
  return TokenFile(path).tokenizer();
}

DocumentEncoder::DocumentEncoder(const Tokenizer& tokenizer, int threads)
    : tokenizer_(tokenizer), threads_(threads) {
  if (const ByteLevelBpe* bpe = tokenizer.byte_level_bpe())
    for (int t = 0; t < threads; ++t) scratch_.push_back(bpe->make_scratch());
}

std::vector<std::vector<int32_t>> DocumentEncoder::encode(const std::vector<std::string_view>& docs) {
  const ByteLevelBpe* bpe = tokenizer_.byte_level_bpe();
  std::vector<std::pair<size_t, std::string_view>> parts;  // (document, part)
  for (size_t d = 0; d < docs.size(); ++d)
    for (std::string_view c : chunks(docs[d])) parts.emplace_back(d, c);
  std::vector<std::vector<int32_t>> ids(parts.size());
  std::string error;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_)
  for (size_t p = 0; p < parts.size(); ++p) {
    try {
      if (bpe) bpe->encode(parts[p].second, *scratch_[size_t(omp_get_thread_num())], &ids[p]);
      else ids[p] = tokenizer_.encode(std::string(parts[p].second));
    } catch (const UserError& e) {
#pragma omp critical
      error = e.what();
    }
  }
  if (!error.empty()) throw UserError(error);
  std::vector<std::vector<int32_t>> out(docs.size());
  for (size_t p = 0; p < parts.size(); ++p) {
    std::vector<int32_t>& all = out[parts[p].first];
    if (all.empty()) all = std::move(ids[p]);
    else all.insert(all.end(), ids[p].begin(), ids[p].end());
  }
  return out;
}

int data_encode(const std::string& verb, const std::vector<std::string>& args) {
  std::string path, text, ids_text;
  bool has_text = false, has_ids = false, streaming = false, verify = false;
  int threads = omp_get_max_threads();
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& s = args[i];
    if (s == "--stream" && verb == "encode") streaming = true;
    else if (s == "--verify" && verb == "encode") verify = true;
    else if ((s == "--text" && verb == "encode") || (s == "--ids" && verb == "decode") ||
             s == "--threads") {
      if (i + 1 >= args.size()) throw UserError("tessera data " + verb + ": " + s + " needs a value");
      const std::string& v = args[++i];
      if (s == "--text") text = v, has_text = true;
      else if (s == "--ids") ids_text = v, has_ids = true;
      else threads = int(parse_int(s, v, 1, 1024));
    } else if (s.rfind("--", 0) == 0) {
      throw UserError("tessera data " + verb + ": unknown option " + s + " (see tessera data --help)");
    } else if (path.empty()) {
      path = s;
    } else {
      throw UserError("tessera data " + verb + ": one TOKENIZER (a token file or tokenizer.json), "
                      "got '" + path + "' and '" + s + "'");
    }
  }
  if (path.empty()) throw UserError("tessera data " + verb + ": no TOKENIZER given");
  const Tokenizer tokenizer(tokenizer_of(path), path);
  if (verb == "decode") {
    if (!has_ids) throw UserError("tessera data decode: --ids \"ID ID ...\" is required");
    std::vector<int32_t> ids;
    std::istringstream in(ids_text);
    std::string word;
    while (in >> word)
      ids.push_back(int32_t(parse_int("--ids", word, 0, tokenizer.info().vocab_size - 1)));
    const std::string out = tokenizer.decode(ids);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
  }
  if (streaming == has_text)
    throw UserError("tessera data encode: give --text TEXT or --stream (one of them)");
  if (streaming) return stream(tokenizer, threads, verify);
  const std::vector<int32_t> ids = tokenizer.encode(text);
  for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
  std::printf("\n");
  return 0;
}

}  // namespace tessera
