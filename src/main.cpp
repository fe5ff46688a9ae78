// tessera: init MPI, read the command line and the deck, run the command, finalize.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <csignal>
#include <cmath>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "backend/peak.hpp"
#include "common/cli.hpp"
#include "common/error.hpp"
#include "common/limits.hpp"
#include "common/version.hpp"
#include "config/config.hpp"
#include "io/hdf5_util.hpp"
#include "plan/command.hpp"
#include "train/ckpt_command.hpp"
#include "train/data_command.hpp"
#include "train/generate.hpp"
#include "train/signals.hpp"
#include "train/trainer.hpp"

namespace {

const char* kUsage = R"(tessera: trains GPT-style language models with MPI (data, tensor and pipeline parallel)

usage:
  tessera train DECK.yaml [section.key=value ...]   train as the input deck says
  tessera eval CKPT --data FILE [--batches N]       mean loss of a checkpoint on a token file
  tessera sample CKPT [--prompt TEXT] [--tokens N] [--temperature T] [--seed S] [--tokenizer F]
                                                    generate text from a checkpoint
  tessera data info|dump|bench FILE ...             inspect token files (tessera data --help)
  tessera data encode|decode TOKENIZER ...          text <-> ids (tessera data --help)
  tessera data prepare INPUTS... --out-dir DIR      JSON Lines / text -> token files, on every rank
  tessera ckpt diff REF OTHER                       compare two checkpoints tensor by tensor
  tessera ckpt info|verify CKPT                     what a checkpoint holds; verify every checksum
  tessera plan DECK.yaml --ranks N [--machine M] [--search]
                                                    memory, communication and step time of a
                                                    layout, or every layout ranked (no launch)
  tessera peak                                      measure this machine's sgemm GFLOP/s
  tessera --version | --help | COMMAND --help

CKPT is a checkpoint file (step_NNNNNNNN.h5) or a directory holding checkpoints (its newest is
used). Launch training with mpiexec/srun. Exit status: 0 done, 1 I/O error, 2 bad input,
3 stopped early by SIGUSR1/SIGTERM or run.max_minutes after writing a checkpoint (requeue the
job to continue), 4 stopped by the anomaly policy (train.anomaly_action) with the last good
checkpoint kept, 130 stopped by SIGINT after writing a checkpoint.
Deck keys are documented in input/README.md.
)";

const char* kTrainUsage = R"(usage: tessera train DECK.yaml [section.key=value ...]

Reads the YAML input deck, applies the overrides in order (e.g. train.steps=100 optim.lr=3e-4),
writes the resolved deck to <run.dir>/deck.yaml, and trains. Rank 0 logs one line every log.every
steps (step, loss, lr, grad norm, ms/step, tokens/s, MFU) and appends the same fields as JSON lines
to <run.dir>/metrics.jsonl. Checkpoints go to checkpoint.dir (default <run.dir>/checkpoints);
checkpoint.restart: auto continues from the newest one there. SIGUSR1 or SIGTERM (or the
run.max_minutes budget) make every rank finish its step, write a checkpoint and exit 3 (requeue
to continue); SIGINT does the same and exits 130. Every deck key: input/README.md.
)";

const char* kEvalUsage = R"(usage: tessera eval CKPT --data FILE [--batches N]

Prints the mean cross-entropy of the checkpoint's model on the first N batches of windows of the
HDF5 token file FILE, in file order: N x train.batch_size windows of data.seq_len + 1 tokens, as
the checkpoint's deck says (N defaults to its eval.batches). These are the windows a training run
evaluates with the same deck, on any layout.
)";

const char* kSampleUsage = R"(usage: tessera sample CKPT [--prompt TEXT] [--tokens N] [--temperature T] [--seed S]
                      [--tokenizer FILE]

