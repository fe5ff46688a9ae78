#pragma once
// `tessera plan DECK [section.key=value ...] --ranks N [--machine NAME | --machine-file FILE]
// [--search] [--json]`: a deck's memory per rank, communication, bubble and step time on a
// machine, or (--search) every layout of N ranks ranked, without launching the run.
#include <string>
#include <vector>

namespace tessera {

extern const char* const kPlanUsage;

// args: what follows `tessera plan`. Returns the exit status; throws UserError on bad input.
int plan_command(const std::vector<std::string>& args);

}  // namespace tessera
