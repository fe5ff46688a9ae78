// One libFuzzer binary per target (`make fuzz`): TESSERA_FUZZ_TARGET names it.
#include <cstdlib>

#include "targets.hpp"

#ifndef TESSERA_FUZZ_TARGET
#error "build with -DTESSERA_FUZZ_TARGET=deck (or checkpoint, token_hdf5, ...)"
#endif

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tessera::fuzz::init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return tessera::fuzz::TESSERA_FUZZ_TARGET(data, size);
}
