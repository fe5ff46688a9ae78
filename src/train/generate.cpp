#include "train/generate.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "common/error.hpp"
#include "common/rng.hpp"
#include "config/config.hpp"
#include "io/checkpoint.hpp"
#include "model/gpt.hpp"
#include "parallel/comm.hpp"
#include "pipeline/executor.hpp"
#include "train/evaluate.hpp"

namespace tessera {

namespace {

// The whole model on this one rank, whatever layout wrote the checkpoint.
struct LoadedModel {
  CheckpointInfo info;
  LocalLayout layout;
  std::vector<float> params;
};

LoadedModel load_model(const std::string& checkpoint) {
  const std::string path = resolve_checkpoint(checkpoint);
  if (path.empty())
    throw UserError("cannot read checkpoint " + checkpoint + ": no such file or directory", kExitIO);
  LoadedModel m;
  m.info = read_checkpoint_info(path);
  m.layout = make_local_layout(m.info.shape, 1, 0, 0, m.info.shape.n_layer, true, true);
  m.params.resize(m.layout.total);
  read_checkpoint(MPI_COMM_SELF, path, m.layout, true, {m.params.data(), nullptr, nullptr});
  return m;
}

}  // namespace

void sample_text(const std::string& checkpoint, const SampleOptions& opt) {
  LoadedModel m = load_model(checkpoint);
  const ModelShape& s = m.layout.canonical.shape;
  if (m.info.tokenizer.type != "byte")
    throw UserError(m.info.path + ": tokenizer '" + m.info.tokenizer.type +
                    "' cannot be decoded by this tessera");
  std::vector<int32_t> context;
  for (unsigned char c : opt.prompt) context.push_back(c);
  if (context.empty()) context.push_back(int32_t(m.info.tokenizer.eot));
  std::fwrite(opt.prompt.data(), 1, opt.prompt.size(), stdout);

  Comm single;
  Gpt model(m.layout, &single, 1, s.block_size, 1);
  const uint64_t key = stream_key(opt.seed, "sample");
  std::vector<double> p(size_t(s.vocab_size));
  for (int i = 0; i < opt.tokens; ++i) {
    // The model sees at most block_size positions: the oldest tokens fall off the front.
    const int T = std::min<int>(int(context.size()), s.block_size);
    model.forward(m.params.data(), 0, context.data() + context.size() - T, nullptr, 1, T);
    const float* logits = model.logits(0) + size_t(T - 1) * s.vocab_size;
    int next = 0;
    if (opt.temperature <= 0) {
      next = int(std::max_element(logits, logits + s.vocab_size) - logits);
    } else {
      const float top = *std::max_element(logits, logits + s.vocab_size);
      double total = 0;
      for (int v = 0; v < s.vocab_size; ++v)
        total += p[v] = std::exp((logits[v] - top) / opt.temperature);
      double u = counter_uniform(key, uint64_t(i)) * total;
      next = s.vocab_size - 1;
      for (int v = 0; v < s.vocab_size; ++v)
        if ((u -= p[v]) < 0) { next = v; break; }
    }
    if (next == m.info.tokenizer.eot) break;
    context.push_back(next);
    if (next < 256) std::fputc(next, stdout);
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void eval_checkpoint(const std::string& checkpoint, const std::string& data, int batches) {
  LoadedModel m = load_model(checkpoint);
  const Config deck = parse_deck(m.info.deck_yaml, m.info.path + ":/deck", {});
  const int T = deck.data.seq_len;
  const int B = deck.train.batch_size;
  const int mb = deck.train.micro_batch > 0 ? deck.train.micro_batch : B;
  if (batches <= 0) batches = deck.eval.batches;
  TokenFile file(data);
  const uint64_t windows = eval_windows(file, T, B, batches);
  Comm single;
  Gpt model(m.layout, &single, mb, T, 1);
  PipelineExecutor executor(model, &single, {}, mb, T);
  const double loss = evaluate_loss_sum(executor, m.params.data(), file, mb, T,
                                        m.layout.canonical.shape.vocab_size, 0, windows) /
                      double(windows / uint64_t(mb));
  std::printf("eval: %s (step %lld) on %s: %llu windows of %d tokens: loss %.6f\n",
              m.info.path.c_str(), (long long)m.info.state.step, data.c_str(),
              (unsigned long long)windows, T + 1, loss);
}

}  // namespace tessera
