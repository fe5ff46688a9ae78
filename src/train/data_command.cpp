#include "train/data_command.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "common/cli.hpp"
#include "common/error.hpp"
#include "common/limits.hpp"
#include "common/memory.hpp"
#include "io/dataset.hpp"
#include "io/gds_reader.hpp"
#include "io/prefetch.hpp"

namespace tessera {

const char* const kDataUsage = R"(usage:
  tessera data info FILE... [--format F] [--dtype D]
  tessera data dump FILE --start S --count N [--format F] [--dtype D]
  tessera data bench FILE [--seq-len T] [--batch B] [--seconds S] [--prefetch D] [--readers R]
                    [--gds] [--format F] [--dtype D]
  tessera data encode TOKENIZER --text TEXT | --stream [--verify] [--threads N]
  tessera data decode TOKENIZER --ids "ID ID ..."
  [mpiexec -n P] tessera data prepare INPUTS... --out-dir DIR [--tokenizer byte|TOKENIZER]
                    [--text-key text] [--val-every 20] [--threads N] [--strict] [--log-seconds 2]

FILE is anything data.train takes: an HDF5 token file, an llm.c .bin shard or a glob of them
(quote it), a Megatron dataset (PREFIX, PREFIX.idx or PREFIX.bin), or a raw headerless file with
--format raw --dtype uint16|uint32. --format defaults to auto (the file's header decides).

info   format, token width, token count, documents, files and the tokenizer the data records
dump   token ids S .. S+N-1 of the stream, space-separated on one line
bench  reads the whole file sequentially with O_DIRECT and with the page cache dropped (the
       disk's limit), then runs the training loader (random windows of T+1 tokens, B per step,
       D steps ahead (8), R reader threads (4), O_DIRECT) for S seconds (default 5), and prints
       MB/s of each; --gds also reads the windows with cuFile into GPU memory (GPUDirect
       Storage: only in a build that found cufile.h and libcufile)
encode the ids of TEXT with the tokenizer of TOKENIZER (an HDF5 token file, or a Hugging Face
       byte-level BPE tokenizer.json), space-separated on one line, no eot or bos; --stream reads
       documents from standard input (each a little-endian uint64 byte count, then its bytes) and
       writes their ids (a uint64 count, then uint32 ids) on N threads (default: every core), as
       tools/data/prepare_data.py runs it, with a summary line (MB/s, tokens/s) on standard error;
       --verify also checks that every document decodes back to its bytes
decode the text of the ids (special tokens decode to nothing)
prepare  DIR/train.h5 and DIR/val.h5 from INPUTS (files, directories, quoted globs): JSON Lines
       (.jsonl, .json; plain, .gz or .zst), a document per line, its text under --text-key;
       any other file (.txt, .md, ...) is one document. Document i (in path and line order) goes
       to val.h5 when i % val_every == val_every - 1. Every rank reads its share of the input
       bytes and encodes it on N threads (default: every core) with the tokenizer (byte, a
       token file's, or a tokenizer.json), and all write one file together (MPI-IO): /tokens,
       /document_offsets (where each document starts; the token count last) and the attributes
       of tools/data/prepare_data.py's files, the same whatever P and N. Malformed lines are
       counted and the first few named (--strict: stop at the first); Parquet is refused (convert
       it to JSON Lines). Progress every S seconds (0: every batch) on standard error
)";

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Args {
  std::vector<std::string> files;
  std::string format = "auto", dtype = "uint16";
  int64_t start = -1, count = -1, seq_len = 1024, batch = 8, depth = 8, readers = 4;
  double seconds = 5;
  bool gds = false;
};

const char* const kValueFlags[] = {"--format", "--dtype", "--start", "--count", "--seq-len",
                                   "--batch", "--prefetch", "--readers", "--seconds"};

Args parse(const std::string& verb, const std::vector<std::string>& args) {
  Args a;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& s = args[i];
    if (s.rfind("--", 0) != 0) {
      a.files.push_back(s);
      continue;
    }
    if (s == "--gds") {
      a.gds = true;
      continue;
    }
    if (std::find(std::begin(kValueFlags), std::end(kValueFlags), s) == std::end(kValueFlags))
      throw UserError("tessera data " + verb + ": unknown option " + s + " (see tessera data --help)");
    if (i + 1 >= args.size()) throw UserError("tessera data " + verb + ": " + s + " needs a value");
    const std::string& v = args[++i];
    if (s == "--format") a.format = v;
    else if (s == "--dtype") a.dtype = v;
    else if (s == "--start") a.start = parse_int(s, v, 0, INT64_MAX);
    else if (s == "--count") a.count = parse_int(s, v, 1, INT64_MAX);
    else if (s == "--seq-len") a.seq_len = parse_int(s, v, 1, limits::kBlock);
    else if (s == "--batch") a.batch = parse_int(s, v, 1, limits::kStepTokens);
    else if (s == "--prefetch") a.depth = parse_int(s, v, 1, limits::kPrefetch);
    else if (s == "--readers") a.readers = parse_int(s, v, 1, limits::kReaders);
    else a.seconds = double(parse_int(s, v, 1, 86400));
  }
  if (a.files.empty()) throw UserError("tessera data " + verb + ": no FILE given");
  if (a.batch * (a.seq_len + 1) > limits::kStepTokens)
    throw UserError("tessera data " + verb + ": --batch " + std::to_string(a.batch) +
                    " windows of --seq-len + 1 = " + std::to_string(a.seq_len + 1) +
                    " tokens are more than " + std::to_string(limits::kStepTokens) +
                    " tokens per step (" + limits::kStepTokensWhy + ")");
  if (a.dtype != "uint16" && a.dtype != "uint32")
    throw UserError("tessera data: --dtype must be uint16 or uint32, got '" + a.dtype + "'");
  return a;
}

int info(const Args& a) {
  for (const std::string& f : a.files) {
    const TokenSource s(f, a.format, a.dtype);
    std::printf("%s\n", f.c_str());
    std::printf("  format     %s\n", format_name(s.format()));
    std::printf("  dtype      uint%d\n", 8 * s.token_bytes());
    std::printf("  tokens     %llu\n", (unsigned long long)s.num_tokens());
    if (s.num_documents() >= 0)
      std::printf("  documents  %lld\n", (long long)s.num_documents());
    else
      std::printf("  documents  not recorded by this format\n");
    const TokenizerInfo& t = s.tokenizer();
    if (t.vocab_size > 0 && !t.model.empty())
      std::printf("  tokenizer  %s, vocab_size %lld, eot %lld, model %zu bytes\n", t.type.c_str(),
                  (long long)t.vocab_size, (long long)t.eot, t.model.size());
    else if (t.vocab_size > 0)
      std::printf("  tokenizer  %s, vocab_size %lld, eot %lld\n", t.type.c_str(),
                  (long long)t.vocab_size, (long long)t.eot);
    else
      std::printf("  tokenizer  not recorded (set model.vocab_size in the deck)\n");
    std::printf("  files      %zu\n", s.files().size());
    if (s.extents().empty()) {
      std::printf("    %s: /tokens chunked or filtered (read through HDF5)\n", s.files()[0].c_str());
    }
    for (const TokenExtent& x : s.extents())
      std::printf("    %s: %llu tokens at byte %llu\n", x.file.c_str(),
                  (unsigned long long)x.tokens, (unsigned long long)x.offset);
  }
  return 0;
}

int dump(const Args& a) {
  if (a.files.size() != 1) throw UserError("tessera data dump: one FILE, got " + std::to_string(a.files.size()));
  if (a.start < 0 || a.count < 0)
    throw UserError("tessera data dump: --start S and --count N are required");
  const TokenSource s(a.files[0], a.format, a.dtype);
  const uint64_t start = uint64_t(a.start), count = uint64_t(a.count), n = s.num_tokens();
  // Compared without adding: start + count may not fit in 64 bits.
  if (start > n || count > n - start)
    throw UserError(a.files[0] + ": --start " + std::to_string(start) + " --count " +
                    std::to_string(count) + " runs past the end (" + std::to_string(n) +
                    " tokens: the last is " + std::to_string(n - 1) + ")");
  // In pieces: a dump of billions of tokens needs no more memory than one of a few.
  constexpr uint64_t kPiece = 1 << 20;
  std::vector<uint32_t> ids(size_t(std::min(count, kPiece)));
  for (uint64_t done = 0; done < count; done += kPiece) {
    const uint64_t m = std::min(kPiece, count - done);
    s.read(start + done, m, ids.data());
    for (uint64_t i = 0; i < m; ++i) std::printf(done + i ? " %u" : "%u", ids[size_t(i)]);
  }
  std::printf("\n");
  return 0;
}

// The whole of the source's extents, 8 MiB at a time; O_DIRECT, or buffered after dropping the
// file's pages from the page cache. Returns MB/s.
double sequential_read(const TokenSource& s, bool direct, std::string* mode) {
  constexpr uint64_t kBlock = 8 << 20;
  unsigned char* buf = static_cast<unsigned char*>(std::aligned_alloc(4096, kBlock));
  uint64_t bytes = 0;
  const auto t0 = Clock::now();
  *mode = direct ? "O_DIRECT" : "buffered, page cache dropped";
  for (const TokenExtent& x : s.extents()) {
    int fd = direct ? open(x.file.c_str(), O_RDONLY | O_DIRECT | O_NONBLOCK) : -1;
    if (fd < 0) {
      if (direct) *mode = "buffered (O_DIRECT refused)";
      fd = open(x.file.c_str(), O_RDONLY | O_NONBLOCK);
      if (fd < 0) throw UserError("cannot read " + x.file + ": " + std::strerror(errno), kExitIO);
      fdatasync(fd);
      posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    const uint64_t begin = x.offset & ~uint64_t(4095);
    const uint64_t end = x.offset + x.tokens * uint64_t(s.token_bytes());
    for (uint64_t off = begin; off < end;) {
      const ssize_t n = pread(fd, buf, kBlock, off_t(off));
      if (n <= 0) break;
      off += uint64_t(n);
      bytes += uint64_t(n);
    }
    close(fd);
  }
  std::free(buf);
  return double(bytes) / since(t0) / 1e6;
}

int bench(const Args& a) {
  if (a.files.size() != 1) throw UserError("tessera data bench: one FILE");
  const TokenSource s(a.files[0], a.format, a.dtype);
  if (s.extents().empty()) throw UserError(a.files[0] + ": chunked HDF5: no file offset to bench");
  if (a.gds && !has_gds())
    throw UserError("tessera data bench --gds: this tessera was built without cuFile (no cufile.h "
                    "and libcufile at build time)");
  const double gib = double(s.num_tokens()) * s.token_bytes() / double(1 << 30);
  std::string direct_mode, buffered_mode;
  const double seq_direct = sequential_read(s, true, &direct_mode);
  const double seq_buffered = sequential_read(s, false, &buffered_mode);

  const Dataset data(a.files[0], a.format, a.dtype, int(a.seq_len), 1234);
  require_host_memory(uint64_t(a.depth) * uint64_t(a.batch) * uint64_t(a.seq_len) * 8,
                      "the loader's buffers (--prefetch x --batch x --seq-len)");
  const uint64_t windows = data.sources()[0].num_windows(int(a.seq_len));
  const uint64_t steps_max = windows / uint64_t(a.batch);
  Prefetcher loader(data, 1 << 30, 0, uint64_t(a.batch), int(a.batch), int(a.depth), int(a.readers),
                    true);
  const auto t0 = Clock::now();
  uint64_t steps = 0;
  while (steps < steps_max && since(t0) < a.seconds) {
    loader.next();
    ++steps;
  }
  const double secs = since(t0);
  const double token_bytes = double(steps) * double(a.batch) * double(a.seq_len + 1) * s.token_bytes();
  const double loader_mbs = token_bytes / secs / 1e6;
  std::printf("file %s: %s, %.2f GiB, %llu tokens\n", a.files[0].c_str(), format_name(s.format()),
              gib, (unsigned long long)s.num_tokens());
  std::printf("sequential read (%s): %.0f MB/s\n", direct_mode.c_str(), seq_direct);
  std::printf("sequential read (%s): %.0f MB/s\n", buffered_mode.c_str(), seq_buffered);
  std::printf("loader (%s; random windows of %ld tokens, %ld per step): %.0f MB/s of tokens, "
              "%.0f windows/s, %.0f steps/s over %.1f s\n",
              loader.mode().c_str(), long(a.seq_len + 1), long(a.batch), loader_mbs,
              double(steps) * double(a.batch) / secs, double(steps) / secs, secs);
  if (a.gds)
    std::printf("GPUDirect Storage (cuFileRead into GPU memory, same windows): %.0f MB/s\n",
                gds_window_read_mbs(data, int(a.batch), a.seconds));
  std::printf("BENCH format=%s gib=%.3f seq_direct_mbs=%.1f seq_buffered_mbs=%.1f loader_mbs=%.1f "
              "loader_windows_s=%.1f seq_len=%ld batch=%ld\n",
              format_name(s.format()), gib, seq_direct, seq_buffered, loader_mbs,
              double(steps) * double(a.batch) / secs, long(a.seq_len), long(a.batch));
  return 0;
}

}  // namespace

int data_command(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fputs(kDataUsage, args.empty() ? stderr : stdout);
    return args.empty() ? kExitBadInput : 0;
  }
  const std::string& verb = args[0];
  for (const std::string& s : args)
    if (s == "--help" || s == "-h") {
      std::fputs(kDataUsage, stdout);
      return 0;
    }
  if (verb == "info") return info(parse(verb, args));
  if (verb == "dump") return dump(parse(verb, args));
  if (verb == "bench") return bench(parse(verb, args));
  if (verb == "encode" || verb == "decode") return data_encode(verb, args);
  if (verb == "prepare") return data_prepare(args);
  throw UserError("tessera data: unknown subcommand '" + verb +
                  "' (info, dump, bench, encode, decode or prepare)");
}

}  // namespace tessera
