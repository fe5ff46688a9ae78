// The input deck: defaults, every key, every error class with its exact file:line:col, overrides,
// load_deck's I/O errors and the to_yaml round trip.
#include <gtest/gtest.h>

#include <filesystem>
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "config/config.hpp"

namespace tessera {
namespace {

const char* const kMinimal = "data:\n  train: t.h5\n";

// The message parse_deck throws for `text`; checks it is a one-line bad-input error.
std::string deck_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_deck(text, "deck.yaml", overrides);
  } catch (const UserError& e) {
    std::string message = e.what();
    EXPECT_EQ(e.exit_code, kExitBadInput) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  ADD_FAILURE() << "no error for deck:\n" << text;
  return "";
}

// Every field, so that a field added to Config and forgotten here shows up in review.
void expect_same(const Config& a, const Config& b) {
  EXPECT_EQ(a.model.n_layer, b.model.n_layer);
  const MoeConfig &ea = a.model.moe, &eb = b.model.moe;
  EXPECT_EQ(ea.experts, eb.experts);
  EXPECT_EQ(ea.top_k, eb.top_k);
  EXPECT_EQ(ea.ffn, eb.ffn);
  EXPECT_EQ(ea.shared_experts, eb.shared_experts);
  EXPECT_EQ(ea.every, eb.every);
  EXPECT_EQ(ea.first_dense, eb.first_dense);
  EXPECT_EQ(ea.score, eb.score);
  EXPECT_EQ(ea.renormalize, eb.renormalize);
  EXPECT_EQ(ea.aux_loss, eb.aux_loss);
  EXPECT_EQ(ea.z_loss, eb.z_loss);
  EXPECT_EQ(ea.bias_rate, eb.bias_rate);
  EXPECT_EQ(ea.capacity_factor, eb.capacity_factor);
  EXPECT_EQ(a.parallel.ep, b.parallel.ep);
  EXPECT_EQ(a.device.expert_gemm, b.device.expert_gemm);
  EXPECT_EQ(a.model.n_head, b.model.n_head);
  EXPECT_EQ(a.model.n_embd, b.model.n_embd);
  EXPECT_EQ(a.model.block_size, b.model.block_size);
  EXPECT_EQ(a.model.vocab_size, b.model.vocab_size);
  EXPECT_EQ(a.model.vocab_multiple, b.model.vocab_multiple);
  EXPECT_EQ(a.model.init_std, b.model.init_std);
  EXPECT_EQ(a.model.qk_norm, b.model.qk_norm);
  EXPECT_EQ(a.data.train, b.data.train);
  EXPECT_EQ(a.data.val, b.data.val);
  EXPECT_EQ(a.data.seq_len, b.data.seq_len);
  EXPECT_EQ(a.data.format, b.data.format);
  EXPECT_EQ(a.data.dtype, b.data.dtype);
  EXPECT_EQ(a.data.prefetch, b.data.prefetch);
  EXPECT_EQ(a.data.readers, b.data.readers);
  EXPECT_EQ(a.data.direct_io, b.data.direct_io);
  EXPECT_EQ(a.data.check_tokens, b.data.check_tokens);
  EXPECT_EQ(a.data.trace, b.data.trace);
  EXPECT_EQ(a.data.document_mask, b.data.document_mask);
  EXPECT_EQ(a.data.windows, b.data.windows);
  EXPECT_EQ(a.train.steps, b.train.steps);
  EXPECT_EQ(a.train.batch_size, b.train.batch_size);
  EXPECT_EQ(a.train.micro_batch, b.train.micro_batch);
  EXPECT_EQ(a.train.seed, b.train.seed);
  EXPECT_EQ(a.train.anomaly_window, b.train.anomaly_window);
  EXPECT_EQ(a.train.anomaly_sigma, b.train.anomaly_sigma);
  EXPECT_EQ(a.train.anomaly_action, b.train.anomaly_action);
  EXPECT_EQ(a.train.anomaly_max_rollbacks, b.train.anomaly_max_rollbacks);
  EXPECT_EQ(a.optim.lr, b.optim.lr);
  EXPECT_EQ(a.optim.min_lr, b.optim.min_lr);
  EXPECT_EQ(a.optim.warmup_steps, b.optim.warmup_steps);
  EXPECT_EQ(a.optim.decay_steps, b.optim.decay_steps);
  EXPECT_EQ(a.optim.weight_decay, b.optim.weight_decay);
  EXPECT_EQ(a.optim.beta1, b.optim.beta1);
  EXPECT_EQ(a.optim.beta2, b.optim.beta2);
  EXPECT_EQ(a.optim.eps, b.optim.eps);
  EXPECT_EQ(a.optim.grad_clip, b.optim.grad_clip);
  EXPECT_EQ(a.eval.every, b.eval.every);
  EXPECT_EQ(a.eval.batches, b.eval.batches);
  EXPECT_EQ(a.checkpoint.dir, b.checkpoint.dir);
  EXPECT_EQ(a.checkpoint.every, b.checkpoint.every);
  EXPECT_EQ(a.checkpoint.restart, b.checkpoint.restart);
  EXPECT_EQ(a.checkpoint.collective_bytes, b.checkpoint.collective_bytes);
  EXPECT_EQ(a.checkpoint.init_from, b.checkpoint.init_from);
  EXPECT_EQ(a.checkpoint.reserve, b.checkpoint.reserve);
  EXPECT_EQ(a.checkpoint.keep, b.checkpoint.keep);
  EXPECT_EQ(a.checkpoint.async, b.checkpoint.async);
  EXPECT_EQ(a.log.every, b.log.every);
  EXPECT_EQ(a.log.peak_gflops, b.log.peak_gflops);
  EXPECT_EQ(a.run.dir, b.run.dir);
  EXPECT_EQ(a.run.max_minutes, b.run.max_minutes);
  EXPECT_EQ(a.run.hang_timeout, b.run.hang_timeout);
  EXPECT_EQ(a.device.backend, b.device.backend);
  EXPECT_EQ(a.device.precision, b.device.precision);
  EXPECT_EQ(a.device.threads, b.device.threads);
  EXPECT_EQ(a.parallel.dp, b.parallel.dp);
  EXPECT_EQ(a.parallel.tp, b.parallel.tp);
  EXPECT_EQ(a.parallel.pp, b.parallel.pp);
  EXPECT_EQ(a.parallel.schedule, b.parallel.schedule);
  EXPECT_EQ(a.parallel.zero, b.parallel.zero);
  EXPECT_EQ(a.parallel.stage_layers, b.parallel.stage_layers);
  EXPECT_EQ(a.parallel.zero_group, b.parallel.zero_group);
  EXPECT_EQ(a.parallel.reshard_after_forward, b.parallel.reshard_after_forward);
  EXPECT_EQ(a.parallel.zero_prefetch, b.parallel.zero_prefetch);
}

TEST(Config, MinimalDeckTakesEveryDefault) {
  Config c = parse_deck(kMinimal, "deck.yaml", {});
  Config expected;
  expected.data.train = "t.h5";
  expect_same(c, expected);
  EXPECT_EQ(c.deck_path, "");
  // The defaults input/README.md documents.
  EXPECT_EQ(c.model.n_layer, 4);
  EXPECT_EQ(c.model.n_embd, 128);
  EXPECT_EQ(c.data.seq_len, 128);
  EXPECT_EQ(c.train.seed, 1337u);
  EXPECT_EQ(c.optim.lr, 1e-3);
  EXPECT_EQ(c.checkpoint.restart, "auto");
  EXPECT_EQ(c.run.dir, "runs/default");
  EXPECT_EQ(c.device.backend, DeviceBackend::Cpu);
  EXPECT_EQ(c.parallel.dp, 1);
  EXPECT_EQ(c.parallel.tp, 1);
  EXPECT_EQ(c.parallel.pp, 1);
  EXPECT_EQ(c.parallel.schedule, ScheduleKind::OneFOneB);
  EXPECT_EQ(c.parallel.zero, 0);
  EXPECT_TRUE(c.parallel.stage_layers.empty());
}

TEST(Config, EveryKeyReachesItsField) {
  const char* text =
      "model:\n  n_layer: 2\n  n_head: 3\n  n_embd: 96\n  block_size: 64\n  vocab_size: 500\n"
      "  vocab_multiple: 32\n  init_std: 0.01\n"
      "data:\n  train: a.h5\n  val: b.h5\n  format: raw\n  dtype: uint32\n  seq_len: 48\n"
      "  prefetch: 2\n  readers: 3\n  direct_io: false\n  check_tokens: false\n  trace: true\n"
      "  document_mask: true\n  windows: documents\n"
      "train:\n  steps: 7\n  batch_size: 12\n  micro_batch: 4\n  seed: 42\n"
      "  anomaly_window: 9\n  anomaly_sigma: 2.5\n  anomaly_action: rollback\n  anomaly_max_rollbacks: 7\n"
      "optim:\n  lr: 6e-4\n  min_lr: 6e-5\n  warmup_steps: 5\n  decay_steps: 70\n"
      "  weight_decay: 0.05\n  beta1: 0.8\n  beta2: 0.99\n  eps: 1e-6\n  grad_clip: 0.5\n"
      "eval:\n  every: 3\n  batches: 2\n"
      "checkpoint:\n  dir: ck\n  every: 4\n  restart: none\n  collective_bytes: 4096\n"
      "  init_from: gpt2.h5\n"
      "  reserve: false\n  keep: 3\n  async: true\n"
      "log:\n  every: 1\n  peak_gflops: 250.5\n"
      "run:\n  dir: r\n  max_minutes: 1.5\n  hang_timeout: 90\n"
      "device:\n  backend: auto\n  precision: bf16\n  threads: 2\n"
      "parallel:\n  dp: 3\n  tp: 3\n  pp: 2\n  schedule: gpipe\n  zero: 1\n"
      "  stage_layers: [1, 1]\n";
  Config c = parse_deck(text, "deck.yaml", {});
  Config e;
  e.model.n_layer = 2, e.model.n_head = 3, e.model.n_embd = 96, e.model.block_size = 64;
  e.model.vocab_size = 500, e.model.vocab_multiple = 32, e.model.init_std = 0.01;
  e.data.train = "a.h5";
  e.data.val = "b.h5";
  e.data.seq_len = 48;
  e.data.format = "raw";
  e.data.dtype = "uint32";
  e.data.prefetch = 2;
  e.data.readers = 3;
  e.data.direct_io = false;
  e.data.check_tokens = false;
  e.data.trace = true;
  e.data.document_mask = true;
  e.data.windows = Windows::Documents;
  e.train = {7, 12, 4, 42};
  e.train.anomaly_window = 9;
  e.train.anomaly_sigma = 2.5;
  e.train.anomaly_action = AnomalyAction::Rollback;
  e.train.anomaly_max_rollbacks = 7;
  e.optim = {6e-4, 6e-5, 5, 70, 0.05, 0.8, 0.99, 1e-6, 0.5};
  e.eval = {3, 2};
  e.checkpoint = {"ck", 4, "none", 4096, "gpt2.h5", false, 3, true};
  e.log = {1, 250.5};
  e.run = RunConfig{"r", 1.5, 90};  // not `e.run.dir = "r"`: GCC 12 -O3 warns falsely (-Wrestrict)
  e.device = {DeviceBackend::Auto, Precision::Bf16, 2};
  e.parallel = {3, 3, 2, ScheduleKind::GPipe, 1, {1, 1}};
  expect_same(c, e);
}

TEST(Config, EmptySectionsAndFlowMapsAreFine) {
  Config c = parse_deck("eval:\ndata: {train: t.h5, seq_len: 32}\n", "deck.yaml", {});
  EXPECT_EQ(c.data.train, "t.h5");
  EXPECT_EQ(c.data.seq_len, 32);
  EXPECT_EQ(c.eval.batches, 8);
}

TEST(Config, NumbersAndStrings) {
  Config c = parse_deck(
      "data:\n  train: 123\n  val: 'my file.h5'\n"
      "optim:\n  lr: 3e-4\n  min_lr: 0\n  eps: 1E-8\n  beta1: +.5\n  beta2: 0.\n  grad_clip: 2\n"
      "train:\n  steps: +10\n  micro_batch: 0\n  seed: 18446744073709551615\n"
      "model:\n  vocab_size: -0\n",
      "deck.yaml", {});
  EXPECT_EQ(c.data.train, "123");
  EXPECT_EQ(c.data.val, "my file.h5");
  EXPECT_EQ(c.optim.lr, 3e-4);
  EXPECT_EQ(c.optim.min_lr, 0.0);
  EXPECT_EQ(c.optim.eps, 1e-8);
  EXPECT_EQ(c.optim.beta1, 0.5);
  EXPECT_EQ(c.optim.beta2, 0.0);
  EXPECT_EQ(c.optim.grad_clip, 2.0);
  EXPECT_EQ(c.train.steps, 10);
  EXPECT_EQ(c.train.seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(c.model.vocab_size, 0);
}

TEST(Config, SyntaxErrorsCarryYamlCppPosition) {
  // yaml-cpp reports the unclosed '[' where the input ends: line 5, column 1.
  EXPECT_EQ(deck_error("data:\n  train: t.h5\nmodel:\n  n_layer: [1\n"),
            "deck.yaml:5:1: end of sequence flow not found");
  // A tab in indentation: yaml-cpp stops at the value after it.
  EXPECT_EQ(deck_error("data:\n\ttrain: t.h5\n"), "deck.yaml:2:7: illegal map value");
  EXPECT_EQ(deck_error("data:\n  train: a: b\n"), "deck.yaml:2:11: illegal map value");
}

TEST(Config, UnknownKeysSuggestTheNearestName) {
  EXPECT_EQ(deck_error("data: {train: t.h5}\nmodel:\n  n_layers: 3\n"),
            "deck.yaml:3:3: model.n_layers: unknown key (did you mean model.n_layer?)");
  EXPECT_EQ(deck_error("data: {train: t.h5}\nmodel:\n  n_layer: 3\n  n_haed: 2\n"),
            "deck.yaml:4:3: model.n_haed: unknown key (did you mean model.n_head?)");
  // A key under the wrong section finds its own.
  EXPECT_EQ(deck_error("data: {train: t.h5}\ntrain:\n  lr: 0.1\n"),
            "deck.yaml:3:3: train.lr: unknown key (did you mean optim.lr?)");
  EXPECT_EQ(deck_error("data: {train: t.h5}\nmodel:\n  seq_len: 64\n"),
            "deck.yaml:3:3: model.seq_len: unknown key (did you mean data.seq_len?)");
  EXPECT_EQ(deck_error("data: {train: t.h5}\ntrain:\n  xyzzy: 3\n"),
            "deck.yaml:3:3: train.xyzzy: unknown key (train has: steps, batch_size, micro_batch, "
            "seed, recompute, anomaly_window, anomaly_sigma, anomaly_action, anomaly_max_rollbacks)");
}

TEST(Config, UnknownSectionsSuggestTheNearestName) {
  EXPECT_EQ(deck_error("data: {train: t.h5}\nmodle:\n  n_layer: 3\n"),
            "deck.yaml:2:1: modle: unknown section (did you mean model?)");
  EXPECT_EQ(deck_error("data: {train: t.h5}\nsteps: 10\n"),
            "deck.yaml:2:1: steps: unknown section (did you mean train.steps? keys go inside "
            "their section)");
  EXPECT_EQ(deck_error("data: {train: t.h5}\nfoo:\n  a: 1\n"),
            "deck.yaml:2:1: foo: unknown section (sections: model, data, train, optim, eval, "
            "checkpoint, log, run, device, parallel)");
  EXPECT_EQ(deck_error("data: {train: t.h5}\nparalel:\n  dp: 2\n"),
            "deck.yaml:2:1: paralel: unknown section (did you mean parallel?)");
}

TEST(Config, DuplicatesAreRefused) {
  EXPECT_EQ(deck_error("data:\n  train: a.h5\n  seq_len: 8\n  train: b.h5\n"),
            "deck.yaml:4:3: data.train: duplicate key (first at line 2)");
  EXPECT_EQ(deck_error("data:\n  train: a.h5\nmodel:\n  n_layer: 2\ndata:\n  val: b.h5\n"),
            "deck.yaml:5:1: data: duplicate section (first at line 1)");
}

TEST(Config, StructureErrors) {
  EXPECT_EQ(deck_error("data:\n  train: t\nmodel: 3\n"),
            "deck.yaml:3:8: model: expected a map of keys, got '3'");
  EXPECT_EQ(deck_error("data:\n  train: t\nmodel: [1, 2]\n"),
            "deck.yaml:3:8: model: expected a map of keys, got a sequence");
  EXPECT_EQ(deck_error("- data\n- model\n"),
            "deck.yaml:1:1: expected a map of sections (model:, data:, ...), got a sequence");
  EXPECT_EQ(deck_error("hello\n"),
            "deck.yaml:1:1: expected a map of sections (model:, data:, ...), got 'hello'");
  EXPECT_EQ(deck_error("data:\n  train: t\n---\nmodel:\n  n_layer: 2\n"),
            "deck.yaml:4:1: expected one YAML document, found a second");
  // A trailing document marker is harmless.
  EXPECT_EQ(parse_deck("data:\n  train: t\n---\n", "deck.yaml", {}).data.train, "t");
}

TEST(Config, MissingTrainData) {
  const std::string missing =
      "data.train: required key missing (the HDF5 token file made by tools/data/prepare_data.py)";
  EXPECT_EQ(deck_error(""), "deck.yaml:1:1: " + missing);
  EXPECT_EQ(deck_error("# only a comment\n\n"), "deck.yaml:1:1: " + missing);
  EXPECT_EQ(deck_error("model:\n  n_layer: 2\n"), "deck.yaml:1:1: " + missing);
  // With a data section, at that section.
  EXPECT_EQ(deck_error("model:\n  n_layer: 2\ndata:\n  val: v.h5\n"), "deck.yaml:3:1: " + missing);
  EXPECT_EQ(deck_error("data:\n  train: \"\"\n"),
            "deck.yaml:2:10: data.train: must not be empty (the training token file)");
}

TEST(Config, WrongTypes) {
  auto in_train = [](const std::string& line) {
    return std::string(kMinimal) + "train:\n  " + line + "\n";
  };
  EXPECT_EQ(deck_error(in_train("steps: ten")),
            "deck.yaml:4:10: train.steps: expected an integer, got 'ten'");
  EXPECT_EQ(deck_error(in_train("steps: 1.5")),
            "deck.yaml:4:10: train.steps: expected an integer, got '1.5'");
  EXPECT_EQ(deck_error(in_train("steps: 1e3")),
            "deck.yaml:4:10: train.steps: expected an integer, got '1e3'");
  EXPECT_EQ(deck_error(in_train("steps: 0x10")),
            "deck.yaml:4:10: train.steps: expected an integer, got '0x10'");
  EXPECT_EQ(deck_error(in_train("steps: 99999999999")),
            "deck.yaml:4:10: train.steps: expected an integer from -2147483648 to 2147483647, got "
            "'99999999999'");
  // An empty value points at its key: yaml-cpp gives it no position of its own.
  EXPECT_EQ(deck_error(in_train("steps:")),
            "deck.yaml:4:3: train.steps: expected an integer, got nothing");
  EXPECT_EQ(deck_error(in_train("steps: {a: 1}")),
            "deck.yaml:4:10: train.steps: expected an integer, got a map");
  EXPECT_EQ(deck_error(in_train("batch_size: [1]")),
            "deck.yaml:4:15: train.batch_size: expected an integer, got a sequence");
  const std::string seed_range = "expected an integer from 0 to 18446744073709551615, got ";
  EXPECT_EQ(deck_error(in_train("seed: -1")), "deck.yaml:4:9: train.seed: " + seed_range + "'-1'");
  EXPECT_EQ(deck_error(in_train("seed: 18446744073709551616")),
            "deck.yaml:4:9: train.seed: " + seed_range + "'18446744073709551616'");
  EXPECT_EQ(deck_error(in_train("seed: 1.5")),
            "deck.yaml:4:9: train.seed: " + seed_range + "'1.5'");

  auto in_optim = [](const std::string& line) {
    return std::string(kMinimal) + "optim:\n  " + line + "\n";
  };
  EXPECT_EQ(deck_error(in_optim("lr: fast")),
            "deck.yaml:4:7: optim.lr: expected a number, got 'fast'");
  EXPECT_EQ(deck_error(in_optim("lr: .inf")),
            "deck.yaml:4:7: optim.lr: expected a number, got '.inf'");
  EXPECT_EQ(deck_error(in_optim("lr: nan")),
            "deck.yaml:4:7: optim.lr: expected a number, got 'nan'");
  EXPECT_EQ(deck_error(in_optim("lr: 1e999")),
            "deck.yaml:4:7: optim.lr: expected a number within the range of a double, got '1e999'");

  EXPECT_EQ(
      deck_error("data:\n  train: t\n  val:\n"),
      "deck.yaml:3:3: data.val: expected a string, got nothing (write \"\" for an empty one)");
  EXPECT_EQ(deck_error("data:\n  train: [a, b]\n"),
            "deck.yaml:2:10: data.train: expected a string, got a sequence");
}

TEST(Config, MessagesStayOnOneLine) {
  EXPECT_EQ(deck_error("data:\n  train: t\n  \"x\\ny\": 1\n"),
            "deck.yaml:3:3: data.x\\ny: unknown key (data has: train, val, format, dtype, seq_len, prefetch, readers, direct_io, check_tokens, trace, document_mask, windows)");
  EXPECT_EQ(deck_error("data:\n  train: t\ndevice:\n  backend: \"g\\tp\\x01u\"\n"),
            "deck.yaml:4:12: device.backend: must be cpu, cuda or auto, got 'g\\tp\\x01u'");
}

// The deck's words become enums where the deck is read, and to_yaml spells them back; the parser
// is exact (no case folding, no trailing space).
TEST(Config, DeckWordsAreTyped) {
  const Config c = parse_deck(std::string(kMinimal) +
                                  "model: {attention: fused}\n"
                                  "train: {recompute: selective, anomaly_action: rollback}\n"
                                  "device: {backend: auto, precision: fp8, fp8_format: e4m3, "
                                  "fp8_amax_algo: most_recent}\n"
                                  "parallel: {schedule: gpipe, cp_comm: allgather}\n",
                              "deck.yaml", {});
  EXPECT_EQ(c.model.attention, Attention::Fused);
  EXPECT_EQ(c.train.recompute, Recompute::Selective);
  EXPECT_EQ(c.train.anomaly_action, AnomalyAction::Rollback);
  EXPECT_EQ(c.device.backend, DeviceBackend::Auto);
  EXPECT_EQ(c.device.precision, Precision::Fp8);
  EXPECT_EQ(c.device.fp8_format, Fp8Recipe::E4M3);
  EXPECT_EQ(c.device.fp8_amax_algo, AmaxAlgo::MostRecent);
  EXPECT_EQ(c.parallel.schedule, ScheduleKind::GPipe);
  EXPECT_EQ(c.parallel.cp_comm, CpComm::AllGather);
  EXPECT_STREQ(deck_word(c.parallel.schedule), "gpipe");
  EXPECT_STREQ(deck_word(ScheduleKind::OneFOneB), "1f1b");
  EXPECT_STREQ(deck_word(c.device.fp8_amax_algo), "most_recent");
  const std::string yaml = to_yaml(c);
  EXPECT_NE(yaml.find("  schedule: \"gpipe\"\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("  fp8_amax_algo: \"most_recent\"\n"), std::string::npos) << yaml;
  expect_same(parse_deck(yaml, "resolved.yaml", {}), c);
  for (const char* bad : {"GPipe", "1F1B", "interleaved"})
    EXPECT_EQ(deck_error(std::string(kMinimal) + "parallel:\n  schedule: " + bad + "\n"),
              "deck.yaml:4:13: parallel.schedule: must be gpipe or 1f1b, got '" +
                  std::string(bad) + "'");
  EXPECT_EQ(deck_error(std::string(kMinimal) + "parallel:\n  schedule: \"1f1b \"\n"),
            "deck.yaml:4:13: parallel.schedule: must be gpipe or 1f1b, got '1f1b '");
  EXPECT_EQ(restart_from(c.checkpoint), RestartFrom::Auto);
  CheckpointConfig k;
  k.restart = "none";
  EXPECT_EQ(restart_from(k), RestartFrom::None);
  k.restart = "runs/x/checkpoints";
  EXPECT_EQ(restart_from(k), RestartFrom::Path);
}

struct RangeCase {
  const char* section;
  const char* key;
  const char* value;
  const char* problem;
};

// Each single-key rule, with the value as the first key of its section: line 2, column len+5.
TEST(Config, RangeRules) {
  const RangeCase cases[] = {
      {"model", "n_layer", "0", "must be >= 1, got 0"},
      {"model", "n_head", "0", "must be >= 1, got 0"},
      {"model", "n_embd", "-4", "must be >= 1, got -4"},
      {"model", "block_size", "0", "must be >= 1, got 0"},
      {"model", "vocab_size", "-1", "must be >= 0, got -1"},
      {"model", "vocab_multiple", "0", "must be >= 1, got 0"},
      {"model", "init_std", "0", "must be > 0, got 0"},
      {"model", "init_std", "-0.5", "must be > 0, got -0.5"},
      {"model", "attention", "flash", "must be gemm or fused, got 'flash'"},
      {"model", "arch", "llama2", "must be gpt2 or llama, got 'llama2'"},
      {"model", "n_kv_head", "-1", "must be >= 0, got -1"},
      {"model", "ffn_hidden", "-1", "must be >= 0, got -1"},
      {"model", "ffn_multiple", "0", "must be >= 1, got 0"},
      {"model", "tie_embeddings", "maybe", "must be auto, true or false, got 'maybe'"},
      {"model", "norm_eps", "0", "must be > 0, got 0"},
      {"model", "rope_theta", "-1", "must be > 0, got -1"},
      {"train", "recompute", "some", "must be none, selective or full, got 'some'"},
      {"train", "anomaly_window", "1", "must be >= 2, got 1"},
      {"train", "anomaly_window", "100001",
       "must be <= 100000 (a window of steps kept in memory), got 100001"},
      {"train", "anomaly_sigma", "-1", "must be >= 0, got -1"},
      {"train", "anomaly_action", "ignore", "must be stop, skip or rollback, got 'ignore'"},
      {"train", "anomaly_max_rollbacks", "0", "must be >= 1, got 0"},
      {"checkpoint", "keep", "-1", "must be >= 0, got -1"},
      {"run", "hang_timeout", "-1", "must be >= 0, got -1"},
      {"data", "seq_len", "0", "must be >= 1, got 0"},
      {"train", "steps", "-1", "must be >= 0, got -1"},
      {"train", "batch_size", "0", "must be >= 1, got 0"},
      {"train", "micro_batch", "-2", "must be >= 0, got -2"},
      {"optim", "lr", "0", "must be > 0, got 0"},
      {"optim", "lr", "-1e-3", "must be > 0, got -0.001"},
      {"optim", "min_lr", "-1e-5", "must be >= 0, got -1e-05"},
      {"optim", "warmup_steps", "-1", "must be >= 0, got -1"},
      {"optim", "decay_steps", "-1", "must be >= 0, got -1"},
      {"optim", "weight_decay", "-0.1", "must be >= 0, got -0.1"},
      {"optim", "beta1", "1", "must be in [0, 1), got 1"},
      {"optim", "beta1", "-0.1", "must be in [0, 1), got -0.1"},
      {"optim", "beta2", "1.5", "must be in [0, 1), got 1.5"},
      {"optim", "eps", "0", "must be > 0, got 0"},
      {"optim", "grad_clip", "-1", "must be >= 0, got -1"},
      {"eval", "every", "-1", "must be >= 0, got -1"},
      {"eval", "batches", "0", "must be >= 1, got 0"},
      {"checkpoint", "every", "-5", "must be >= 0, got -5"},
      {"checkpoint", "restart", "\"\"", "must not be empty (auto, none or a checkpoint path)"},
      {"log", "every", "0", "must be >= 1, got 0"},
      {"log", "peak_gflops", "-1", "must be >= 0, got -1"},
      {"run", "dir", "''", "must not be empty (the run directory)"},
      {"device", "backend", "gpu", "must be cpu, cuda or auto, got 'gpu'"},
      {"device", "threads", "-1", "must be >= 0, got -1"},
      {"parallel", "dp", "0", "must be >= 1 or auto, got 0"},
      {"parallel", "tp", "-2", "must be >= 1 or auto, got -2"},
      {"parallel", "pp", "0", "must be >= 1 or auto, got 0"},
      {"parallel", "schedule", "zb", "must be gpipe or 1f1b, got 'zb'"},
      {"parallel", "zero", "4", "must be 0, 1, 2 or 3, got 4"},
      {"parallel", "zero", "-1", "must be 0, 1, 2 or 3, got -1"},
      {"parallel", "zero_group", "-1", "must be >= 0, got -1"},
      {"parallel", "stage_layers", "[4, 0]", "every stage needs at least one layer, got [4, 0]"},
  };
  for (const RangeCase& c : cases) {
    std::string section = c.section, key = c.key;
    std::string text = section + ":\n  " + key + ": " + c.value + "\n" +
                       (section == "data" ? "  train: t.h5\n" : "data:\n  train: t.h5\n");
    std::string expected = "deck.yaml:2:" + std::to_string(key.size() + 5) + ": " + section + "." +
                           key + ": " + c.problem;
    EXPECT_EQ(deck_error(text), expected);
  }
  // The edges that are allowed.
  Config c =
      parse_deck(std::string(kMinimal) +
                     "train: {steps: 0, micro_batch: 0}\n"
                     "optim: {beta1: 0, beta2: 0.999, min_lr: 0.001, lr: 0.001, grad_clip: 0}\n"
                     "model: {vocab_size: 0, block_size: 128}\n",
                 "deck.yaml", {});
  EXPECT_EQ(c.optim.min_lr, c.optim.lr);
  EXPECT_EQ(c.data.seq_len, c.model.block_size);
}

// Every size and count has an upper bound, and its message says why; the bound itself is allowed.
TEST(Config, UpperBoundsWithTheirReason) {
  const RangeCase cases[] = {
      {"model", "n_layer", "1025", "must be <= 1024 (the deepest published GPTs have about 100), got 1025"},
      {"model", "n_head", "65537", "must be <= 65536 (the widest published models use 12288-25600), got 65537"},
      {"model", "n_embd", "100000", "must be <= 65536 (the widest published models use 12288-25600), got 100000"},
      {"model", "block_size", "1048577", "must be <= 1048576 (a learned position table of 1M rows), got 1048577"},
      {"model", "vocab_size", "2147483647", "must be <= 16777216 (the largest vocabularies in use have about 256k tokens), got 2147483647"},
      {"model", "vocab_multiple", "2147483647", "must be <= 65536 (padding wte further only wastes memory), got 2147483647"},
      {"data", "prefetch", "100000", "must be <= 256 (a few steps hide any disk's latency), got 100000"},
      {"data", "readers", "100000", "must be <= 256 (more threads than any disk has queues), got 100000"},
      {"device", "threads", "100000", "must be <= 1024 (more than any node has cores), got 100000"},
  };
  for (const RangeCase& c : cases) {
    std::string section = c.section, key = c.key;
    std::string text = section + ":\n  " + key + ": " + c.value + "\n" +
                       (section == "data" ? "  train: t.h5\n" : "data:\n  train: t.h5\n");
    std::string expected = "deck.yaml:2:" + std::to_string(key.size() + 5) + ": " + section + "." +
                           key + ": " + c.problem;
    EXPECT_EQ(deck_error(text), expected);
  }
  EXPECT_EQ(deck_error(std::string(kMinimal) + "train:\n  batch_size: 40000000\n"),
            "deck.yaml:4:15: train.batch_size: train.batch_size x data.seq_len = 40000000 x 128 "
            "tokens per step is more than 2147483647 (the ops count a step's positions in an int)");
  Config c = parse_deck(std::string(kMinimal) +
                            "model: {n_layer: 1024, n_embd: 65536, n_head: 65536, block_size: 1048576,"
                            " vocab_size: 16777216, vocab_multiple: 65536}\n"
                            "device: {threads: 1024}\n",
                        "deck.yaml", {"data.prefetch=256", "data.readers=256"});
  EXPECT_EQ(c.model.vocab_multiple, 65536);
}

// A quote left open swallowed the keys below it into one string; now it is refused on its line.
TEST(Config, UnterminatedQuotes) {
  EXPECT_EQ(deck_error("run:\n  dir: \"runs/x\ntrain:\n  steps: 10\ndata:\n  train: t.h5\n"),
            "deck.yaml:2:8: run.dir: the double-quoted value is not closed on its line (add the "
            "closing quote)");
  EXPECT_EQ(deck_error("data:\n  train: t.h5\n  val: 'v.h5\nrun:\n  dir: \"r\"\n"),
            "deck.yaml:3:8: data.val: the single-quoted value is not closed on its line (add the "
            "closing quote)");
  EXPECT_EQ(deck_error("parallel:\n  stage_layers: [\"1, 2]\n"),
            "deck.yaml:2:18: parallel.stage_layers: the double-quoted value is not closed on its "
            "line (add the closing quote)");
  // Quotes that do close, escaped quotes, quotes inside plain values and in comments are fine.
  Config c = parse_deck("data:\n  train: \"a \\\" # b\"  # it's\n  val: 'it''s'\n"
                        "run: {dir: x-\"y}\n# \"an open quote in a comment\n",
                        "deck.yaml", {});
  EXPECT_EQ(c.data.train, "a \" # b");
  EXPECT_EQ(c.data.val, "it's");
  EXPECT_EQ(c.run.dir, "x-\"y");
}

// A rule between two keys points at the later of them, or at the one given.
TEST(Config, CrossKeyRules) {
  EXPECT_EQ(
      deck_error(std::string(kMinimal) + "model:\n  n_embd: 100\n  n_head: 3\n"),
      "deck.yaml:5:11: model.n_head: model.n_embd = 100 is not a multiple of model.n_head = 3");
  EXPECT_EQ(
      deck_error(std::string(kMinimal) + "model:\n  n_head: 3\n  n_embd: 100\n"),
      "deck.yaml:5:11: model.n_embd: model.n_embd = 100 is not a multiple of model.n_head = 3");
  EXPECT_EQ(
      deck_error(std::string(kMinimal) + "model:\n  n_head: 3\n"),
      "deck.yaml:4:11: model.n_head: model.n_embd = 128 is not a multiple of model.n_head = 3");

  EXPECT_EQ(deck_error("model:\n  block_size: 64\ndata:\n  train: t.h5\n  seq_len: 128\n"),
            "deck.yaml:5:12: data.seq_len: data.seq_len = 128 is more than model.block_size = 64");
  EXPECT_EQ(
      deck_error("data:\n  seq_len: 128\n  train: t.h5\nmodel:\n  block_size: 64\n"),
      "deck.yaml:5:15: model.block_size: data.seq_len = 128 is more than model.block_size = 64");
  EXPECT_EQ(
      deck_error(std::string(kMinimal) + "model:\n  block_size: 64\n"),
      "deck.yaml:4:15: model.block_size: data.seq_len = 128 is more than model.block_size = 64");

  EXPECT_EQ(deck_error(std::string(kMinimal) + "train:\n  batch_size: 16\n  micro_batch: 6\n"),
            "deck.yaml:5:16: train.micro_batch: train.batch_size = 16 is not a multiple of "
            "train.micro_batch = 6");
  EXPECT_EQ(deck_error(std::string(kMinimal) + "train:\n  micro_batch: 32\n"),
            "deck.yaml:4:16: train.micro_batch: train.batch_size = 16 is not a multiple of "
            "train.micro_batch = 32");

  EXPECT_EQ(deck_error(std::string(kMinimal) + "optim:\n  lr: 1e-5\n"),
            "deck.yaml:4:7: optim.lr: optim.min_lr = 1e-04 is more than optim.lr = 1e-05");
  EXPECT_EQ(deck_error(std::string(kMinimal) + "optim:\n  min_lr: 0.5\n  lr: 0.25\n"),
            "deck.yaml:5:7: optim.lr: optim.min_lr = 0.5 is more than optim.lr = 0.25");
}

TEST(Config, OverridesReplaceDeckValues) {
  const std::string deck = std::string(kMinimal) + "train:\n  steps: 10\n";
  EXPECT_EQ(parse_deck(deck, "deck.yaml", {}).train.steps, 10);
  EXPECT_EQ(parse_deck(deck, "deck.yaml", {"train.steps=20"}).train.steps, 20);
  // In order: the last one wins.
  EXPECT_EQ(parse_deck(deck, "deck.yaml", {"train.steps=20", "train.steps=30"}).train.steps, 30);
  // Before validation: a bad deck value that is overridden is never looked at.
  EXPECT_EQ(
      parse_deck(std::string(kMinimal) + "train:\n  steps: ten\n", "deck.yaml", {"train.steps=5"})
          .train.steps,
      5);
  // Keys the deck does not mention, and the required key itself.
  Config c = parse_deck("", "deck.yaml",
                        {"data.train='my file.h5'", "optim.lr=3e-4", "data.val=", "train.seed=7",
                         "device.backend=auto", "checkpoint.restart=runs/x/step_100.h5"});
  EXPECT_EQ(c.data.train, "my file.h5");
  EXPECT_EQ(c.optim.lr, 3e-4);
  EXPECT_EQ(c.data.val, "");
  EXPECT_EQ(c.train.seed, 7u);
  EXPECT_EQ(c.device.backend, DeviceBackend::Auto);
  EXPECT_EQ(c.checkpoint.restart, "runs/x/step_100.h5");
}

TEST(Config, OverrideErrors) {
  EXPECT_EQ(deck_error(kMinimal, {"train.steps"}),
            "command line: train.steps: expected section.key=value");
  EXPECT_EQ(deck_error(kMinimal, {"steps=4"}),
            "command line: steps=4: expected section.key=value (did you mean train.steps=4?)");
  EXPECT_EQ(deck_error(kMinimal, {"model.n_layers=4"}),
            "command line: model.n_layers=4: unknown key (did you mean model.n_layer?)");
  EXPECT_EQ(deck_error(kMinimal, {"modle.n_layer=4"}),
            "command line: modle.n_layer=4: unknown section (did you mean model?)");
  EXPECT_EQ(deck_error(kMinimal, {"train.steps=ten"}),
            "command line: train.steps=ten: expected an integer, got 'ten'");
  EXPECT_EQ(deck_error(kMinimal, {"train.steps=1.5"}),
            "command line: train.steps=1.5: expected an integer, got '1.5'");
  EXPECT_EQ(deck_error(kMinimal, {"train.steps=[1, 2]"}),
            "command line: train.steps=[1, 2]: expected an integer, got a sequence");
  EXPECT_EQ(deck_error(kMinimal, {"train.steps='ten"}),
            "command line: train.steps='ten: illegal EOF in scalar");
  EXPECT_EQ(deck_error(kMinimal, {"train.steps=-1"}),
            "command line: train.steps=-1: must be >= 0, got -1");
  // The second override of a pair is the later key, even when the deck has both.
  EXPECT_EQ(
      deck_error(std::string(kMinimal) + "model:\n  n_head: 3\n  n_embd: 96\n",
                 {"model.n_embd=100"}),
      "command line: model.n_embd=100: model.n_embd = 100 is not a multiple of model.n_head = 3");
  // Values are checked in the order given, the deck's then the overrides': the first is reported.
  EXPECT_EQ(deck_error(std::string(kMinimal) + "train:\n  steps: ten\n", {"train.seed=x"}),
            "deck.yaml:4:10: train.steps: expected an integer, got 'ten'");
  EXPECT_EQ(
      deck_error(kMinimal, {"train.seed=x", "train.steps=y"}),
      "command line: train.seed=x: expected an integer from 0 to 18446744073709551615, got 'x'");
}

std::string write_temp(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Config, LoadDeckReadsTheFile) {
  std::string path =
      write_temp("tessera_test_config_ok.yaml", std::string(kMinimal) + "train:\n  steps: 3\n");
  Config c = load_deck(path, {"train.batch_size=8"});
  EXPECT_EQ(c.deck_path, path);
  EXPECT_EQ(c.train.steps, 3);
  EXPECT_EQ(c.train.batch_size, 8);

  std::string bad =
      write_temp("tessera_test_config_bad.yaml", "data:\n  train: t\n  sequence_len: 3\n");
  try {
    load_deck(bad, {});
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(e.exit_code, kExitBadInput);
    EXPECT_EQ(std::string(e.what()),
              bad + ":3:3: data.sequence_len: unknown key (data has: train, val, format, dtype, seq_len, prefetch, readers, direct_io, check_tokens, trace, document_mask, windows)");
  }
}

TEST(Config, UnreadableDeckIsAnIOError) {
  try {
    load_deck("/nonexistent-tessera-dir/deck.yaml", {});
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(e.exit_code, kExitIO);
    EXPECT_EQ(std::string(e.what()),
              "cannot read deck /nonexistent-tessera-dir/deck.yaml: No such file or directory");
  }
  std::string dir = ::testing::TempDir();
  try {
    load_deck(dir, {});
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_EQ(e.exit_code, kExitBadInput);
    EXPECT_EQ(std::string(e.what()), "deck " + dir + " is a directory, not a file");
  }
}

// A FIFO is refused without being opened (an open would wait for a writer forever), and so is a
// file too large to be a deck; a symbolic link loop is named as one.
TEST(Config, DeckMustBeASmallRegularFile) {
  const std::string dir = ::testing::TempDir() + "tessera_deck_kinds";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string fifo = dir + "/fifo.yaml", big = dir + "/big.yaml", loop = dir + "/loop.yaml";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::ofstream(big) << std::string(2 << 20, '#');
  std::filesystem::create_symlink(loop, loop);
  auto error_of = [](const std::string& path) -> std::pair<int, std::string> {
    try {
      load_deck(path, {});
    } catch (const UserError& e) {
      return {e.exit_code, e.what()};
    }
    return {0, "no error"};
  };
  EXPECT_EQ(error_of(fifo), std::make_pair(kExitBadInput, "deck " + fifo + " is a FIFO (named pipe), not a file"));
  EXPECT_EQ(error_of(big), std::make_pair(kExitBadInput, "deck " + big + " is larger than 1024 KiB: not a deck?"));
  EXPECT_EQ(error_of(loop), std::make_pair(kExitIO, "cannot read deck " + loop +
                                                        ": Too many levels of symbolic links (a symbolic link loop)"));
  EXPECT_EQ(error_of("/dev/null"), std::make_pair(kExitBadInput, std::string("deck /dev/null is a character device, not a file")));
  std::filesystem::remove_all(dir);
}

// Every field away from its default, with awkward doubles and strings that need quoting.
Config unusual_config() {
  Config c;
  c.model.arch = Arch::Llama;
  c.model.n_layer = 12, c.model.n_head = 12, c.model.n_kv_head = 4, c.model.n_embd = 768;
  c.model.ffn_hidden = 2048, c.model.ffn_multiple = 128, c.model.block_size = 1024;
  c.model.vocab_size = 50257, c.model.vocab_multiple = 128, c.model.init_std = 1.0 / 3.0;
  c.model.attention = Attention::Fused, c.model.tie_embeddings = Tie::True;
  c.model.norm_eps = 1e-6, c.model.rope_theta = 500000.0, c.model.qk_norm = true;
  c.data.train = "data/my \"quoted\" file: #1.h5";
  c.data.val = "tab\there\nnew line \\ back ünïcode 'single'";
  c.data.format = "megatron";
  c.data.dtype = "uint32";
  c.data.prefetch = 0;
  c.data.readers = 7;
  c.data.direct_io = false;
  c.data.check_tokens = false;
  c.data.trace = true;
  c.data.seq_len = 1000;
  c.train = {123456, 480, 12, std::numeric_limits<uint64_t>::max()};
  c.optim = {0.1 + 0.2, 5e-324, 7, 99, 0.0, 0.0, 0.999999999, 1e-8, 123456789.125};
  c.eval = {250, 20};
  c.checkpoint = {" leading space", 1000, "none", 1 << 20, "runs/a b/step_00000010.h5", false};
  c.log = {5, 1.5e12};
  c.run.dir = "yes";
  c.device = {DeviceBackend::Cuda, Precision::Bf16, 16};
  c.parallel = {0, 4, 3, ScheduleKind::GPipe, 1, {5, 4, 3}};
  return c;
}

TEST(Config, ToYamlRoundTrips) {
  Config pp_auto = parse_deck(kMinimal, "deck.yaml", {"parallel.pp=auto", "parallel.tp=2"});
  Config fp8 = parse_deck(kMinimal, "deck.yaml",
                          {"device.precision=fp8", "device.fp8_format=e4m3",
                           "device.fp8_amax_history=4", "device.fp8_amax_algo=most_recent",
                           "device.fp8_margin=1", "device.fp8_head=true"});
  // Dropless MoE (capacity_factor absent) and with a capacity.
  Config moe = parse_deck(kMinimal, "deck.yaml", {"model.moe.experts=4"});
  Config capped = parse_deck(kMinimal, "deck.yaml", {"model.moe.experts=4", "model.moe.capacity_factor=1.25"});
  for (const Config& c : {unusual_config(), parse_deck(kMinimal, "deck.yaml", {}), pp_auto, fp8, moe, capped}) {
    std::string text = to_yaml(c);
    Config back = parse_deck(text, "resolved.yaml", {});
    expect_same(back, c);
    EXPECT_EQ(to_yaml(back), text);
  }
}

TEST(Config, ToYamlWritesEveryKeyAsPlainYaml) {
  std::string text = to_yaml(parse_deck(kMinimal, "deck.yaml", {}));
  for (const char* line :
       {"model:\n", "  n_layer: 4\n", "  init_std: 0.02\n", "data:\n", "  train: \"t.h5\"\n",
        "  val: \"\"\n", "  seed: 1337\n", "  min_lr: 1.0e-04\n", "  eps: 1.0e-08\n",
        "  grad_clip: 1.0\n", "  peak_gflops: 0.0\n", "  restart: \"auto\"\n", "  init_from: \"\"\n", "device:\n",
        "  threads: 0\n", "parallel:\n", "  dp: 1\n", "  schedule: \"1f1b\"\n", "  zero: 0\n",
        "  stage_layers: []\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "not in:\n" << text;
  }
  // Sections of "key: value" lines, nothing else: 10 sections, 50 keys.
  int sections = 0, keys = 0;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    std::string line = text.substr(start, end - start);
    if (line.rfind("  ", 0) == 0) {
      keys++;
    } else {
      EXPECT_EQ(line.back(), ':') << line;
      sections++;
    }
    start = end + 1;
  }
  EXPECT_EQ(sections, 10);
  EXPECT_EQ(keys, 82);  // with device.nccl_overlap, anomaly_max_rollbacks, parallel.cp, cp_comm,
                       // optim.name and reset_state, parallel.ep and expert_tp, log.breakdown,
                       // data.document_mask and windows; the five device.fp8_* keys only
                       // with precision fp8 (Config.Fp8Keys), the three optim.adafactor_* keys
                       // only with optim.name adafactor (Config.OptimRuleKeys), the twelve
                       // model.moe.* keys and device.expert_gemm only with experts
                       // (Config.MoeKeysNestUnderModel)
  // auto and the stage list as a deck would write them.
  std::string unusual = to_yaml(unusual_config());
  for (const char* line : {"  dp: auto\n", "  tp: 4\n", "  schedule: \"gpipe\"\n",
                           "  stage_layers: [5, 4, 3]\n"}) {
    EXPECT_NE(unusual.find(line), std::string::npos) << line << "not in:\n" << unusual;
  }
}

TEST(Config, ParallelSection) {
  Config c = parse_deck(std::string(kMinimal) +
                            "model:\n  n_layer: 8\n"
                            "parallel:\n  dp: auto\n  tp: 2\n  pp: 3\n  schedule: gpipe\n"
                            "  zero: 1\n  stage_layers:\n    - 2\n    - 3\n    - 3\n",
                        "deck.yaml", {});
  EXPECT_EQ(c.parallel.dp, 0);
  EXPECT_EQ(c.parallel.tp, 2);
  EXPECT_EQ(c.parallel.pp, 3);
  EXPECT_EQ(c.parallel.schedule, ScheduleKind::GPipe);
  EXPECT_EQ(c.parallel.zero, 1);
  EXPECT_EQ(c.parallel.stage_layers, (std::vector<int>{2, 3, 3}));
  // auto in any one position, quoted or not; an explicit empty list is the balanced default.
  c = parse_deck(std::string(kMinimal) + "parallel: {tp: \"auto\", stage_layers: []}\n",
                 "deck.yaml", {});
  EXPECT_EQ(c.parallel.tp, 0);
  EXPECT_TRUE(c.parallel.stage_layers.empty());
  // With pp auto, stage_layers fixes only the layer count, not how many entries.
  c = parse_deck(std::string(kMinimal) + "parallel: {pp: auto, stage_layers: [1, 3]}\n",
                 "deck.yaml", {});
  EXPECT_EQ(c.parallel.pp, 0);
  EXPECT_EQ(c.parallel.stage_layers, (std::vector<int>{1, 3}));
  // zero=1 goes with any dp, 1 included.
  EXPECT_EQ(parse_deck(kMinimal, "deck.yaml", {"parallel.zero=1"}).parallel.zero, 1);
  // Hybrid sharding: groups of zero_group dp ranks, which must divide dp.
  EXPECT_EQ(parse_deck(kMinimal, "deck.yaml",
                       {"parallel.dp=4", "parallel.zero=3", "parallel.zero_group=2"})
                .parallel.zero_group,
            2);
  EXPECT_EQ(deck_error(std::string(kMinimal) + "parallel:\n  dp: 4\n  zero: 2\n  zero_group: 3\n"),
            "deck.yaml:6:15: parallel.zero_group: parallel.zero_group = 3 does not divide parallel.dp = 4 (the dp ranks "
            "are sharded in groups of zero_group)");
  // Keeping the gathered parameters is a stage-3 choice.
  EXPECT_EQ(deck_error(std::string(kMinimal) +
                       "parallel:\n  zero: 2\n  reshard_after_forward: false\n"),
            "deck.yaml:5:26: parallel.reshard_after_forward: parallel.reshard_after_forward = false keeps gathered parameters, "
            "which only parallel.zero = 3 shards; parallel.zero = 2");
}

TEST(Config, ParallelOverrides) {
  Config c = parse_deck(std::string(kMinimal) + "parallel: {pp: 4, stage_layers: [1, 1, 1, 1]}\n",
                        "deck.yaml",
                        {"parallel.tp=2", "parallel.dp=auto", "parallel.stage_layers=[2,2]",
                         "parallel.pp=2", "parallel.schedule=gpipe"});
  EXPECT_EQ(c.parallel.tp, 2);
  EXPECT_EQ(c.parallel.dp, 0);
  EXPECT_EQ(c.parallel.pp, 2);
  EXPECT_EQ(c.parallel.stage_layers, (std::vector<int>{2, 2}));
  EXPECT_EQ(c.parallel.schedule, ScheduleKind::GPipe);
  c = parse_deck(std::string(kMinimal) + "parallel:\n  stage_layers: [4]\n", "deck.yaml",
                 {"parallel.stage_layers=[]"});
  EXPECT_TRUE(c.parallel.stage_layers.empty());

  EXPECT_EQ(deck_error(kMinimal, {"parallel.dp=0"}),
            "command line: parallel.dp=0: must be >= 1 or auto, got 0");
  EXPECT_EQ(deck_error(kMinimal, {"parallel.dp=many"}),
            "command line: parallel.dp=many: expected an integer or auto, got 'many'");
  EXPECT_EQ(deck_error(kMinimal, {"parallel.pp=2", "parallel.stage_layers=[2, x]"}),
            "command line: parallel.stage_layers=[2, x]: expected an integer, got 'x'");
  EXPECT_EQ(deck_error(kMinimal, {"parallel.stage_layers=2"}),
            "command line: parallel.stage_layers=2: expected a sequence of integers, got '2'");
  // Two autos: reported at the later one, here the override.
  EXPECT_EQ(deck_error(std::string(kMinimal) + "parallel:\n  tp: auto\n", {"parallel.dp=auto"}),
            "command line: parallel.dp=auto: parallel.dp and parallel.tp are auto; at most one of "
            "dp, tp, pp may be auto");
}

TEST(Config, ParallelErrors) {
  auto in_parallel = [](const std::string& lines) {
    return std::string(kMinimal) + "parallel:\n" + lines;
  };
  EXPECT_EQ(deck_error(in_parallel("  dp: two\n")),
            "deck.yaml:4:7: parallel.dp: expected an integer or auto, got 'two'");
  EXPECT_EQ(deck_error(in_parallel("  dp: Auto\n")),
            "deck.yaml:4:7: parallel.dp: expected an integer or auto, got 'Auto'");
  EXPECT_EQ(deck_error(in_parallel("  pp: 1.5\n")),
            "deck.yaml:4:7: parallel.pp: expected an integer or auto, got '1.5'");
  EXPECT_EQ(deck_error(in_parallel("  tp: [2]\n")),
            "deck.yaml:4:7: parallel.tp: expected an integer or auto, got a sequence");
  EXPECT_EQ(deck_error(in_parallel("  zero: auto\n")),
            "deck.yaml:4:9: parallel.zero: expected an integer, got 'auto'");

  // At most one auto, reported at the last of them.
  EXPECT_EQ(deck_error(in_parallel("  dp: auto\n  tp: auto\n")),
            "deck.yaml:5:7: parallel.tp: parallel.dp and parallel.tp are auto; at most one of dp, "
            "tp, pp may be auto");
  EXPECT_EQ(deck_error(std::string(kMinimal) + "parallel: {dp: auto, tp: auto, pp: auto}\n"),
            "deck.yaml:3:36: parallel.pp: parallel.dp, parallel.tp and parallel.pp are auto; at "
            "most one of dp, tp, pp may be auto");

  // stage_layers: a sequence of integers; an entry's error points at the entry.
  EXPECT_EQ(deck_error(in_parallel("  stage_layers: 3\n")),
            "deck.yaml:4:17: parallel.stage_layers: expected a sequence of integers, got '3'");
  EXPECT_EQ(deck_error(in_parallel("  stage_layers:\n")),
            "deck.yaml:4:3: parallel.stage_layers: expected a sequence of integers, got nothing "
            "(write [] for the default)");
  EXPECT_EQ(deck_error(in_parallel("  stage_layers: {a: 1}\n")),
            "deck.yaml:4:17: parallel.stage_layers: expected a sequence of integers, got a map");
  EXPECT_EQ(deck_error(in_parallel("  pp: 2\n  stage_layers: [2, x]\n")),
            "deck.yaml:5:21: parallel.stage_layers: expected an integer, got 'x'");
  EXPECT_EQ(deck_error(in_parallel("  pp: 2\n  stage_layers:\n    - 2\n    - 1.5\n")),
            "deck.yaml:7:7: parallel.stage_layers: expected an integer, got '1.5'");
  EXPECT_EQ(deck_error(in_parallel("  pp: 2\n  stage_layers: [2, [2]]\n")),
            "deck.yaml:5:21: parallel.stage_layers: expected an integer, got a sequence");
}

// FP8's keys: read with device.precision fp8, a deck error without it or with a bad value;
// written by to_yaml only with it (every one of the 80 keys then).
// optim.name picks the update rule; Adafactor's keys only with it, each checked.
TEST(Config, OptimRuleKeys) {
  const std::string deck = kMinimal;
  EXPECT_EQ(parse_deck(deck, "deck.yaml", {}).optim.name, OptimRule::AdamW);
  const Config c = parse_deck(deck, "deck.yaml",
                              {"optim.name=adafactor", "optim.adafactor_eps=1e-20",
                               "optim.adafactor_decay=-0.5", "optim.adafactor_clip=2",
                               "optim.reset_state=true"});
  EXPECT_EQ(c.optim.name, OptimRule::Adafactor);
  EXPECT_EQ(c.optim.adafactor_eps, 1e-20);
  EXPECT_EQ(c.optim.adafactor_decay, -0.5);
  EXPECT_EQ(c.optim.adafactor_clip, 2.0);
  EXPECT_TRUE(c.optim.reset_state);
  const std::string yaml = to_yaml(c);
  EXPECT_NE(yaml.find("  adafactor_decay: -0.5\n"), std::string::npos) << yaml;
  EXPECT_EQ(to_yaml(parse_deck(deck, "deck.yaml", {})).find("adafactor"), std::string::npos);
  EXPECT_EQ(deck_error(deck, {"optim.name=sgd"}),
            "command line: optim.name=sgd: must be adamw or adafactor, got 'sgd'");
  EXPECT_EQ(deck_error(deck, {"optim.adafactor_clip=2"}),
            "command line: optim.adafactor_clip=2: optim.adafactor_clip needs optim.name: "
            "adafactor (got 'adamw')");
  EXPECT_NE(deck_error(deck, {"optim.name=adafactor", "optim.adafactor_decay=0"})
                .find("must be in [-1, 0)"),
            std::string::npos);
  EXPECT_NE(deck_error(deck, {"optim.name=adafactor", "optim.adafactor_eps=0"})
                .find("optim.adafactor_eps"),
            std::string::npos);
}

TEST(Config, Fp8Keys) {
  const std::string deck = kMinimal;
  const std::string fp8 = deck + "device:\n  precision: fp8\n";
  const Config c = parse_deck(fp8 + "  fp8_format: e4m3\n  fp8_amax_history: 1024\n"
                              "  fp8_amax_algo: most_recent\n  fp8_margin: 2\n  fp8_head: true\n",
                              "deck.yaml", {});
  EXPECT_EQ(c.device.precision, Precision::Fp8);
  EXPECT_EQ(c.device.fp8_format, Fp8Recipe::E4M3);
  EXPECT_EQ(c.device.fp8_amax_history, 1024);
  EXPECT_EQ(c.device.fp8_amax_algo, AmaxAlgo::MostRecent);
  EXPECT_EQ(c.device.fp8_margin, 2);
  EXPECT_TRUE(c.device.fp8_head);
  const Config d = parse_deck(fp8, "deck.yaml", {});
  EXPECT_EQ(d.device.fp8_format, Fp8Recipe::Hybrid);
  EXPECT_EQ(d.device.fp8_amax_history, 16);
  EXPECT_EQ(d.device.fp8_amax_algo, AmaxAlgo::Max);
  EXPECT_EQ(d.device.fp8_margin, 0);
  EXPECT_FALSE(d.device.fp8_head);
  EXPECT_EQ(deck_error(deck + "device:\n  fp8_margin: 1\n"),
            "deck.yaml:4:15: device.fp8_margin: device.fp8_margin needs device.precision: fp8 "
            "(got 'fp32')");
  EXPECT_EQ(deck_error(deck, {"device.precision=bf16", "device.backend=cuda", "device.fp8_head=true"}),
            "command line: device.fp8_head=true: device.fp8_head needs device.precision: fp8 "
            "(got 'bf16')");
  EXPECT_EQ(deck_error(fp8 + "  fp8_format: e5m2\n"),
            "deck.yaml:5:15: device.fp8_format: must be hybrid or e4m3, got 'e5m2'");
  EXPECT_EQ(deck_error(fp8 + "  fp8_amax_algo: mean\n"),
            "deck.yaml:5:18: device.fp8_amax_algo: must be max or most_recent, got 'mean'");
  EXPECT_NE(deck_error(fp8 + "  fp8_amax_history: 0\n").find("device.fp8_amax_history"),
            std::string::npos);
  EXPECT_NE(deck_error(fp8 + "  fp8_amax_history: 1025\n").find("1024"), std::string::npos);
  EXPECT_NE(deck_error(fp8 + "  fp8_margin: -1\n").find("device.fp8_margin"), std::string::npos);
  // Past 14 an E4M3 tensor's amax is subnormal; at 30 or 64 every code would be zero.
  EXPECT_EQ(parse_deck(fp8 + "  fp8_margin: 14\n", "deck.yaml", {}).device.fp8_margin, 14);
  for (const char* margin : {"15", "30", "64"})
    EXPECT_EQ(deck_error(fp8 + "  fp8_margin: " + margin + "\n"),
              "deck.yaml:5:15: device.fp8_margin: must be <= 14 (beyond it a tensor's largest "
              "values are subnormal in E4M3, and from 19 on every value rounds to zero), got " +
                  std::string(margin));
  EXPECT_EQ(deck_error(deck + "device:\n  precision: fp4\n"),
            "deck.yaml:4:14: device.precision: must be fp32, bf16 or fp8, got 'fp4'");
  // On both backends (the CPU in fp32, CUDA in bf16 around the FP8 GEMM inputs).
  EXPECT_EQ(parse_deck(fp8 + "  backend: cuda\n", "deck.yaml", {}).device.backend, DeviceBackend::Cuda);
  const std::string text = to_yaml(c);
  EXPECT_NE(text.find("  fp8_margin: 2\n"), std::string::npos);
  EXPECT_EQ(to_yaml(parse_deck(deck, "deck.yaml", {})).find("fp8_"), std::string::npos);
}

// The LLaMA family's keys and their rules against the others, each at the later of its keys.
TEST(Config, LlamaRules) {
  const std::string deck = kMinimal;
  const std::string llama = deck + "model:\n  arch: llama\n";
  EXPECT_EQ(deck_error(llama + "  n_head: 4\n  n_kv_head: 3\n"),
            "deck.yaml:6:14: model.n_kv_head: model.n_kv_head = 3 does not divide model.n_head = 4");
  EXPECT_EQ(deck_error(deck + "model:\n  n_kv_head: 2\n"),
            "deck.yaml:4:14: model.n_kv_head: model.n_kv_head = 2 needs model.arch: llama (GPT-2 "
            "has n_head key/value heads)");
  EXPECT_EQ(deck_error(llama + "  n_head: 4\n  n_embd: 28\n"),
            "deck.yaml:6:11: model.n_embd: model.n_embd / model.n_head = 7 is odd: llama's rotary "
            "embeddings rotate pairs of a head's values");
  EXPECT_EQ(deck_error(deck + "model:\n  ffn_hidden: 100\n"),
            "deck.yaml:4:15: model.ffn_hidden: model.ffn_hidden = 100 needs model.arch: llama "
            "(GPT-2's MLP is 4 n_embd = 512 wide)");
  EXPECT_EQ(deck_error(deck + "model:\n  norm_eps: 1.0e-6\n"),
            "deck.yaml:4:13: model.norm_eps: model.norm_eps = 1e-06 needs model.arch: llama "
            "(GPT-2's LayerNorm uses 1e-5)");
  EXPECT_EQ(deck_error(deck + "model:\n  qk_norm: true\n"),
            "deck.yaml:4:12: model.qk_norm: model.qk_norm = true needs model.arch: llama (GPT-2's "
            "attention normalises no head)");
  EXPECT_TRUE(parse_deck(llama + "  qk_norm: true\n", "deck.yaml", {}).model.qk_norm);
  EXPECT_EQ(to_yaml(parse_deck(llama, "deck.yaml", {})).find("qk_norm"), std::string::npos);
  EXPECT_EQ(deck_error(llama + "  n_kv_head: 2\nparallel:\n  tp: 4\n"),
            "deck.yaml:7:7: parallel.tp: parallel.tp = 4 does not divide model.n_kv_head = 2 "
            "(each rank needs whole key/value heads)");
  EXPECT_EQ(deck_error(llama + "  ffn_hidden: 30\nparallel:\n  tp: 4\n"),
            "deck.yaml:7:7: parallel.tp: parallel.tp = 4 does not divide model.ffn_hidden = 30");
  const Config c = parse_deck(llama + "  n_kv_head: 2\n  tie_embeddings: true\n", "deck.yaml", {});
  EXPECT_EQ(c.model.arch, Arch::Llama);
  EXPECT_EQ(c.model.n_kv_head, 2);
  EXPECT_EQ(c.model.tie_embeddings, Tie::True);
}

// Every example deck of input/ is a valid deck (the tests run from the repository root).
TEST(Config, ExampleDecksLoad) {
  int decks = 0;
  for (const auto& entry : std::filesystem::directory_iterator("input")) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    EXPECT_NO_THROW(load_deck(entry.path().string(), {}));
    ++decks;
  }
  EXPECT_GE(decks, 5);
  const Config llama = load_deck("input/llama-1b.yaml", {});
  EXPECT_EQ(llama.model.arch, Arch::Llama);
  EXPECT_EQ(llama.model.n_kv_head, 8);
}

// Virtual stages: the interleaved 1F1B schedule's rules, each at the later of its keys.
TEST(Config, VirtualStagesRules) {
  const std::string deck = std::string(kMinimal) + "model:\n  n_layer: 8\n";
  EXPECT_EQ(deck_error(deck + "parallel:\n  virtual_stages: 0\n"),
            "deck.yaml:6:19: parallel.virtual_stages: must be >= 1, got 0");
  EXPECT_EQ(deck_error(deck + "parallel:\n  pp: 2\n  virtual_stages: 2\n  schedule: gpipe\n"),
            "deck.yaml:8:13: parallel.schedule: parallel.virtual_stages = 2 interleaves the 1f1b "
            "schedule, but parallel.schedule = gpipe");
  EXPECT_EQ(deck_error(deck + "parallel:\n  virtual_stages: 2\n"),
            "deck.yaml:6:19: parallel.virtual_stages: parallel.virtual_stages = 2 needs "
            "parallel.pp >= 2 (one stage has nothing to interleave)");
  EXPECT_EQ(deck_error(deck + "parallel:\n  pp: 2\n  virtual_stages: 3\n"),
            "deck.yaml:7:19: parallel.virtual_stages: parallel.virtual_stages = 3 does not divide "
            "the layers of each stage (model.n_layer = 8 over parallel.pp = 2): every virtual "
            "stage needs the same number of layers");
  EXPECT_EQ(deck_error(deck + "parallel:\n  pp: 2\n  stage_layers: [4, 4]\n  virtual_stages: 2\n"),
            "deck.yaml:8:19: parallel.virtual_stages: parallel.virtual_stages = 2 splits the "
            "layers evenly: parallel.stage_layers must be []");
  EXPECT_EQ(parse_deck(deck + "parallel:\n  pp: 2\n  virtual_stages: 2\n", "deck.yaml", {})
                .parallel.virtual_stages,
            2);
}

// The fused attention's head-size limit, at the later of the two keys.
TEST(Config, FusedAttentionHeadSize) {
  const std::string deck = kMinimal;
  EXPECT_EQ(deck_error(deck + "model:\n  n_embd: 1024\n  n_head: 4\n  attention: fused\n"),
            "deck.yaml:6:14: model.attention: model.attention = fused takes head sizes up to 128, "
            "and model.n_embd / model.n_head = 256: use model.attention: gemm or more heads");
  EXPECT_EQ(parse_deck(deck + "model:\n  n_embd: 1024\n  n_head: 8\n  attention: fused\n",
                       "deck.yaml", {})
                .model.attention,
            Attention::Fused);
}

// Layout rules that need no world size, each at the later of its keys.
TEST(Config, ParallelCrossKeyRules) {
  const std::string deck = kMinimal;
  EXPECT_EQ(deck_error(deck + "parallel:\n  tp: 3\n"),
            "deck.yaml:4:7: parallel.tp: parallel.tp = 3 does not divide model.n_head = 4");
  EXPECT_EQ(deck_error(deck + "parallel:\n  tp: 8\nmodel:\n  n_head: 2\n"),
            "deck.yaml:6:11: model.n_head: parallel.tp = 8 does not divide model.n_head = 2");

  EXPECT_EQ(deck_error(deck + "model:\n  n_layer: 4\nparallel:\n  pp: 2\n"
                              "  stage_layers: [1, 1, 2]\n"),
            "deck.yaml:7:17: parallel.stage_layers: parallel.stage_layers = [1, 1, 2] has 3 "
            "entries, but parallel.pp = 2");
  EXPECT_EQ(deck_error(deck + "parallel:\n  stage_layers: [1, 1, 2]\n  pp: 2\n"),
            "deck.yaml:5:7: parallel.pp: parallel.stage_layers = [1, 1, 2] has 3 entries, but "
            "parallel.pp = 2");
  // pp is 1 unless given: a list of more than one stage needs pp (or pp: auto).
  EXPECT_EQ(deck_error(deck + "parallel:\n  stage_layers: [2, 2]\n"),
            "deck.yaml:4:17: parallel.stage_layers: parallel.stage_layers = [2, 2] has 2 "
            "entries, but parallel.pp = 1");
  EXPECT_EQ(deck_error(deck + "parallel:\n  pp: 2\n  stage_layers: [3, 3]\n"),
            "deck.yaml:5:17: parallel.stage_layers: parallel.stage_layers = [3, 3] sums to 6, "
            "but model.n_layer = 4");
  EXPECT_EQ(deck_error(deck + "parallel:\n  pp: auto\n  stage_layers: [3, 3]\n"
                              "model:\n  n_layer: 5\n"),
            "deck.yaml:7:12: model.n_layer: parallel.stage_layers = [3, 3] sums to 6, but "
            "model.n_layer = 5");
  EXPECT_EQ(deck_error(deck + "parallel:\n  pp: 5\n"),
            "deck.yaml:4:7: parallel.pp: parallel.pp = 5 is more than model.n_layer = 4 (every "
            "stage needs at least one layer)");

  // train.micro_batch is per data-parallel rank.
  EXPECT_EQ(deck_error(deck + "parallel:\n  dp: 3\n"),
            "deck.yaml:4:7: parallel.dp: train.batch_size = 16 is not a multiple of parallel.dp "
            "= 3");
  EXPECT_EQ(deck_error(deck + "parallel:\n  dp: 32\n"),
            "deck.yaml:4:7: parallel.dp: train.batch_size = 16 is less than parallel.dp = 32");
  EXPECT_EQ(deck_error(deck + "train:\n  micro_batch: 4\nparallel:\n  dp: 8\n"),
            "deck.yaml:6:7: parallel.dp: train.batch_size = 16 is less than parallel.dp x "
            "train.micro_batch = 8 x 4 = 32");
  EXPECT_EQ(deck_error(deck + "parallel:\n  dp: 2\ntrain:\n  batch_size: 12\n  micro_batch: 4\n"),
            "deck.yaml:7:16: train.micro_batch: train.batch_size = 12 is not a multiple of "
            "parallel.dp x train.micro_batch = 2 x 4 = 8");
  // dp auto: checked once the world size is known (check_layout).
  EXPECT_EQ(parse_deck(deck + "parallel:\n  dp: auto\n  tp: 2\n", "deck.yaml", {}).parallel.dp, 0);
  EXPECT_EQ(parse_deck(deck + "train: {batch_size: 12, micro_batch: 2}\nparallel: {dp: 3}\n",
                       "deck.yaml", {})
                .parallel.dp,
            3);
}

}  // namespace
// Found by tests/fuzz (corpus/deck/crash-timeout-*): yaml-cpp loops without bound on a NUL byte,
// so a deck holding one is refused by position first.
TEST(Config, NulByteIsRefusedByPosition) {
  const char text[] = "data: {train: t.h5}\nrun:\n  dir: a\0b\n";
  EXPECT_EQ(deck_error(std::string(text, sizeof text - 1)),
            "deck.yaml:3:9: a NUL byte: a deck is text (YAML allows tab, line feed and carriage "
            "return, no other control character)");
  EXPECT_EQ(deck_error("data: {train: t.h5}\n# make ru\x1c\x1cn\n"),
            "deck.yaml:2:10: control character 0x1C: a deck is text (YAML allows tab, line feed "
            "and carriage return, no other control character)");
}


