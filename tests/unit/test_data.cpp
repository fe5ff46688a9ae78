// The data pipeline's pure parts: blend syntax, the blend's sample map (exact proportions per
// block, every window once per epoch, consumed() = counting), the O_DIRECT reader at unaligned
// offsets, and the prefetcher against direct reads of the same samples.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "common/error.hpp"
#include "io/dataset.hpp"
#include "io/prefetch.hpp"
#include "io/sample_order.hpp"

using namespace tessera;

TEST(Blend, ParsesMegatronSyntax) {
  std::vector<BlendEntry> e;
  EXPECT_EQ(parse_blend("data/a.bin", &e), "");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].spec, "data/a.bin");
  EXPECT_EQ(e[0].weight, 1.0);
  EXPECT_EQ(parse_blend("  3 a.bin 1 'b/*.bin'  ", &e), "");
  ASSERT_EQ(e.size(), 2u);
  EXPECT_DOUBLE_EQ(e[0].weight, 0.75);
  EXPECT_EQ(e[1].spec, "'b/*.bin'");
  EXPECT_EQ(parse_blend(" my data/file 1.h5 ", &e), "");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].spec, "my data/file 1.h5");
  EXPECT_NE(parse_blend("0.5 a 0.5", &e), "");
  EXPECT_NE(parse_blend("0.5 a x b", &e), "");
  EXPECT_NE(parse_blend("0 a 1 b", &e), "");
  EXPECT_NE(parse_blend("", &e), "");
}

TEST(Blend, OneSourceIsTheSingleFileOrder) {
  const Blend b({1.0}, {1000}, 7);
  for (uint64_t g = 0; g < 3000; g += 37) {
    const SampleRef r = b.at(g);
    EXPECT_EQ(r.source, 0);
    EXPECT_EQ(r.window, sample_window(g, 1000, 7));
    EXPECT_EQ(r.source_sample, g);
  }
}

TEST(Blend, ExactCountsPerBlockAndEveryWindowOncePerEpoch) {
  const std::vector<double> w = {0.6, 0.3, 0.1};
  const std::vector<uint64_t> windows = {2000, 700, 13};
  const Blend b(w, windows, 42);
  const std::vector<uint64_t> counts = b.counts();
  EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), uint64_t(0)), Blend::kBlock);
  for (size_t s = 0; s < w.size(); ++s)
    EXPECT_LE(std::abs(double(counts[s]) - w[s] * Blend::kBlock), 1.0) << s;
  std::vector<std::map<uint64_t, uint64_t>> window_of(3);  // source sample k -> window
  for (uint64_t block = 0; block < 3; ++block) {
    std::vector<std::set<uint64_t>> ks(3);
    for (uint64_t g = block * Blend::kBlock; g < (block + 1) * Blend::kBlock; ++g) {
      const SampleRef r = b.at(g);
      ASSERT_LT(r.window, windows[size_t(r.source)]);
      ks[size_t(r.source)].insert(r.source_sample);
      window_of[size_t(r.source)][r.source_sample] = r.window;
    }
    // Block b draws exactly source samples [b * c, (b + 1) * c) of each source.
    for (size_t s = 0; s < 3; ++s) {
      ASSERT_EQ(ks[s].size(), counts[s]) << "block " << block;
      EXPECT_EQ(*ks[s].begin(), block * counts[s]);
      EXPECT_EQ(*ks[s].rbegin(), (block + 1) * counts[s] - 1);
    }
  }
  // Within each epoch of a source every window is read once.
  for (size_t s = 0; s < 3; ++s) {
    int epochs = 0;
    for (uint64_t e = 0; (e + 1) * windows[s] <= window_of[s].size(); ++e, ++epochs) {
      std::set<uint64_t> seen;
      for (uint64_t k = e * windows[s]; k < (e + 1) * windows[s]; ++k) seen.insert(window_of[s].at(k));
      EXPECT_EQ(seen.size(), windows[s]) << "source " << s << " epoch " << e;
    }
    EXPECT_GE(epochs, 1) << s;
  }
}

TEST(Blend, ConsumedCountsTheSamplesBefore) {
  const Blend b({0.5, 0.25, 0.25}, {100, 100, 100}, 3);
  std::vector<uint64_t> n(3);
  for (uint64_t g = 0; g < 2 * Blend::kBlock + 100; ++g) {
    if (g % 511 == 0 || g == 2 * Blend::kBlock + 99) {
      for (int s = 0; s < 3; ++s) ASSERT_EQ(b.consumed(s, g), n[size_t(s)]) << g;
    }
    n[size_t(b.at(g).source)] += 1;
  }
}

