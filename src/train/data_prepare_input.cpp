#include "train/data_prepare_input.hpp"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "common/error.hpp"
#include "common/limits.hpp"
#include "io/json.hpp"

namespace tessera {

namespace fs = std::filesystem;

namespace {

// Compressed input is fed to its decoder in blocks of this size: the unit of the positions that
// split a compressed file between ranks (finer splits cost more decoder calls).
constexpr size_t kInputBlock = 64 << 10;
constexpr size_t kOutputBlock = 1 << 20;
constexpr size_t kReportedLines = 5;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

PrepareInput describe(const std::string& path) {
  PrepareInput in;
  in.path = path;
  std::string base = path;
  if (ends_with(base, ".gz")) in.codec = PrepareInput::Codec::kGzip, base.resize(base.size() - 3);
  else if (ends_with(base, ".zst")) in.codec = PrepareInput::Codec::kZstd, base.resize(base.size() - 4);
  if (ends_with(base, ".parquet"))
    throw UserError(path + ": Parquet is not read here (no C++ Parquet reader in Debian 12): convert "
                    "it to JSON Lines first, e.g. python3 -c \"import pandas as p; "
                    "p.read_parquet('IN.parquet').to_json('OUT.jsonl', orient='records', lines=True)\"");
  in.json_lines = ends_with(base, ".jsonl") || ends_with(base, ".json");
  return in;
}

// Files a directory contributes: JSON Lines and text, plain or compressed (and Parquet, to
// refuse it by name).
bool taken_from_directory(const std::string& name) {
  std::string base = name;
  if (ends_with(base, ".gz")) base.resize(base.size() - 3);
  else if (ends_with(base, ".zst")) base.resize(base.size() - 4);
  for (const char* s : {".jsonl", ".json", ".txt", ".md", ".rst", ".py", ".parquet"})
    if (ends_with(base, s)) return true;
  return false;
}

void add_directory(const std::string& dir, std::vector<std::string>* out) {
  std::error_code error;
  fs::recursive_directory_iterator it(dir, fs::directory_options::none, error), end;
  for (; !error && it != end; it.increment(error))
    if (it->is_regular_file() && taken_from_directory(it->path().filename().string()))
      out->push_back(it->path().string());
  if (error)
    throw UserError(dir + ": cannot list the directory: " + error.message(), kExitIO);
}

}  // namespace

std::vector<PrepareInput> collect_prepare_inputs(const std::vector<std::string>& args,
                                                 std::vector<std::string>* warnings) {
  std::vector<std::string> paths;
  for (const std::string& arg : args) {
    struct stat st {};
    if (stat(arg.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) add_directory(arg, &paths);
      else if (S_ISREG(st.st_mode)) paths.push_back(arg);
      else throw UserError(arg + ": not a regular file or directory");
      continue;
    }
    if (arg.find_first_of("*?[") == std::string::npos)
      throw UserError(arg + ": no such file or directory");
    glob_t g{};
    const int rc = glob(arg.c_str(), 0, nullptr, &g);
    std::vector<std::string> matches(g.gl_pathv, g.gl_pathv + (rc == 0 ? g.gl_pathc : 0));
    globfree(&g);
    if (matches.empty()) throw UserError(arg + ": the pattern matches nothing");
    for (const std::string& m : matches) {
      if (fs::is_directory(m)) add_directory(m, &paths);
      else if (fs::is_regular_file(m)) paths.push_back(m);
    }
  }
  // Sorted and de-duplicated by absolute path, as tools/data/prepare_data.py does (symbolic
  // links not followed), so both take the same documents in the same order.
  std::vector<std::pair<std::string, std::string>> keyed;  // (absolute, as given)
  for (const std::string& p : paths)
    keyed.emplace_back(fs::absolute(p).lexically_normal().string(), p);
  std::sort(keyed.begin(), keyed.end());
  std::vector<PrepareInput> inputs;
  std::vector<std::pair<std::pair<dev_t, ino_t>, std::string>> seen;
  uint64_t at = 0;
  for (size_t i = 0; i < keyed.size(); ++i) {
    if (i > 0 && keyed[i].first == keyed[i - 1].first) {
      warnings->push_back(keyed[i].second + " is given more than once: read once");
      continue;
    }
    PrepareInput in = describe(keyed[i].first);
    struct stat st {};
    if (stat(in.path.c_str(), &st) != 0)
      throw UserError(in.path + ": cannot stat: " + std::strerror(errno), kExitIO);
    for (const auto& [id, path] : seen)
      if (id == std::make_pair(st.st_dev, st.st_ino))
        warnings->push_back(in.path + " is the same file as " + path + " (a link): read twice");
    seen.emplace_back(std::make_pair(st.st_dev, st.st_ino), in.path);
    in.bytes = uint64_t(st.st_size);
    in.start = at;
    at += in.bytes;
    inputs.push_back(std::move(in));
  }
  if (inputs.empty()) throw UserError("no input files found (directories are searched for .jsonl, "
                                      ".json, .txt, .md, .rst, .py, plain, .gz or .zst)");
  return inputs;
}

namespace {

// A file's bytes, decompressed if it is compressed, in pieces.
class ByteSource {
 public:
  ByteSource(const PrepareInput& in, uint64_t offset) : file_(in) {
    fd_ = open(in.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw UserError(in.path + ": cannot open: " + std::strerror(errno), kExitIO);
    if (offset > 0 && lseek(fd_, off_t(offset), SEEK_SET) < 0)
      throw UserError(in.path + ": cannot seek: " + std::strerror(errno), kExitIO);
    fed_ = offset;
    if (in.codec == PrepareInput::Codec::kGzip) {
      zs_ = std::make_unique<z_stream>();
      std::memset(zs_.get(), 0, sizeof(z_stream));
      if (inflateInit2(zs_.get(), 15 + 32) != Z_OK) throw UserError(in.path + ": zlib init failed", kExitIO);
    } else if (in.codec == PrepareInput::Codec::kZstd) {
      zd_ = ZSTD_createDStream();
      if (zd_ == nullptr) throw UserError(in.path + ": zstd init failed", kExitIO);
    }
  }
  ~ByteSource() {
    if (zs_) inflateEnd(zs_.get());
    if (zd_) ZSTD_freeDStream(zd_);
    if (fd_ >= 0) close(fd_);
  }
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  // Plain: positions are exact byte offsets; compressed: every byte of a piece has the position
  // of the piece (the compressed bytes fed so far, less one).
  bool exact() const { return file_.codec == PrepareInput::Codec::kPlain; }

  // The next piece (empty at the end) and, through *position, the position of its first byte.
  std::string_view next(uint64_t* position) {
    if (exact()) {
      *position = fed_;
      const size_t n = read_block(out_, kOutputBlock);
      fed_ += n;
      return {out_.data(), n};
    }
    for (;;) {
      if (in_pos_ == in_.size() && !eof_) {
        in_.resize(read_block(in_, kInputBlock));
        in_pos_ = 0;
        fed_ += in_.size();
        eof_ = in_.empty();
      }
      if (eof_ && in_pos_ == in_.size()) {
        if (!ended_) throw UserError(file_.path + ": the " + codec_name() + " stream is truncated");
        return {};
      }
      *position = fed_ - 1;
      const size_t n = decode();
      if (n > 0) return {out_.data(), n};
    }
  }

 private:
  std::string codec_name() const { return file_.codec == PrepareInput::Codec::kGzip ? "gzip" : "zstd"; }

  size_t read_block(std::string& buffer, size_t n) {
    buffer.resize(n);
    size_t got = 0;
    while (got < n) {
      const ssize_t r = read(fd_, buffer.data() + got, n - got);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw UserError(file_.path + ": cannot read: " + std::strerror(errno), kExitIO);
      if (r == 0) break;
      got += size_t(r);
    }
    return got;
  }

  // Decodes from in_[in_pos_..] into out_; the bytes made (0: more input needed).
  size_t decode() {
    out_.resize(kOutputBlock);
    if (zs_) {
      if (ended_) {  // another gzip member follows the one that ended
        if (inflateReset(zs_.get()) != Z_OK) throw UserError(file_.path + ": zlib reset failed", kExitIO);
        ended_ = false;
      }
      zs_->next_in = reinterpret_cast<Bytef*>(in_.data() + in_pos_);
      zs_->avail_in = uInt(in_.size() - in_pos_);
      zs_->next_out = reinterpret_cast<Bytef*>(out_.data());
      zs_->avail_out = uInt(out_.size());
      const int rc = inflate(zs_.get(), Z_NO_FLUSH);
      if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR)
        throw UserError(file_.path + ": not a valid gzip stream (" +
                        (zs_->msg ? zs_->msg : "zlib error " + std::to_string(rc)) + ")");
      in_pos_ = in_.size() - zs_->avail_in;
      ended_ = rc == Z_STREAM_END;
      return out_.size() - zs_->avail_out;
    }
    ZSTD_inBuffer in{in_.data(), in_.size(), in_pos_};
    ZSTD_outBuffer out{out_.data(), out_.size(), 0};
    const size_t rc = ZSTD_decompressStream(zd_, &out, &in);
    if (ZSTD_isError(rc))
      throw UserError(file_.path + ": not a valid zstd stream (" + ZSTD_getErrorName(rc) + ")");
    in_pos_ = in.pos;
    ended_ = rc == 0;
    return out.pos;
  }

