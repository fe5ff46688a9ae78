// `make test`: every input of the kept corpus (tests/fuzz/corpus/TARGET/: the seeds, and every
// input that ever crashed a reader) through its target, built with g++: each must be accepted or
// refused with a UserError. Usage: fuzz_replay CORPUS_DIR...  (the directory's name is the target)
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "targets.hpp"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  tessera::fuzz::init();
  int inputs = 0, targets = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string name = fs::path(argv[i]).filename().string();
    const tessera::fuzz::Target target = tessera::fuzz::target(name.c_str());
    if (!target) {
      std::fprintf(stderr, "fuzz_replay: %s: no fuzz target named %s\n", argv[i], name.c_str());
      return 2;
    }
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(argv[i]))
      if (entry.is_regular_file()) files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) {
      std::ifstream in(f, std::ios::binary);
      const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
      target(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++inputs;
    }
    ++targets;
  }
  std::printf("fuzz replay: %d inputs of %d targets, each accepted or refused with one line\n",
              inputs, targets);
  MPI_Finalize();
  return 0;
}
