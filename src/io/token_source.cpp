#include "io/token_source.hpp"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <set>

#include "common/error.hpp"
#include "common/files.hpp"
#include "io/document_index.hpp"

namespace tessera {

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian; tessera decodes them on little-endian hosts only");

namespace {

constexpr int32_t kLlmcMagic = 20240520;
constexpr uint64_t kLlmcHeaderBytes = 256 * 4;
constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr unsigned char kHdf5Signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

std::string num(uint64_t v) { return std::to_string(v); }

bool exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

uint64_t file_size(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0)
    throw UserError("cannot read token file " + path + ": " + std::strerror(errno), kExitIO);
  return uint64_t(st.st_size);
}

// Never blocks: a FIFO or device is refused before it is opened.
int open_read(const std::string& path) { return open_regular_file(path, "token file"); }

// Something is at `path` (a directory, a FIFO, a link loop...), even if not a regular file.
bool present(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 || errno != ENOENT;
}

// Exactly `bytes` at `offset`, or a UserError naming what was short.
void pread_all(int fd, const std::string& path, void* dst, uint64_t bytes, uint64_t offset) {
  auto* p = static_cast<unsigned char*>(dst);
  while (bytes > 0) {
    const ssize_t n = pread(fd, p, bytes, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw UserError(path + ": read failed at byte " + num(offset) + ": " + std::strerror(errno),
                      kExitIO, false);
    if (n == 0)
      throw UserError(path + ": unexpected end of file at byte " + num(offset), kExitBadInput, false);
    p += n;
    bytes -= uint64_t(n);
    offset += uint64_t(n);
  }
}

// The first bytes of a file, for format detection (fewer if the file is shorter).
std::string head(const std::string& path, size_t n) {
  const int fd = open_read(path);
  std::string out(n, '\0');
  const ssize_t got = pread(fd, out.data(), n, 0);
  close(fd);
  out.resize(got > 0 ? size_t(got) : 0);
  return out;
}

bool has_suffix(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string strip(const std::string& s, const std::string& suffix) {
  return s.substr(0, s.size() - suffix.size());
}

// A file or prefix -> the format it holds. Megatron datasets are returned as their prefix.
TokenFormat detect(std::string& path, const std::string& requested) {
  if (requested == "megatron") {
    if (has_suffix(path, ".idx") || has_suffix(path, ".bin")) path = strip(path, ".idx");
    if (has_suffix(path, ".bin")) path = strip(path, ".bin");
    return TokenFormat::megatron;
  }
  if (requested != "auto") require_regular_file(path, "token file");
  if (requested == "hdf5") return TokenFormat::hdf5;
  if (requested == "llmc") return TokenFormat::llmc;
  if (requested == "raw") return TokenFormat::raw;
  // auto: the file's own header says, else a Megatron .idx beside it.
  if (has_suffix(path, ".idx") && exists(strip(path, ".idx") + ".bin")) {
    path = strip(path, ".idx");
    return TokenFormat::megatron;
  }
  if (has_suffix(path, ".bin") && exists(strip(path, ".bin") + ".idx")) {
    path = strip(path, ".bin");
    return TokenFormat::megatron;
  }
  if (!present(path) && exists(path + ".idx") && exists(path + ".bin")) return TokenFormat::megatron;
  if (!present(path))
    throw UserError("cannot read token file " + path + ": no such file (nor a Megatron prefix with " +
                        path + ".idx and " + path + ".bin)",
                    kExitIO);
  require_regular_file(path, "token file");  // a directory, FIFO or link loop, said as such
  const std::string h = head(path, 16);
  if (h.empty()) throw UserError(path + ": empty file, no tokens");
  if (h.size() >= 8 && std::memcmp(h.data(), kHdf5Signature, 8) == 0) return TokenFormat::hdf5;
  int32_t magic = 0;
  if (h.size() >= 4) std::memcpy(&magic, h.data(), 4);
  if (magic == kLlmcMagic) return TokenFormat::llmc;
  if (h.size() >= 9 && std::memcmp(h.data(), kMegatronMagic, 9) == 0)
    throw UserError(path + ": a Megatron .idx file without its .bin (expected " +
                    (has_suffix(path, ".idx") ? strip(path, ".idx") : path) + ".bin)");
  throw UserError(path + ": not a token file tessera recognises: bytes 0-3 are " +
                  std::to_string(magic) + ", which is neither HDF5, nor llm.c's magic " +
                  std::to_string(kLlmcMagic) +
                  ", and there is no Megatron .idx beside it; for headerless tokens set "
                  "data.format: raw and data.dtype");
}

// The files a spec names: a glob's matches (sorted), else the spec itself.
std::vector<std::string> expand(const std::string& spec) {
  if (spec.find_first_of("*?[") == std::string::npos) return {spec};
  glob_t g{};
  const int rc = glob(spec.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  if (out.empty()) throw UserError(spec + ": the glob matches no file");
  std::sort(out.begin(), out.end());
  return out;
}

const char* megatron_dtype_name(int code) {
  switch (code) {
    case 1: return "uint8";
    case 2: return "int8";
    case 3: return "int16";
    case 4: return "int32";
    case 5: return "int64";
    case 6: return "float64";
    case 7: return "float32";
    case 8: return "uint16";
  }
  return "unknown";
}

}  // namespace

const char* format_name(TokenFormat format) {
  switch (format) {
    case TokenFormat::hdf5: return "hdf5";
    case TokenFormat::llmc: return "llmc";
    case TokenFormat::megatron: return "megatron";
    case TokenFormat::raw: return "raw";
  }
  return "?";
}

void decode_tokens(const unsigned char* bytes, int token_bytes, uint64_t count, uint32_t* out) {
  if (token_bytes == 2) {
    for (uint64_t i = 0; i < count; ++i) {
      uint16_t v;
      std::memcpy(&v, bytes + 2 * i, 2);
      out[i] = v;
    }
  } else {
    std::memcpy(out, bytes, count * 4);
  }
}

namespace {

struct Part {  // what one file contributes
  std::vector<TokenExtent> extents;
  int token_bytes = 2;
  int64_t documents = -1;
  TokenizerInfo tokenizer{"none", 0, -1, {}};  // Megatron and raw files record none
};

Part open_llmc(const std::string& path) {
  const uint64_t size = file_size(path);
  if (size == 0) throw UserError(path + ": empty file, no tokens");
  if (size < kLlmcHeaderBytes)
    throw UserError(path + ": truncated llm.c shard: " + num(size) + " bytes, less than the " +
                    num(kLlmcHeaderBytes) + "-byte header");
  int32_t header[256];
  const int fd = open_read(path);
  pread_all(fd, path, header, kLlmcHeaderBytes, 0);
  close(fd);
  if (header[0] != kLlmcMagic)
    throw UserError(path + ": wrong magic " + std::to_string(header[0]) +
                    " at byte 0, llm.c shards start with " + std::to_string(kLlmcMagic));
  if (header[1] != 1 && header[1] != 2)
    throw UserError(path + ": llm.c header version " + std::to_string(header[1]) +
                    " at byte 4; tessera reads version 1 (uint16 tokens) and 2 (uint32)");
  Part p;
  p.token_bytes = header[1] == 1 ? 2 : 4;
  if (header[2] < 0)
    throw UserError(path + ": negative token count " + std::to_string(header[2]) + " at byte 8");
  const uint64_t count = uint64_t(header[2]);
  const uint64_t expected = kLlmcHeaderBytes + count * uint64_t(p.token_bytes);
  if (size < expected)
    throw UserError(path + ": truncated: the header (byte 8) says " + num(count) + " tokens, " +
                    num(expected) + " bytes in all, but the file has " + num(size) + " bytes");
  if (size > expected)
    throw UserError(path + ": the header's token count " + num(count) + " (byte 8) disagrees with " +
                    "the file size: " + num(size) + " bytes hold " +
                    num((size - kLlmcHeaderBytes) / uint64_t(p.token_bytes)) + " tokens");
  if (count == 0) throw UserError(path + ": the header (byte 8) says 0 tokens");
  p.extents.push_back({path, kLlmcHeaderBytes, count, 0});
  // llm.c writes GPT-2 tokens as version 1 and LLaMA-3 tokens as version 2.
  p.tokenizer.type = header[1] == 1 ? "gpt2" : "llama3";
  p.tokenizer.vocab_size = header[1] == 1 ? 50257 : 128256;
  p.tokenizer.eot = header[1] == 1 ? 50256 : 128000;
  return p;
}

Part open_raw(const std::string& path, const std::string& dtype) {
  if (dtype != "uint16" && dtype != "uint32")
    throw UserError(path + ": data.format raw needs data.dtype uint16 or uint32, got '" + dtype + "'");
  const int width = dtype == "uint16" ? 2 : 4;
  const uint64_t size = file_size(path);
  if (size == 0) throw UserError(path + ": empty file, no tokens");
  if (size % uint64_t(width) != 0)
    throw UserError(path + ": " + num(size) + " bytes is not a whole number of " + dtype +
                    " tokens: truncated at byte " + num(size - size % uint64_t(width)));
  Part p;
  p.token_bytes = width;
  p.extents.push_back({path, 0, size / uint64_t(width), 0});
  return p;
}

Part open_megatron(const std::string& prefix) {
  const std::string idx = prefix + ".idx", bin = prefix + ".bin";
  require_regular_file(idx, "Megatron index");
  require_regular_file(bin, "Megatron data");
  const uint64_t idx_size = file_size(idx), bin_size = file_size(bin);
  if (idx_size == 0) throw UserError(idx + ": empty file");
  constexpr uint64_t kHeader = 9 + 8 + 1 + 8 + 8;
  if (idx_size < kHeader)
    throw UserError(idx + ": truncated: " + num(idx_size) + " bytes, less than the " +
                    num(kHeader) + "-byte header");
  unsigned char h[kHeader];
  const int fd = open_read(idx);
  pread_all(fd, idx, h, kHeader, 0);
  if (std::memcmp(h, kMegatronMagic, 9) != 0) {
    close(fd);
    throw UserError(idx + ": wrong magic at byte 0: Megatron .idx files start with MMIDIDX\\0\\0");
  }
  uint64_t version, sequences, documents;
  std::memcpy(&version, h + 9, 8);
  const int dtype = h[17];
  std::memcpy(&sequences, h + 18, 8);
  std::memcpy(&documents, h + 26, 8);
  auto fail = [&](const std::string& message) {
    close(fd);
    throw UserError(message);
  };
  if (version != 1) fail(idx + ": version " + num(version) + " at byte 9; tessera reads version 1");
  if (dtype != 8 && dtype != 4)
    fail(idx + ": dtype code " + std::to_string(dtype) + " (" + megatron_dtype_name(dtype) +
         ") at byte 17; tessera reads uint16 (8) and int32 (4) token ids");
  Part p;
  p.token_bytes = dtype == 8 ? 2 : 4;
  const uint64_t arrays = sequences * 12 + documents * 8;
  if (sequences > idx_size || documents > idx_size || kHeader + arrays > idx_size)
    fail(idx + ": truncated: the header says " + num(sequences) + " sequences and " +
         num(documents) + " document entries, " + num(kHeader + arrays) + " bytes, but the file has " +
         num(idx_size));
  if (sequences == 0) fail(idx + ": the header (byte 18) says 0 sequences");
  // Sizes (int32) and pointers (int64), streamed in chunks: an index may list billions.
  constexpr uint64_t kChunk = 1 << 16;
  std::vector<int32_t> sizes(kChunk);
  std::vector<int64_t> pointers(kChunk);
  uint64_t expected = 0, first_pointer = 0, total = 0;
  for (uint64_t s0 = 0; s0 < sequences; s0 += kChunk) {
    const uint64_t n = std::min(kChunk, sequences - s0);
    pread_all(fd, idx, sizes.data(), n * 4, kHeader + s0 * 4);
    pread_all(fd, idx, pointers.data(), n * 8, kHeader + sequences * 4 + s0 * 8);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t s = s0 + i;
      const std::string where = idx + ": sequence " + num(s);
      if (sizes[i] < 0) fail(where + " has a negative size " + std::to_string(sizes[i]));
      if (pointers[i] < 0) fail(where + " has a negative pointer " + std::to_string(pointers[i]));
      const uint64_t ptr = uint64_t(pointers[i]), len = uint64_t(sizes[i]) * uint64_t(p.token_bytes);
      if (ptr > bin_size || len > bin_size - ptr)
        fail(where + " (pointer " + num(ptr) + ", " + std::to_string(sizes[i]) +
             " tokens) runs past the end of " + bin + " (" + num(bin_size) + " bytes)");
      if (s == 0) expected = first_pointer = ptr;
      if (ptr != expected)
        fail(where + " has pointer " + num(ptr) + ", expected " + num(expected) +
             ": tessera reads sequences stored back to back, as Megatron's builder writes them");
      expected = ptr + len;
      total += uint64_t(sizes[i]);
    }
  }
  close(fd);
  if (total == 0) throw UserError(idx + ": every sequence is empty, no tokens");
  p.extents.push_back({bin, first_pointer, total, 0});
  p.documents = documents > 0 ? int64_t(documents) - 1 : 0;  // document_index starts with a 0
  return p;
}

}  // namespace

TokenSource::TokenSource(const std::string& spec, const std::string& format,
                         const std::string& dtype)
    : spec_(spec) {
  if (format != "auto" && format != "hdf5" && format != "llmc" && format != "megatron" &&
      format != "raw")
    throw UserError(spec + ": unknown data format '" + format +
                    "' (auto, hdf5, llmc, megatron or raw)");
  std::vector<std::string> paths = expand(spec);
  // A glob over a Megatron directory matches both halves of each dataset: take each prefix once.
  std::vector<std::pair<std::string, TokenFormat>> found;
  std::set<std::string> seen;
  for (std::string path : paths) {
    const TokenFormat f = detect(path, format);
    if (seen.insert(path).second) found.emplace_back(path, f);
  }
  format_ = found.front().second;
  uint64_t total = 0;
  for (auto& [path, f] : found) {
    if (f != format_)
      throw UserError(spec + ": mixes formats: " + found.front().first + " is " +
                      format_name(format_) + ", " + path + " is " + format_name(f));
    Part part;
    if (f == TokenFormat::hdf5) {
      auto file = std::make_unique<TokenFile>(path);
      part.token_bytes = file->token_bytes();
      part.tokenizer = file->tokenizer();
      part.documents = file->num_documents();
      if (file->num_tokens() == 0) throw UserError(path + ": /tokens is empty");
      if (file->contiguous_offset() >= 0) {
        part.extents.push_back({path, uint64_t(file->contiguous_offset()), file->num_tokens(), 0});
      } else if (found.size() == 1) {
        hdf5_ = std::move(file);  // read through HDF5, on the main thread
        num_tokens_ = hdf5_->num_tokens();
      } else {
        throw UserError(path + ": /tokens is chunked or filtered; a glob of HDF5 files needs "
                        "contiguous datasets (tools/data/prepare_data.py writes them; or h5repack -l CONTI)");
      }
    } else if (f == TokenFormat::llmc) {
      part = open_llmc(path);
    } else if (f == TokenFormat::megatron) {
      part = open_megatron(path);
    } else {
      part = open_raw(path, dtype.empty() ? "uint16" : dtype);
    }
    if (files_.empty()) {
      token_bytes_ = part.token_bytes;
      tokenizer_ = part.tokenizer;
    } else if (part.token_bytes != token_bytes_) {
      throw UserError(spec + ": mixes token widths: " + files_.front() + " holds " +
                      std::to_string(8 * token_bytes_) + "-bit tokens, " + path + " " +
                      std::to_string(8 * part.token_bytes) + "-bit");
    } else if (!same_tokenizer(part.tokenizer, tokenizer_)) {
      throw UserError(spec + ": mixes tokenizers: " + files_.front() + " (" + tokenizer_.type +
                      ", vocab " + std::to_string(tokenizer_.vocab_size) + ") and " + path + " (" +
                      part.tokenizer.type + ", vocab " + std::to_string(part.tokenizer.vocab_size) +
                      ")");
    }
    files_.push_back(f == TokenFormat::megatron ? path + ".idx" : path);
    if (part.documents >= 0) documents_ = std::max<int64_t>(documents_, 0) + part.documents;
    for (TokenExtent e : part.extents) {
      e.first_token = total;
      total += e.tokens;
      extents_.push_back(e);
    }
  }
  if (!hdf5_) num_tokens_ = total;
  for (const TokenExtent& e : extents_) fds_.push_back(open_read(e.file));
}

void TokenSource::use_document_windows(int seq_len) {
  if (format_ != TokenFormat::hdf5)
    throw UserError(spec_ + ": data.windows: documents reads the document index of tessera's HDF5 "
                    "token files; this source is " + format_name(format_) +
                    " (tessera data prepare makes a token file of it)");
  std::vector<uint64_t> starts;
  uint64_t base = 0;
  for (size_t f = 0; f < files_.size(); ++f) {
    // A glob's files follow each other, each one contiguous extent (a chunked file is alone).
    const uint64_t tokens = hdf5_ ? num_tokens_ : extents_[f].tokens;
    const int64_t documents = hdf5_ ? hdf5_->num_documents() : -1;
    const std::vector<uint64_t> offsets = read_document_offsets(files_[f], tokens, documents);
    for (size_t d = 0; d + 1 < offsets.size(); ++d)
      if (offsets[d] < offsets[d + 1] && base + offsets[d] + uint64_t(seq_len) < num_tokens_)
        starts.push_back(base + offsets[d]);
    base += tokens;
  }
  if (starts.empty())
    throw UserError(spec_ + ": data.windows: documents: no document starts a window of data.seq_len "
                    "+ 1 = " + std::to_string(seq_len + 1) + " tokens");
  window_starts_ = std::move(starts);
  document_windows_ = true;
}

TokenSource::TokenSource(TokenSource&&) noexcept = default;

TokenSource::~TokenSource() {
  for (int fd : fds_) close(fd);
}

void TokenSource::read(uint64_t first, uint64_t count, uint32_t* out) const {
  if (first + count > num_tokens_)
    throw UserError(spec_ + ": tokens " + num(first) + ".." + num(first + count) +
                        " run past the end (" + num(num_tokens_) + " tokens)",
                    kExitBadInput, false);
  if (hdf5_) {
    hdf5_->read(first, count, out);
    return;
  }
  std::vector<unsigned char> bytes;
  for_each_piece(first, count, [&](const TokenExtent& x, uint64_t offset, uint64_t n) {
    bytes.resize(n * uint64_t(token_bytes_));
    pread_all(fds_[size_t(&x - extents_.data())], x.file, bytes.data(), bytes.size(), offset);
    decode_tokens(bytes.data(), token_bytes_, n, out);
    out += n;
  });
}

void TokenSource::check_ids(const uint32_t* ids, uint64_t count, uint64_t first, int vocab,
                            bool every_rank) const {
  for (uint64_t i = 0; i < count; ++i)
    if (ids[i] >= uint32_t(vocab))
      throw UserError(spec_ + ": token " + num(first + i) + " (" + locate(first + i) + ") has id " +
                          std::to_string(ids[i]) + ", not below the model's vocab_size " +
                          std::to_string(vocab),
                      kExitBadInput, every_rank);
}

void TokenSource::to_sample(const uint32_t* window, uint64_t first, int T, int vocab,
                            int32_t* inputs, int32_t* targets) const {
  check_ids(window, uint64_t(T) + 1, first, vocab, false);
  for (int t = 0; t < T; ++t) {
    inputs[t] = int32_t(window[t]);
    targets[t] = int32_t(window[t + 1]);
  }
}

std::string TokenSource::locate(uint64_t token) const {
  if (hdf5_) return hdf5_->path() + " /tokens[" + num(token) + "]";
  for (const TokenExtent& x : extents_)
    if (token < x.first_token + x.tokens)
      return x.file + " at byte " + num(x.offset + (token - x.first_token) * uint64_t(token_bytes_));
  return spec_;
}

}  // namespace tessera
