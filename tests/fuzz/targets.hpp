#pragma once
// The fuzz targets (tests/fuzz/README.md): each takes one input, gives it to a reader of user
// files as that file, and must return: any input is either accepted or refused with a UserError,
// never a crash, a leak or a hang. Built two ways: with clang's libFuzzer (`make fuzz`) and, with
// g++, by tests/fuzz/replay.cpp, which `make test` runs over the kept corpus.
#include <cstddef>
#include <cstdint>

namespace tessera::fuzz {

using Target = int (*)(const uint8_t* data, size_t size);

int deck(const uint8_t* data, size_t size);          // the YAML deck reader
int machine(const uint8_t* data, size_t size);       // tessera plan's machine-file reader
int checkpoint(const uint8_t* data, size_t size);    // the checkpoint reader (ckpt verify's walk)
int token_hdf5(const uint8_t* data, size_t size);    // the token-file readers, one per format
int token_llmc(const uint8_t* data, size_t size);
int token_megatron(const uint8_t* data, size_t size);  // the input is the .idx; the .bin, 4 KiB
int token_raw(const uint8_t* data, size_t size);
int tokenizer_json(const uint8_t* data, size_t size);  // ByteLevelBpe: tokenizer.json, then an encode

// name -> target; nullptr for an unknown name.
Target target(const char* name);
// MPI_Init (the checkpoint reader is parallel HDF5), once.
void init();

}  // namespace tessera::fuzz