  const PrepareInput& file_;
  int fd_ = -1;
  uint64_t fed_ = 0;
  std::string in_, out_;
  size_t in_pos_ = 0;
  bool eof_ = false, ended_ = false;
  std::unique_ptr<z_stream> zs_;
  ZSTD_DStream* zd_ = nullptr;
};

}  // namespace

namespace {

// One JSON line: a document (on_document) or a malformed line (counted, the first few kept).
// Returns false for a malformed one.
bool take_line(std::string& line, size_t file, int64_t index, const std::string& key,
               ShareStats* stats, const std::function<void(std::string&&)>& on_document) {
  if (std::all_of(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; }))
    return true;  // blank lines separate nothing and are no document
  ++stats->json_lines;
  std::string why;
  try {
    Json j = Json::parse(line);
    if (!j.is_object()) {
      why = std::string("not a JSON object (") + json_kind(j) + ")";
    } else if (auto it = j.find(key); it == j.end()) {
      why = "no \"" + key + "\" member";
    } else if (++stats->with_key, !it->is_string()) {
      why = "\"" + key + "\" is " + json_kind(*it) + ", not a string";
    } else {
      on_document(std::move(it->get_ref<std::string&>()));
      return true;
    }
  } catch (const Json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 5: ..." without the tag.
    const std::string what = e.what();
    const size_t tag = what.find("] ");
    why = "not JSON: " + (tag == std::string::npos ? what : what.substr(tag + 2));
  }
  ++stats->malformed;
  if (stats->first.size() < kReportedLines) stats->first.push_back({file, index, why});
  return false;
}

// The JSON lines of inputs[f] whose positions fall in [lo, hi). False when --strict stopped it.
bool read_lines(const PrepareInput& in, size_t f, uint64_t lo, uint64_t hi, const std::string& key,
                bool strict, ShareStats* stats, const std::function<void(std::string&&)>& on_document) {
  // A plain file is entered at the byte before the range, and the rest of the line there (owned
  // by the rank before) skipped; a compressed one is decoded from its start.
  const bool plain = in.codec == PrepareInput::Codec::kPlain;
  const uint64_t skip_to = lo > in.start ? lo - in.start : 0;
  ByteSource source(in, plain && skip_to > 0 ? skip_to - 1 : 0);
  bool skipping = plain && skip_to > 0, at_start = !skipping, owned = false;
  std::string line;
  int64_t& index = stats->lines[f];
  for (;;) {
    uint64_t position = 0;
    const std::string_view piece = source.next(&position);
    if (piece.empty()) break;
    size_t i = 0;
    while (i < piece.size()) {
      if (skipping) {
        const size_t nl = piece.find('\n', i);
        if (nl == std::string_view::npos) break;
        i = nl + 1;
        skipping = false;
        at_start = true;
        continue;
      }
      if (at_start) {
        const uint64_t p = in.start + (source.exact() ? position + i : position);
        stats->position = p;
        if (p >= hi) return true;
        owned = p >= lo;
        at_start = false;
      }
      const size_t nl = piece.find('\n', i);
      const size_t end = nl == std::string_view::npos ? piece.size() : nl;
      if (owned) {
        if (line.size() + (end - i) > size_t(limits::kTokenizerModelBytes))
          throw UserError(in.path + ": a line of more than 1 GiB");
        line.append(piece.data() + i, end - i);
      }
      if (nl == std::string_view::npos) break;
      if (owned) {
        if (!take_line(line, f, index, key, stats, on_document) && strict) return false;
        ++index;
        if (stats->json_lines >= stats->line_limit) return true;
      }
      line.clear();
      at_start = true;
      i = nl + 1;
    }
  }
  if (owned && !at_start) {
    if (!take_line(line, f, index, key, stats, on_document) && strict) return false;
    ++index;
  }
  return true;
}

std::string whole_file(const PrepareInput& in) {
  ByteSource source(in, 0);
  std::string text;
  uint64_t position = 0;
  for (std::string_view piece; !(piece = source.next(&position)).empty();) {
    if (text.size() + piece.size() > size_t(limits::kTokenizerModelBytes))
      throw UserError(in.path + ": a document of more than 1 GiB (split it, or make it JSON Lines)");
    text.append(piece);
  }
  return text;
}

}  // namespace

