#pragma once
// GPUDirect Storage (docs/data.md): token bytes read by cuFileRead from the file straight into device
// memory, with no host bounce buffer. Compiled in when the build finds cufile.h and libcufile
// (TESSERA_CUFILE, see the Makefile); without them has_gds() is false and GdsReader refuses to be
// made. `tessera data bench FILE --gds` measures it against the host loader.
#include <cstdint>
#include <map>
#include <string>

#include "io/dataset.hpp"

namespace tessera {

bool has_gds();

class GdsReader {
 public:
  GdsReader();  // opens the cuFile driver; UserError where it is not built or not usable
  ~GdsReader();
  GdsReader(const GdsReader&) = delete;
  GdsReader& operator=(const GdsReader&) = delete;
  // Reads bytes [offset, offset + bytes) of file into device memory at device_dst.
  void read(const std::string& file, uint64_t offset, uint64_t bytes, void* device_dst);

 private:
  struct Handle;
  std::map<std::string, Handle*> files_;
};

// The loader's reads done by GPUDirect Storage: data's windows in training order, `batch` per
// step, each read by cuFileRead into a device buffer, for `seconds`. Returns MB/s of tokens.
double gds_window_read_mbs(const Dataset& data, int batch, double seconds);

}  // namespace tessera
