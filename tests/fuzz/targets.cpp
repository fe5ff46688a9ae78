#include "targets.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "config/config.hpp"
#include "io/checkpoint.hpp"
#include "io/contained.hpp"
#include "io/hdf5_util.hpp"
#include "io/token_source.hpp"
#include "io/tokenizer_bpe.hpp"
#include "plan/machine.hpp"

namespace tessera::fuzz {

namespace {

// The input as a file of this process: /tmp/tessera_fuzz_PID_NAME.
std::string as_file(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = "/tmp/tessera_fuzz_" + std::to_string(getpid()) + "_" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), std::streamsize(size));
  return path;
}

// Opens the input as a token file of `format` and reads its first tokens: a UserError is a
// refusal, anything else escapes and is a finding.
int tokens(const std::string& path, const char* format, const char* dtype) {
  try {
    TokenSource src(path, format, dtype);
    std::vector<uint32_t> out(size_t(std::min<uint64_t>(src.num_tokens(), 4096)));
    src.read(0, out.size(), out.data());
    if (src.num_tokens() > out.size()) src.read(src.num_tokens() - 1, 1, out.data());
  } catch (const UserError&) {
  }
  return 0;
}

}  // namespace

void init() {
  static bool done = false;
  if (done) return;
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  hdf5_quiet();
  // A reader that loops is a finding at libFuzzer's -timeout (10 s, tests/fuzz/run.sh): the
  // contained HDF5 readers give up before it.
  contained_seconds = 5;
  done = true;
}

int deck(const uint8_t* data, size_t size) {
  try {
    parse_deck(std::string(reinterpret_cast<const char*>(data), size), "fuzz.yaml", {});
  } catch (const UserError&) {
  }
  return 0;
}

// A machine file it accepts must make a machine a plan can price: every figure finite and in
// its range (a NaN plan was found this way), anything else is a finding.
int machine(const uint8_t* data, size_t size) {
  try {
    const Machine m = parse_machine(std::string(reinterpret_cast<const char*>(data), size),
                                    "fuzz_machine.yaml");
    const double figures[] = {m.peak_fp32, m.peak_bf16, m.peak_fp8, m.memory, m.memory_bw,
                              m.intra_bw, m.inter_bw, m.latency, m.intra_latency, m.reserved,
                              m.gemm_efficiency, m.gemm_half, m.gemm_tile,
                              m.memory_efficiency, m.kernel_overhead};
    for (double x : figures)
      if (!std::isfinite(x) || x < 0) std::abort();
    if (m.peak_fp32 <= 0 || m.devices_per_node < 1 || m.nics_per_node < 0) std::abort();
  } catch (const UserError&) {
  }
  return 0;
}

int checkpoint(const uint8_t* data, size_t size) {
  init();
  const std::string path = as_file("ckpt.h5", data, size);
  try {
    verify_checkpoint(path);
  } catch (const UserError&) {
  }
  unlink(path.c_str());
  return 0;
}

int token_hdf5(const uint8_t* data, size_t size) {
  const std::string path = as_file("tokens.h5", data, size);
  tokens(path, "hdf5", "uint16");
  unlink(path.c_str());
  return 0;
}

int token_llmc(const uint8_t* data, size_t size) {
  const std::string path = as_file("tokens.bin", data, size);
  tokens(path, "llmc", "uint16");
  unlink(path.c_str());
  return 0;
}

int token_megatron(const uint8_t* data, size_t size) {
  const std::string idx = as_file("mg.idx", data, size);
  const std::vector<uint8_t> bin(4096, 7);
  const std::string binary = as_file("mg.bin", bin.data(), bin.size());
  const std::string prefix = idx.substr(0, idx.size() - 4);
  tokens(prefix, "megatron", "uint16");
  unlink(idx.c_str());
  unlink(binary.c_str());
  return 0;
}

int token_raw(const uint8_t* data, size_t size) {
  const std::string path = as_file("tokens.raw", data, size);
  tokens(path, "raw", size % 2 ? "uint16" : "uint32");
  unlink(path.c_str());
  return 0;
}

int tokenizer_json(const uint8_t* data, size_t size) {
  try {
    const ByteLevelBpe bpe(std::string(reinterpret_cast<const char*>(data), size), "fuzz.json");
    bpe.decode(bpe.encode("def f(x):\n    return x  # caf\xc3\xa9 123 \xff\xfe\n"));
  } catch (const UserError&) {
  }
  return 0;
}

Target target(const char* name) {
  const std::pair<const char*, Target> all[] = {
      {"deck", deck},
      {"machine", machine},
      {"checkpoint", checkpoint},
      {"token_hdf5", token_hdf5},
      {"token_llmc", token_llmc},
      {"token_megatron", token_megatron},
      {"token_raw", token_raw},
      {"tokenizer_json", tokenizer_json}};
  for (const auto& [n, t] : all)
    if (std::strcmp(n, name) == 0) return t;
  return nullptr;
}

}  // namespace tessera::fuzz
