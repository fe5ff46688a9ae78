#include "io/gds_reader.hpp"

#include <algorithm>

#include "common/error.hpp"

#ifdef TESSERA_CUFILE
#include <cuda_runtime_api.h>
#include <cufile.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#endif

namespace tessera {

#ifdef TESSERA_CUFILE

namespace {

std::string reason(CUfileError_t e) {
  return "cuFile error " + std::to_string(int(e.err)) + " (CUDA " + std::to_string(int(e.cu_err)) + ")";
}

}  // namespace

struct GdsReader::Handle {
  int fd = -1;
  CUfileHandle_t handle{};
};

bool has_gds() { return true; }

GdsReader::GdsReader() {
  const CUfileError_t e = cuFileDriverOpen();
  if (e.err != CU_FILE_SUCCESS)
    throw UserError("cuFileDriverOpen failed: " + reason(e) + "; GPUDirect Storage is not usable here",
                    kExitIO, false);
}

GdsReader::~GdsReader() {
  for (auto& [path, h] : files_) {
    cuFileHandleDeregister(h->handle);
    close(h->fd);
    delete h;
  }
  cuFileDriverClose();
}

void GdsReader::read(const std::string& file, uint64_t offset, uint64_t bytes, void* device_dst) {
  auto it = files_.find(file);
  if (it == files_.end()) {
    auto* h = new Handle;
    // GPUDirect Storage reads need O_DIRECT descriptors.
    h->fd = open(file.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (h->fd < 0) {
      const int err = errno;
      delete h;
      throw UserError("cannot open " + file + " with O_DIRECT for cuFile: " + std::strerror(err),
                      kExitIO, false);
    }
    CUfileDescr_t descr;
    std::memset(&descr, 0, sizeof descr);
    descr.handle.fd = h->fd;
    descr.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    const CUfileError_t e = cuFileHandleRegister(&h->handle, &descr);
    if (e.err != CU_FILE_SUCCESS) {
      close(h->fd);
      delete h;
      throw UserError("cuFileHandleRegister(" + file + ") failed: " + reason(e), kExitIO, false);
    }
    it = files_.emplace(file, h).first;
  }
  uint64_t done = 0;
  while (done < bytes) {
    const ssize_t n = cuFileRead(it->second->handle, device_dst, bytes - done, off_t(offset + done),
                                 off_t(done));
    if (n < 0)
      throw UserError(file + ": cuFileRead failed at byte " + std::to_string(offset + done) +
                      " (" + std::to_string(n) + ")", kExitIO, false);
    if (n == 0)
      throw UserError(file + ": unexpected end of file at byte " + std::to_string(offset + done),
                      kExitBadInput, false);
    done += uint64_t(n);
  }
}

double gds_window_read_mbs(const Dataset& data, int batch, double seconds) {
  const int T = data.seq_len();
  const size_t window_bytes = size_t(T + 1) * 4;
  void* device = nullptr;
  if (cudaMalloc(&device, window_bytes * size_t(batch)) != cudaSuccess)
    throw UserError("cudaMalloc of the GPUDirect Storage bench buffer failed", kExitIO, false);
  GdsReader reader;
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double bytes = 0;
  for (uint64_t g = 0; elapsed() < seconds; g += uint64_t(batch)) {
    for (int i = 0; i < batch; ++i) {
      const SampleRef r = data.sample(g + uint64_t(i));
      const TokenSource& src = data.sources()[size_t(r.source)];
      const uint64_t width = uint64_t(src.token_bytes());
      char* dst = static_cast<char*>(device) + size_t(i) * window_bytes;
      src.for_each_piece(src.window_start(r.window, T), uint64_t(T) + 1,
                         [&](const TokenExtent& x, uint64_t offset, uint64_t n) {
                           reader.read(x.file, offset, n * width, dst);
                           dst += n * width;
                         });
      bytes += double(uint64_t(T + 1) * width);
    }
  }
  const double mbs = bytes / elapsed() / 1e6;
  cudaFree(device);
  return mbs;
}

#else

struct GdsReader::Handle {};

double gds_window_read_mbs(const Dataset&, int, double) { return 0; }

bool has_gds() { return false; }

GdsReader::GdsReader() {
  throw UserError("this tessera was built without cuFile (no cufile.h / libcufile found at build "
                  "time): GPUDirect Storage reads are not available");
}

GdsReader::~GdsReader() = default;

void GdsReader::read(const std::string&, uint64_t, uint64_t, void*) {}

#endif

}  // namespace tessera