Writes the prompt and up to N (default 200) generated tokens as text to stdout. Temperature 0 is
greedy; the default is 1. The same seed gives the same text. The prompt is encoded, and the ids
decoded, with the checkpoint's tokenizer, or with that of the token file FILE (for a checkpoint
imported without one); a FILE whose tokenizer differs from the checkpoint's is refused.
)";

using tessera::UserError;
using tessera::parse_int;

bool wants_help(const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

// Flags of the form --name VALUE after the positional argument; `known` lists the names, so that
// a misspelt flag is called unknown whether or not a value follows it.
struct Flags {
  std::string command;
  std::vector<std::string> args;
  std::vector<std::string> known;
  size_t i = 1;
  bool next(std::string& name, std::string& value) {
    if (i >= args.size()) return false;
    name = args[i++];
    if (name.rfind("--", 0) != 0)
      throw UserError("tessera " + command + ": unexpected argument '" + name + "' (see --help)");
    if (std::find(known.begin(), known.end(), name) == known.end())
      throw UserError("tessera " + command + ": unknown option " + name + " (see --help)");
    if (i >= args.size()) throw UserError("tessera " + command + ": " + name + " needs a value");
    value = args[i++];
    return true;
  }
};

// A finite number in [lo, hi].
double parse_double(const std::string& flag, const std::string& v, double lo, double hi) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(x) || !(x >= lo && x <= hi)) {
    char range[64];
    std::snprintf(range, sizeof range, "from %g to %g", lo, hi);
    throw UserError(flag + ": expected a number " + range + ", got '" + v + "'");
  }
  return x;
}

int run(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0] == "--help" || argv[0] == "-h" || argv[0] == "help") {
    std::fputs(kUsage, stdout);
    return argv.empty() ? tessera::kExitBadInput : 0;
  }
  if (argv[0] == "--version" || argv[0] == "version") {
    std::printf("%s\n", tessera::kSoftwareVersion);
    return 0;
  }
  const std::string command = argv[0];
  const std::vector<std::string> args(argv.begin() + 1, argv.end());
  if (command == "train") {
    if (wants_help(args) || args.empty()) {
      std::fputs(kTrainUsage, args.empty() ? stderr : stdout);
      return args.empty() ? tessera::kExitBadInput : 0;
    }
    const std::vector<std::string> overrides(args.begin() + 1, args.end());
    const tessera::Config config = tessera::load_deck(args[0], overrides);
    return tessera::train(MPI_COMM_WORLD, config);
  }
  if (command == "eval") {
    if (wants_help(args) || args.empty()) {
      std::fputs(kEvalUsage, args.empty() ? stderr : stdout);
      return args.empty() ? tessera::kExitBadInput : 0;
    }
    Flags flags{command, args, {"--data", "--batches"}};
    std::string name, value, data;
    int batches = 0;
    while (flags.next(name, value)) {
      if (name == "--data") data = value;
      else batches = int(parse_int(name, value, 1, INT_MAX));
    }
    if (data.empty()) throw UserError("tessera eval: --data FILE is required");
    tessera::eval_checkpoint(args[0], data, batches);
    return 0;
  }
  if (command == "sample") {
    if (wants_help(args) || args.empty()) {
      std::fputs(kSampleUsage, args.empty() ? stderr : stdout);
      return args.empty() ? tessera::kExitBadInput : 0;
    }
    Flags flags{command, args, {"--prompt", "--tokens", "--temperature", "--seed", "--tokenizer"}};
    std::string name, value;
    tessera::SampleOptions options;
    while (flags.next(name, value)) {
      if (name == "--prompt") options.prompt = value;
      else if (name == "--tokens")
        options.tokens = int(parse_int(name, value, 0, tessera::limits::kSampleTokens));
      else if (name == "--temperature") options.temperature = parse_double(name, value, 0.0, 1e6);
      else if (name == "--tokenizer") options.tokenizer = value;
      else options.seed = uint64_t(parse_int(name, value, 0, INT64_MAX));
    }
    tessera::sample_text(args[0], options);
    return 0;
  }
  if (command == "data") return tessera::data_command(args);
  if (command == "ckpt") return tessera::ckpt_command(args);
  if (command == "plan") return tessera::plan_command(args);
  if (command == "peak") {
    std::printf("sgemm_gflops %.1f\n", tessera::measure_sgemm_gflops(2.0));
    return 0;
  }
  throw UserError("tessera: unknown command '" + command + "' (see tessera --help)");
}

