#pragma once
// `tessera data info|dump|bench`: inspect token files of any supported format, and measure the
// loader against a plain sequential read of the same file; `encode|decode`: text <-> ids;
// `prepare`: text files -> token files, on every rank of an MPI job.
#include <string>
#include <vector>

namespace tessera {

extern const char* const kDataUsage;

// args: what follows `tessera data`. Returns the exit status; throws UserError on bad input.
int data_command(const std::vector<std::string>& args);

// `tessera data encode|decode` (data_encode.cpp); verb is args[0].
int data_encode(const std::string& verb, const std::vector<std::string>& args);

// `tessera data prepare` (data_prepare.cpp): text files -> train.h5 and val.h5, on every rank.
int data_prepare(const std::vector<std::string>& args);

}  // namespace tessera