// Found by tests/fuzz (corpus/deck/crash-timeout-ea18be*): yaml-cpp 0.7's LoadAll never ends on
// a ',' where a document would start (yaml-cpp issue 1040); a second document is still refused,
// a trailing "---" still harmless.
TEST(Config, CommaWhereADocumentStartsIsRefused) {
  EXPECT_EQ(deck_error(","), "deck.yaml:1:1: unexpected ',': no YAML document can start with it");
  EXPECT_EQ(deck_error("\n  , seq: 1\n"),
            "deck.yaml:2:3: unexpected ',': no YAML document can start with it");
  EXPECT_EQ(deck_error("data: {train: t.h5}\n---\nrun: {dir: a}\n"),
            "deck.yaml:3:1: expected one YAML document, found a second");
  EXPECT_EQ(parse_deck("data: {train: t.h5}\ntrain: {steps: 7}\n---\n", "deck.yaml", {}).train.steps, 7);
}

}  // namespace tessera

namespace tessera {
namespace {

// model.moe: a map under model (and model.moe.KEY on the command line), its rules each one line.
TEST(Config, MoeKeysNestUnderModel) {
  const std::string deck = std::string(kMinimal) +
                           "model:\n  n_layer: 4\n  moe:\n    experts: 8\n    top_k: 2\n"
                           "    score: sigmoid\n    capacity_factor: 1.25\n"
                           "parallel:\n  dp: 4\n  ep: 2\n";
  const Config c = parse_deck(deck, "deck.yaml", {"model.moe.every=2", "device.expert_gemm=grouped"});
  EXPECT_EQ(c.device.expert_gemm, ExpertGemm::Grouped);
  EXPECT_EQ(c.model.moe.experts, 8);
  EXPECT_EQ(c.model.moe.top_k, 2);
  EXPECT_EQ(c.model.moe.score, MoeScore::Sigmoid);
  EXPECT_EQ(c.model.moe.capacity_factor, 1.25);
  EXPECT_EQ(c.model.moe.every, 2);
  EXPECT_EQ(c.parallel.ep, 2);
  const std::string yaml = to_yaml(c);
  EXPECT_NE(yaml.find("  moe:\n    experts: 8\n    top_k: 2\n"), std::string::npos) << yaml;
  expect_same(parse_deck(yaml, "resolved.yaml", {}), c);
  EXPECT_EQ(parse_deck(yaml, "resolved.yaml", {}).model.moe.every, 2);
  // A dense deck writes no moe key, and reads back.
  const Config dense = parse_deck(kMinimal, "deck.yaml", {});
  EXPECT_EQ(to_yaml(dense).find("moe"), std::string::npos);
  EXPECT_EQ(to_yaml(dense).find("expert_gemm"), std::string::npos);
  // ... and refuses the experts' GEMM choice (it would do nothing).
  EXPECT_EQ(deck_error(kMinimal, {"device.expert_gemm=grouped"}),
            "command line: device.expert_gemm=grouped: device.expert_gemm needs "
            "model.moe.experts > 0 (a dense model has no experts)");
  EXPECT_NE(deck_error(std::string(kMinimal) + "model:\n  moe:\n    experts: 4\n",
                       {"device.expert_gemm=batched"})
                .find("device.expert_gemm=batched: must be"),
            std::string::npos);
}

// Layout sizes near the int's limit: their products are taken in 64 bits, so the message names
// the true numbers (2 x 2^30 was -2147483648) and no check divides by a product that wrapped to 0
// (pp 4 x virtual_stages 2^30).
TEST(Config, LayoutProductsDoNotOverflow) {
  EXPECT_EQ(deck_error(kMinimal, {"model.attention=fused", "parallel.cp=1073741824"}),
            "command line: parallel.cp=1073741824: data.seq_len = 128 is not divisible by 2 x "
            "parallel.cp = 2147483648 (each sequence is cut into 2 x cp equal chunks)");
  EXPECT_EQ(deck_error(kMinimal, {"parallel.pp=4", "parallel.virtual_stages=1073741824"}),
            "command line: parallel.virtual_stages=1073741824: parallel.virtual_stages = "
            "1073741824 does not divide the layers of each stage (model.n_layer = 4 over "
            "parallel.pp = 4): every virtual stage needs the same number of layers");
  EXPECT_NE(deck_error(kMinimal, {"model.attention=fused", "data.seq_len=2048",
                                  "model.block_size=2048", "parallel.dp=2",
                                  "parallel.cp=1073741824", "parallel.zero_group=3"})
                .find("does not divide parallel.dp x parallel.cp = 2 x 1073741824"),
            std::string::npos);
}

TEST(Config, MoeRulesNameTheNumbers) {
  const std::string m = std::string(kMinimal) + "model:\n  n_layer: 4\n  moe:\n";
  EXPECT_EQ(deck_error(m + "    experts: 4\n    top_k: 5\n"),
            "deck.yaml:7:12: model.moe.top_k: model.moe.top_k = 5 is more than "
            "model.moe.experts = 4");
  EXPECT_EQ(deck_error(m + "    experts: 6\nparallel:\n  dp: 4\n  ep: 4\n"),
            "deck.yaml:9:7: parallel.ep: model.moe.experts = 6 is not divisible by parallel.ep = 4");
  EXPECT_EQ(deck_error(m + "    experts: 8\nparallel:\n  dp: 2\n  ep: 4\n"),
            "deck.yaml:9:7: parallel.ep: parallel.ep = 4 does not divide parallel.dp x parallel.cp "
            "= 2 x 1 (the expert ranks are carved from the data-parallel ones)");
  EXPECT_EQ(deck_error(m + "    experts: 8\n    capacity_factor: 0\n"),
            "deck.yaml:7:22: model.moe.capacity_factor: must be > 0 (leave it out for dropless "
            "routing), got 0");
  EXPECT_EQ(deck_error(m + "    top_k: 2\n"),
            "deck.yaml:6:12: model.moe.top_k: model.moe.top_k needs model.moe.experts > 0 (a "
            "dense model has no experts)");
  EXPECT_EQ(deck_error(std::string(kMinimal) + "parallel:\n  ep: 2\n"),
            "deck.yaml:4:7: parallel.ep: parallel.ep = 2 needs model.moe.experts > 0 (only "
            "experts are split over ep)");
  EXPECT_EQ(deck_error(m + "    experts: 8\n    first_dense: 4\n"),
            "deck.yaml:7:18: model.moe.first_dense: model.moe.every = 1 and "
            "model.moe.first_dense = 4 leave no MoE layer among model.n_layer = 4");
  EXPECT_EQ(deck_error(m + "    experts: 8\n    expert: 2\n"),
            "deck.yaml:7:5: model.moe.expert: unknown key (did you mean model.moe.experts?)");
  EXPECT_EQ(deck_error(std::string(kMinimal) + "model:\n  moe: 8\n"),
            "deck.yaml:4:3: model.moe: expected a map of keys, got '8'");
  EXPECT_EQ(deck_error(m + "    experts: 8\n    experts: 4\n"),
            "deck.yaml:7:5: model.moe.experts: duplicate key (first at line 6)");
  EXPECT_EQ(deck_error(m + "    experts: 8\n    score: softmaxx\n"),
            "deck.yaml:7:12: model.moe.score: must be softmax or sigmoid, got 'softmaxx'");
}

}  // namespace
}  // namespace tessera