TEST(Blend, AFunctionOfSeedAndIndexOnly) {
  const Blend a({0.7, 0.3}, {50, 60}, 11), again({0.7, 0.3}, {50, 60}, 11), other({0.7, 0.3}, {50, 60}, 12);
  int differ = 0;
  for (uint64_t g = 9000; g < 9200; ++g) {
    EXPECT_EQ(a.at(g).source, again.at(g).source);
    EXPECT_EQ(a.at(g).window, again.at(g).window);
    differ += a.at(g).source != other.at(g).source || a.at(g).window != other.at(g).window;
  }
  EXPECT_GT(differ, 100);
}

namespace {

// A raw uint16 file of n tokens, token i = (i * 7919) % 65521, in the build directory (a real
// file system: /tmp may be tmpfs, which refuses O_DIRECT), made if absent (`make asan` builds
// into build-asan/ only).
std::string raw_file(uint64_t n) {
  std::filesystem::create_directories("build");
  const std::string path = "build/test_data_raw_" + std::to_string(getpid()) + ".bin";
  std::ofstream f(path, std::ios::binary);
  for (uint64_t i = 0; i < n; ++i) {
    const uint16_t v = uint16_t((i * 7919) % 65521);
    f.write(reinterpret_cast<const char*>(&v), 2);
  }
  return path;
}

}  // namespace

TEST(DirectReader, UnalignedRangesEqualTheFile) {
  const uint64_t n = 20000;
  const std::string path = raw_file(n);
  for (bool direct : {true, false}) {
    DirectReader reader(direct);
    for (uint64_t offset : {uint64_t(0), uint64_t(1), uint64_t(4095), uint64_t(4096), uint64_t(10001), 2 * n - 9}) {
      for (uint64_t bytes : {1, 9, 4096, 9000}) {
        if (offset + bytes > 2 * n) continue;
        std::vector<unsigned char> got(bytes);
        reader.read(path, offset, bytes, got.data());
        for (uint64_t i = 0; i < bytes; ++i) {
          const uint64_t b = offset + i;
          const uint16_t v = uint16_t(((b / 2) * 7919) % 65521);
          ASSERT_EQ(got[i], b % 2 ? v >> 8 : v & 0xff) << "offset " << offset << " byte " << i;
        }
      }
    }
    if (direct) {
      EXPECT_NE(reader.mode().find("O_DIRECT"), std::string::npos) << reader.mode();
    }
  }
  std::remove(path.c_str());
}

TEST(Prefetcher, GivesTheSamplesOfEachStepInOrder) {
  const std::string path = raw_file(50000);
  const int T = 31, count = 6;
  const Dataset data(path, "raw", "uint16", T, 5);
  for (auto [depth, readers] : {std::pair{0, 1}, {1, 1}, {3, 1}, {4, 3}, {2, 5}}) {
    Prefetcher loader(data, 65536, 40, 24, count, depth, readers, true);
    std::vector<int32_t> in(T), tg(T);
    for (uint64_t step = 0; step < 12; ++step) {
      const StepSamples& s = loader.next();
      ASSERT_EQ(s.first, 40 + step * 24);
      for (int i = 0; i < count; ++i) {
        data.read_sample(s.first + uint64_t(i), 65536, in.data(), tg.data());
        ASSERT_TRUE(std::equal(in.begin(), in.end(), s.inputs + long(i) * T)) << depth;
        ASSERT_TRUE(std::equal(tg.begin(), tg.end(), s.targets + long(i) * T)) << depth;
        EXPECT_EQ(s.refs[size_t(i)].window, data.sample(s.first + uint64_t(i)).window);
      }
    }
  }
  std::remove(path.c_str());
}

namespace {
int allocations = 0, releases = 0;
void* counted_alloc(size_t bytes) {
  allocations += 1;
  return std::malloc(bytes);
}
void counted_free(void* p) {
  releases += 1;
  std::free(p);
}
}  // namespace

TEST(Prefetcher, RingLivesInTheGivenHostMemory) {
  const std::string path = raw_file(50000);
  const Dataset data(path, "raw", "uint16", 15, 5);
  {
    Prefetcher loader(data, 65536, 0, 4, 4, 3, 2, true, {counted_alloc, counted_free});
    EXPECT_EQ(allocations, 1);  // one allocation for every slot
    std::vector<int32_t> in(15), tg(15);
    for (int step = 0; step < 5; ++step) {
      const StepSamples& s = loader.next();
      data.read_sample(s.first, 65536, in.data(), tg.data());
      EXPECT_TRUE(std::equal(in.begin(), in.end(), s.inputs));
    }
  }
  EXPECT_EQ(releases, 1);
  std::remove(path.c_str());
}

TEST(Prefetcher, ABadTokenIsRethrownToTheConsumer) {
  const std::string path = raw_file(50000);
  const Dataset data(path, "raw", "uint16", 15, 5);
  Prefetcher loader(data, 100, 0, 4, 4, 2, 3, true);  // ids go up to 65520: the first window fails
  try {
    loader.next();
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("not below the model's vocab_size 100"), std::string::npos)
        << e.what();
  }
  std::remove(path.c_str());
}
