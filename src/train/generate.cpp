#include "train/generate.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "backend/cpu/backend.hpp"
#include "common/error.hpp"
#include "common/memory.hpp"
#include "common/rng.hpp"
#include "config/config.hpp"
#include "engine/engine.hpp"
#include "io/checkpoint.hpp"
#include "io/eval_data.hpp"
#include "io/token_file.hpp"
#include "io/tokenizer.hpp"
#include "model/gpt.hpp"
#include "parallel/comm.hpp"
#include "train/heartbeat.hpp"

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
  require_host_memory(m.layout.total * sizeof(float), "the model of " + path);
  m.params.resize(m.layout.total);
  read_checkpoint(MPI_COMM_SELF, path, m.layout, true, {m.params.data(), nullptr, nullptr});
  return m;
}

// The length of text without its trailing U+FFFD characters: what sentencepiece decodes from
// bytes of a character not yet complete, which the next ids may still complete.
size_t stable_length(const std::string& text) {
  static const std::string kReplacement = "\xEF\xBF\xBD";
  size_t n = text.size();
  while (n >= kReplacement.size() &&
         text.compare(n - kReplacement.size(), kReplacement.size(), kReplacement) == 0)
    n -= kReplacement.size();
  return n;
}

}  // namespace

void sample_text(const std::string& checkpoint, const SampleOptions& opt) {
  LoadedModel m = load_model(checkpoint);
  const ModelShape& s = m.layout.canonical.shape;
  // The prompt is encoded, and the ids decoded, with the tokenizer of the training data (or of
  // the token file --tokenizer names, when it agrees with the checkpoint's).
  TokenizerInfo info = m.info.tokenizer;
  std::string where = m.info.path;
  if (!opt.tokenizer.empty()) {
    const TokenFile file(opt.tokenizer);
    if (std::string e = tokenizer_mismatch(file.tokenizer(), "--tokenizer " + opt.tokenizer,
                                           m.info.tokenizer, "the checkpoint " + m.info.path);
        !e.empty())
      throw UserError("tessera sample: " + e);
    info = file.tokenizer();
    where = opt.tokenizer;
  }
  if (info.vocab_size > s.vocab_size)
    throw UserError("tessera sample: " + where + " has a tokenizer of vocab_size " +
                    std::to_string(info.vocab_size) + ", more ids than the model of " +
                    m.info.path + " has (" + std::to_string(s.vocab_size) +
                    "): not the tokenizer it was trained with");
  const Tokenizer tokenizer(info, where);
  std::vector<int32_t> context;
  if (tokenizer.bos() >= 0) context.push_back(int32_t(tokenizer.bos()));
  for (int32_t id : tokenizer.encode(opt.prompt)) context.push_back(id);
  if (context.empty()) {
    if (info.eot < 0)
      throw UserError(where + ": its tokenizer records no end-of-text token to start from: "
                      "give a --prompt");
    context.push_back(int32_t(info.eot));
  }
  std::fwrite(opt.prompt.data(), 1, opt.prompt.size(), stdout);
  std::fflush(stdout);
  // Text is printed as it is generated: the decoded text of the prompt and the new ids, past what
  // the prompt alone decodes to, less a character whose bytes are not all there yet.
  const size_t prompt_ids = context.size();
  const std::string prompt_text = tokenizer.decode(context);
  size_t printed = prompt_text.size();
  auto print_new_text = [&](bool final) {
    const std::string text = tokenizer.decode(context);
    const size_t end = final ? text.size() : stable_length(text);
    if (end > printed && text.compare(0, prompt_text.size(), prompt_text) == 0) {
      std::fwrite(text.data() + printed, 1, end - printed, stdout);
      std::fflush(stdout);
      printed = end;
    }
  };

  Comm single;
  Arena arena(CpuBackend::memory());
  Gpt<CpuBackend> model(m.layout, &single, 1, s.block_size, 1, arena);
  require_host_memory(arena.total_bytes() + m.params.size() * sizeof(float),
                      "sampling from " + m.info.path);
  arena.allocate();
  model.bind();
  const uint64_t key = stream_key(opt.seed, "sample");
  std::vector<double> p(size_t(s.vocab_size));
  for (int i = 0; i < opt.tokens; ++i) {
    // The model sees at most block_size positions: the oldest tokens fall off the front.
    const int T = std::min<int>(int(context.size()), s.block_size);
    FlatWeights<float> weights(m.layout, m.params.data(), nullptr);
    model.forward(weights, 0, context.data() + context.size() - T, nullptr, nullptr, 1, T);
    const float* logits = model.logits(0) + size_t(T - 1) * model.head_columns();
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
    if (next == info.eot) break;
    context.push_back(next);
    if (info.type == "byte") {
      if (next < 256) std::fputc(next, stdout);
    } else {
      print_new_text(false);
    }
  }
  if (context.size() > prompt_ids && info.type != "byte") print_new_text(true);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void eval_checkpoint(const std::string& checkpoint, const std::string& data, int batches) {
  const Heartbeat beat(true, "eval: " + checkpoint + " on " + data);
  LoadedModel m = load_model(checkpoint);
  // The deck stored with the weights gives the sequence length, batch and data format. Where its
  // text is damaged (the tensors being intact), the defaults with the model's block size do, and
  // the log says so.
  Config deck;
  try {
    deck = parse_deck(m.info.deck_yaml, m.info.path + ":/deck", {});
  } catch (const UserError& e) {
    deck = Config{};
    deck.data.seq_len = std::min(m.info.shape.block_size, 1024);
    deck.train.micro_batch = 0;
    std::printf("eval: warning: the deck stored in %s cannot be read (%s): evaluating with the "
                "default deck, seq_len %d, batch_size %d\n", m.info.path.c_str(), e.what(),
                deck.data.seq_len, deck.train.batch_size);
  }
  const int T = deck.data.seq_len;
  const int B = deck.train.batch_size;
  const int mb = deck.train.micro_batch > 0 ? deck.train.micro_batch : B;
  if (batches <= 0) batches = deck.eval.batches;
  TokenSource file(data, deck.data.format, deck.data.dtype);
  // Ids of another tokenizer would give a loss that means nothing (train refuses the same mix).
  if (std::string e = tokenizer_mismatch(file.tokenizer(), "--data " + data, m.info.tokenizer,
                                         "the checkpoint " + m.info.path);
      !e.empty())
    throw UserError("tessera eval: " + e);
  const uint64_t windows = eval_windows(file, T, B, batches);
  // The trainer's own evaluation, on one rank of the CPU backend.
  const EngineSetup setup{.tile = m.layout,
                          .micro_batch = mb,
                          .seq_len = T,
                          .n_micro = 1,
                          .model = model_options(deck)};
  const std::unique_ptr<TrainEngine> engine =
      make_engine(setup, EngineKind::cpu, Allocation::later);
  require_host_memory(engine->host_bytes() + m.params.size() * sizeof(float),
                      "evaluating " + m.info.path);
  engine->allocate();
  std::copy(m.params.begin(), m.params.end(), engine->host_params());
  engine->params_to_device();
  const double loss =
      engine->eval_loss_sum(file, m.layout.canonical.shape.vocab_size, 0, windows) /
      double(windows / uint64_t(mb));
  std::printf("eval: %s (step %lld) on %s: %llu windows of %d tokens: loss %.6f\n",
              m.info.path.c_str(), (long long)m.info.state.step, data.c_str(),
              (unsigned long long)windows, T + 1, loss);
}

}  // namespace tessera
