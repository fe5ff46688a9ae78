// `tessera data prepare`'s shares of the input (train/data_prepare_input.hpp): for any number of
// ranks, the ranks' documents one after another are the documents of one reader, and every line
// is counted once, in plain, gzip (two members) and zstd JSON Lines and whole-file documents.
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "train/data_prepare_input.hpp"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

// Lines of random letters (little to compress, so a compressed file spans several of the
// decoder's 64 KiB input blocks), some malformed, some blank.
std::string jsonl(int lines, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string out;
  for (int i = 0; i < lines; ++i) {
    if (i % 97 == 5) {
      out += "{broken\n";
      continue;
    }
    if (i % 89 == 7) {
      out += "\n";
      continue;
    }
    std::string text;
    for (size_t n = rng() % 400; n > 0; --n) text += char('a' + rng() % 26);
    out += "{\"text\": \"" + text + "\", \"i\": " + std::to_string(i) + "}\n";
  }
  return out;
}

std::string gzip(const std::string& text) {
  z_stream z{};
  deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, uLong(text.size())) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = uInt(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string zstd(const std::string& text) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  out.resize(ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 3));
  return out;
}

struct Read {
  std::vector<std::string> documents;
  std::vector<int64_t> lines;
  int64_t malformed = 0;
};

Read read_all(const std::vector<PrepareInput>& inputs, int ranks) {
  const uint64_t total = inputs.back().start + inputs.back().bytes;
  Read all;
  all.lines.assign(inputs.size(), 0);
  for (int r = 0; r < ranks; ++r) {
    const uint64_t lo = total * uint64_t(r) / uint64_t(ranks);
    const uint64_t hi = r == ranks - 1 ? UINT64_MAX : total * uint64_t(r + 1) / uint64_t(ranks);
    ShareStats stats;
    EXPECT_TRUE(read_share(inputs, lo, hi, "text", false, &stats,
                           [&](std::string&& d) { all.documents.push_back(std::move(d)); }));
    for (size_t f = 0; f < inputs.size(); ++f) all.lines[f] += stats.lines[f];
    all.malformed += stats.malformed;
  }
  return all;
}

}  // namespace

TEST(DataPrepare, SharesOfAnyRankCountJoinToOneReading) {
  const fs::path dir = fs::temp_directory_path() / ("tessera_prepare_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string a = jsonl(700, 1), b1 = jsonl(900, 2), b2 = jsonl(600, 3), c = jsonl(2000, 4);
  std::ofstream(dir / "a.jsonl", std::ios::binary) << a;
  std::ofstream(dir / "b.jsonl.gz", std::ios::binary) << gzip(b1) + gzip(b2);
  std::ofstream(dir / "c.jsonl.zst", std::ios::binary) << zstd(c);
  std::ofstream(dir / "d.txt", std::ios::binary) << "a whole \xff document\n";
  std::ofstream(dir / "e.txt", std::ios::binary) << "";
  std::vector<std::string> warnings;
  const std::vector<PrepareInput> inputs = collect_prepare_inputs({dir.string()}, &warnings);
  ASSERT_EQ(inputs.size(), 5u);
  EXPECT_GT(fs::file_size(dir / "b.jsonl.gz"), 2u * (64 << 10));  // several input blocks
  EXPECT_GT(fs::file_size(dir / "c.jsonl.zst"), 3u * (64 << 10));
  const Read one = read_all(inputs, 1);
  EXPECT_EQ(one.lines[0], 700);
  EXPECT_EQ(one.lines[1], 1500);
  EXPECT_EQ(one.lines[2], 2000);
  EXPECT_EQ(one.documents.back(), "");
  for (int ranks : {2, 3, 4, 7, 16, 64}) {
    const Read many = read_all(inputs, ranks);
    EXPECT_EQ(many.documents, one.documents) << ranks << " ranks";
    EXPECT_EQ(many.lines, one.lines) << ranks << " ranks";
    EXPECT_EQ(many.malformed, one.malformed) << ranks << " ranks";
  }
  fs::remove_all(dir);
}

TEST(DataPrepare, InputGivenTwiceIsReadOnceAndParquetIsRefused) {
  const fs::path dir = fs::temp_directory_path() / ("tessera_prepare2_" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "a.jsonl") << "{\"text\": \"x\"}\n";
  std::vector<std::string> warnings;
  const auto inputs =
      collect_prepare_inputs({(dir / "a.jsonl").string(), (dir / "a.jsonl").string()}, &warnings);
  EXPECT_EQ(inputs.size(), 1u);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("more than once"), std::string::npos);
  std::ofstream(dir / "t.parquet") << "PAR1";
  EXPECT_THROW(collect_prepare_inputs({(dir / "t.parquet").string()}, &warnings), UserError);
  fs::remove_all(dir);
}