bool read_share(const std::vector<PrepareInput>& inputs, uint64_t lo, uint64_t hi,
                const std::string& text_key, bool strict, ShareStats* stats,
                const std::function<void(std::string&&)>& on_document) {
  stats->lines.assign(inputs.size(), 0);
  for (size_t f = 0; f < inputs.size(); ++f) {
    const PrepareInput& in = inputs[f];
    if (!in.json_lines) {
      if (in.start >= lo && in.start < hi) {
        on_document(whole_file(in));
        stats->position = in.start + in.bytes;
      }
      continue;
    }
    if (in.bytes == 0 || in.start + in.bytes <= lo || in.start >= hi) continue;
    if (!read_lines(in, f, lo, hi, text_key, strict, stats, on_document)) return false;
  }
  return true;
}

std::string check_text_key(const std::vector<PrepareInput>& inputs, const std::string& text_key,
                           int64_t lines) {
  for (size_t f = 0; f < inputs.size(); ++f) {
    const PrepareInput& in = inputs[f];
    if (!in.json_lines || in.bytes == 0) continue;
    ShareStats stats;
    stats.lines.assign(inputs.size(), 0);
    stats.line_limit = lines;
    read_lines(in, f, in.start, in.start + in.bytes, text_key, false, &stats, [](std::string&&) {});
    if (stats.json_lines == 0) continue;  // only blank lines: the next file tells
    if (stats.with_key > 0) return "";
    const MalformedLine& m = stats.first.front();
    return "--text-key " + text_key + ": none of the first " + std::to_string(stats.json_lines) +
           " JSON lines of " + in.path + " has a \"" + text_key + "\" member (e.g. " + in.path +
           ":" + std::to_string(m.line + 1) + ": " + m.why + "): name the key holding the text";
  }
  return "";
}

}  // namespace tessera