// True when every rank enters this barrier within `seconds`.
bool all_ranks_arrive(double seconds) {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int done = 0;
  while (!done && std::chrono::steady_clock::now() < deadline) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done != 0;
}

// A message as one line, whatever a file name or a library put in it.
std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  // Training turns SIGUSR1, SIGTERM and SIGINT into a stop with a checkpoint, which the trainer
  // honours at every step boundary and start-up stage: before MPI_Init (a batch system's signal
  // during start-up must not kill the job half-way) and again after it, in case the MPI library
  // installed handlers of its own. The other commands (sample, eval, data) never look at that
  // flag, so they keep the default: the signal ends them at once. A write past the file-size
  // limit (ulimit -f) fails with EFBIG, reported like any failed write, instead of killing.
  const bool training = argc > 1 && std::strcmp(argv[1], "train") == 0;
  // `data prepare` too: its write-error watch (io/io_error_watch.hpp) ends a stuck job with
  // MPI_Abort from a thread of its own.
  const bool preparing = argc > 2 && std::strcmp(argv[1], "data") == 0 &&
                         std::strcmp(argv[2], "prepare") == 0;
  std::signal(SIGXFSZ, SIG_IGN);
  tessera::hdf5_no_atexit();
  if (training) tessera::install_stop_handlers();
  // Funneled: the data loader's thread reads files and never calls MPI. Training asks for
  // MPI_THREAD_MULTIPLE (MPICH provides it): the hang watchdog's thread ends a hung job with
  // MPI_Abort while the training thread waits inside MPI.
  int provided = 0;
  MPI_Init_thread(&argc, &argv, training || preparing ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED,
                  &provided);
  if (training) tessera::install_stop_handlers();
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (training) tessera::speak_on_sigint(rank == 0);
  int status = 0;
  std::string message;
  bool failed = false, every_rank = false;
  try {
    status = run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const UserError& e) {
    status = e.exit_code;
    message = one_line(e.what());
    failed = true;
    every_rank = e.every_rank;
  } catch (const std::exception& e) {
    status = tessera::kExitIO;
    message = one_line("tessera: internal error on rank " + std::to_string(rank) + ": " + e.what());
    failed = true;
  }
  if (failed) {
    // An error every rank meets (the deck, the layout, a file they all open) ends the job
    // quietly once all ranks have reached this point: rank 0 alone prints it. Anything else, or
    // a peer that never arrives (it is blocked in a collective), is printed by the rank that
    // met it and ends the job with MPI_Abort.
    if (size > 1 && every_rank && all_ranks_arrive(10.0)) {
      if (rank == 0) std::fprintf(stderr, "%s\n", message.c_str());
    } else if (size > 1) {
      std::fprintf(stderr, "rank %d: %s\n", rank, message.c_str());
      std::fflush(stderr);
      // The launcher forwards output through a pipe: give it a moment before the job dies.
      std::this_thread::sleep_for(std::chrono::seconds(1));
      MPI_Abort(MPI_COMM_WORLD, status);
    } else {
      std::fprintf(stderr, "%s\n", message.c_str());
      // An error of this rank alone may leave state behind that the exit cannot tear down (a
      // checkpoint whose close failed stays open in HDF5, which would close it again inside
      // MPI_Finalize and fault): one rank ends as the job would, without it.
      if (!every_rank) {
        std::fflush(stderr);
        std::fflush(stdout);
        std::_Exit(status);
      }
    }
  }
  MPI_Finalize();
  return status;
}
