// Tokenizers: byte and sentencepiece BPE round trips, the model's storage in HDF5 files and
// checkpoints, clear errors for a bad model, and C++ encoding equal to tools/data/prepare_data.py's.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "io/checkpoint.hpp"
#include "io/hdf5_util.hpp"
#include "io/token_file.hpp"
#include "io/tokenizer.hpp"
#include "model/shard.hpp"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

constexpr int kVocab = 400;

// Python-flavoured lines: what the default corpus looks like.
std::vector<std::string> corpus_lines() {
  std::vector<std::string> lines;
  const char* names[] = {"value", "result", "items", "config", "path", "buffer", "count"};
  for (int i = 0; i < 400; ++i) {
    const std::string a = names[i % 7], b = names[(i * 3 + 1) % 7];
    lines.push_back("def get_" + a + "(self, " + b + "=None):");
    lines.push_back("    \"\"\"Return the " + a + " of " + b + " " + std::to_string(i) + ".\"\"\"");
    lines.push_back("    if " + b + " is None:");
    lines.push_back("        return self._" + a);
    lines.push_back("    for x in range(" + std::to_string(i % 13) + "):");
    lines.push_back("        " + a + " += x  # caf\xc3\xa9 co\xc3\xbbt");
  }
  return lines;
}

class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(std::vector<std::string> lines) : lines_(std::move(lines)) {}
  bool done() const override { return i_ >= lines_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return lines_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  std::vector<std::string> lines_;
  size_t i_ = 0;
};

// A BPE model trained with the options of tools/data/prepare_data.py (BPE_OPTIONS), once.
const TokenizerInfo& bpe_info() {
  static const TokenizerInfo info = [] {
    LineIterator it(corpus_lines());
    std::string model;
    const auto status = sentencepiece::SentencePieceTrainer::Train(
        {{"model_type", "bpe"}, {"vocab_size", std::to_string(kVocab)}, {"byte_fallback", "true"},
         {"normalization_rule_name", "identity"}, {"remove_extra_whitespaces", "false"},
         {"add_dummy_prefix", "false"}, {"allow_whitespace_only_pieces", "true"},
         {"split_digits", "true"}, {"unk_id", "0"}, {"eos_id", "1"}, {"bos_id", "-1"},
         {"pad_id", "-1"}, {"eos_piece", "<eot>"}, {"hard_vocab_limit", "false"},
         {"num_threads", "1"}, {"character_coverage", "1.0"}, {"minloglevel", "2"}},
        &it, &model);
    EXPECT_TRUE(status.ok()) << status.ToString();
    TokenizerInfo t;
    t.type = "sentencepiece";
    t.vocab_size = kVocab;
    t.eot = 1;
    t.model = model;
    return t;
  }();
  return info;
}

fs::path scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() /
                 ("tessera_tok_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

}  // namespace

TEST(Tokenizer, ByteRoundTrip) {
  const Tokenizer tok(TokenizerInfo{"byte", 257, 256, ""}, "test");
  const std::string text = "x = 'caf\xc3\xa9'\n\tpass\xff";
  const std::vector<int32_t> ids = tok.encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[0], 'x');
  EXPECT_EQ(ids.back(), 0xff);
  std::vector<int32_t> with_eot = ids;
  with_eot.push_back(256);
  EXPECT_EQ(tok.decode(with_eot), text);
}

TEST(Tokenizer, UnknownTypeIsAUserError) {
  try {
    Tokenizer tok(TokenizerInfo{"gpt2", 50257, 50256, ""}, "ckpt.h5");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt.h5: tokenizer 'gpt2' cannot be"), std::string::npos)
        << e.what();
  }
}

// The attributes a token file or checkpoint records are checked, whatever the type: a known name,
// a vocabulary within bounds, an eot inside it.
TEST(Tokenizer, AttributesAreChecked) {
  auto problem = [](const TokenizerInfo& info) -> std::string {
    try {
      check_tokenizer(info, "f.h5");
    } catch (const UserError& e) {
      EXPECT_EQ(e.exit_code, kExitBadInput);
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(problem({"byte", 257, 256, {}}), "");
  EXPECT_EQ(problem({"gpt2", 50257, 50256, {}}), "");
  EXPECT_EQ(problem({"none", 0, -1, {}}), "");  // Megatron and raw data record none
  EXPECT_EQ(problem({"byte", 257, -1, {}}), "");  // no eot recorded
  EXPECT_EQ(problem({"tiktoken", 100, 5, {}}),
            "f.h5: unknown tokenizer 'tiktoken' (tessera knows byte, sentencepiece, hf-bpe, gpt2, llama3 "
            "and none)");
  EXPECT_EQ(problem({"byte", 257, 300, {}}),
            "f.h5: tokenizer eot 300 is not an id of the vocabulary (0..256)");
  EXPECT_EQ(problem({"byte", 257, -7, {}}),
            "f.h5: tokenizer eot -7 is not an id of the vocabulary (0..256)");
  EXPECT_EQ(problem({"byte", (int64_t(1) << 32) + 100, 5, {}}),
            "f.h5: tokenizer vocab_size 4294967396 is outside 1..16777216 (the largest "
            "vocabularies in use have about 256k tokens)");
  EXPECT_EQ(problem({"byte", 0, -1, {}}),
            "f.h5: tokenizer vocab_size 0 is outside 1..16777216 (the largest vocabularies in use "
            "have about 256k tokens)");
}

TEST(Tokenizer, SentencePieceRoundTripIsExact) {
  const Tokenizer tok(bpe_info(), "test");
  // Indentation, blank lines, tabs, trailing spaces, digits, characters the model saw (é) and
  // characters it never saw (€, an emoji, CJK: byte fallback), a leading space.
  const std::vector<std::string> texts = {
      "def get_value(self, path=None):\n    return self._value\n",
      " leading space\n\n\n\ttab\t  two  spaces  \n",
      "count = 12345 + 0.5e-3  # caf\xc3\xa9",
      "price: 5 \xe2\x82\xac \xf0\x9f\x98\x80 \xe6\xbc\xa2\xe5\xad\x97",
      ""};
  for (const std::string& text : texts) {
    const std::vector<int32_t> ids = tok.encode(text);
    for (int32_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, kVocab);
      EXPECT_NE(id, 0) << "unknown piece: byte fallback should spell every character";
      EXPECT_NE(id, 1) << "eot inside encoded text";
    }
    EXPECT_EQ(tok.decode(ids), text);
  }
  // BPE merges: common words take fewer ids than bytes.
  const std::string code = "    def get_value(self, path=None):";
  EXPECT_LT(tok.encode(code).size(), code.size() / 2);
  // eot decodes to nothing.
  std::vector<int32_t> ids = tok.encode("return");
  ids.push_back(1);
  EXPECT_EQ(tok.decode(ids), "return");
}

// val_bpb's denominator: the byte lengths of a sentencepiece text's ids add up to the text's bytes
// (pieces with U+2581 for spaces, byte-fallback pieces, characters of 2-4 bytes).
TEST(Tokenizer, SentencePieceByteLengthsSumToTheText) {
  const Tokenizer tok(bpe_info(), "test");
  const std::vector<uint32_t> lengths = tok.token_byte_lengths();
  ASSERT_EQ(lengths.size(), size_t(kVocab));
  EXPECT_EQ(lengths[1], 0u);  // eot
  std::string text;
  for (const std::string& line : corpus_lines()) text += line + "\n";
  text += " price: 5 \xe2\x82\xac \xf0\x9f\x98\x80 \xe6\xbc\xa2  \t x\n";
  uint64_t sum = 0;
  for (int32_t id : tok.encode(text)) sum += lengths[size_t(id)];
  EXPECT_EQ(sum, text.size());
}

TEST(Tokenizer, PartialCharacterDecodesToReplacement) {
  const Tokenizer tok(bpe_info(), "test");
  const std::vector<int32_t> ids = tok.encode("\xf0\x9f\x98\x80");  // one emoji, 4 byte pieces
  ASSERT_EQ(ids.size(), 4u);
  const std::string part = tok.decode({ids[0], ids[1]});
  EXPECT_NE(part.find("\xef\xbf\xbd"), std::string::npos);  // U+FFFD: not yet a character
  EXPECT_EQ(tok.decode(ids), "\xf0\x9f\x98\x80");
}

TEST(Tokenizer, BadModelIsAUserError) {
  TokenizerInfo bad = bpe_info();
  bad.model = "this is not a sentencepiece model";
  auto message = [](const TokenizerInfo& info) {
    try {
      Tokenizer tok(info, "data/train.h5");
    } catch (const UserError& e) {
      EXPECT_EQ(e.exit_code, kExitBadInput);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(bad).find("data/train.h5: the sentencepiece tokenizer model"), std::string::npos)
      << message(bad);
  EXPECT_NE(message(bad).find("does not load"), std::string::npos) << message(bad);
  TokenizerInfo wrong_vocab = bpe_info();
  wrong_vocab.vocab_size = kVocab + 1;
  EXPECT_NE(message(wrong_vocab).find(std::to_string(kVocab) + " pieces, the vocab_size attribute says " +
                                      std::to_string(kVocab + 1)),
            std::string::npos)
      << message(wrong_vocab);
  TokenizerInfo missing = bpe_info();
  missing.model.clear();
  EXPECT_NE(message(missing).find("without its model"), std::string::npos) << message(missing);
  EXPECT_THROW(check_tokenizer(bad, "x.h5"), UserError);
  EXPECT_NO_THROW(check_tokenizer(bpe_info(), "x.h5"));
  EXPECT_NO_THROW(check_tokenizer(TokenizerInfo{"gpt2", 50257, 50256, ""}, "x.h5"));
}

TEST(Tokenizer, ModelDatasetRoundTrip) {
  hdf5_quiet();
  const fs::path dir = scratch("h5");
  const std::string path = (dir / "t.h5").string();
  {
    H5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
    write_tokenizer_model(file.get(), "tokenizer_model", bpe_info().model, true, H5P_DEFAULT);
    write_tokenizer_model(file.get(), "empty", "", true, H5P_DEFAULT);  // writes nothing
  }
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  EXPECT_EQ(read_tokenizer_model(file.get(), path, "tokenizer_model"), bpe_info().model);
  EXPECT_EQ(read_tokenizer_model(file.get(), path, "empty"), "");
  EXPECT_EQ(H5Lexists(file.get(), "empty", H5P_DEFAULT), 0);
  fs::remove_all(dir);
}

TEST(Tokenizer, CheckpointCarriesTheModel) {
  const fs::path dir = scratch("ckpt");
  const ModelShape shape = make_model_shape(1, 2, 8, 16, kVocab, 8);
  const LocalLayout layout = make_local_layout(shape, 1, 0, 0, shape.n_layer, true, true);
  std::vector<float> p(layout.total, 0.01f), m(layout.total, 0.0f), v(layout.total, 0.0f);
  TrainState state;
  state.step = 3;
  const std::string path =
      write_checkpoint(MPI_COMM_WORLD, dir.string(), layout, true, {p.data(), m.data(), v.data()},
                       state, "model:\n  n_layer: 1\n", bpe_info(), "dp=1,tp=1,pp=1");
  const CheckpointInfo info = read_checkpoint_info(path);
  EXPECT_EQ(info.tokenizer.type, "sentencepiece");
  EXPECT_EQ(info.tokenizer.vocab_size, kVocab);
  EXPECT_EQ(info.tokenizer.eot, 1);
  EXPECT_EQ(info.tokenizer.model, bpe_info().model);
  // A byte checkpoint has no model dataset and reads back with an empty model.
  state.step = 4;
  const std::string byte_path =
      write_checkpoint(MPI_COMM_WORLD, dir.string(), layout, true, {p.data(), m.data(), v.data()},
                       state, "model:\n  n_layer: 1\n", TokenizerInfo{"byte", 257, 256, ""},
                       "dp=1,tp=1,pp=1");
  const CheckpointInfo byte_info = read_checkpoint_info(byte_path);
  EXPECT_EQ(byte_info.tokenizer.type, "byte");
  EXPECT_TRUE(byte_info.tokenizer.model.empty());
  fs::remove_all(dir);
}

// tools/data/prepare_data.py --tokenizer bpe trains and encodes in Python; the C++ Tokenizer built
// from the token file must encode every document to exactly the ids stored there.
TEST(Tokenizer, CppEncodesLikePrepareData) {
  const fs::path tool = fs::path(__FILE__).parent_path() / "../../tools/data/prepare_data.py";
  if (!fs::exists(tool) ||
      std::system("/usr/bin/python3 -c 'import sentencepiece, h5py' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "needs tools/data/prepare_data.py (run from the repository root) and "
                    "/usr/bin/python3 with sentencepiece and h5py";
  const fs::path dir = scratch("prep");
  std::vector<std::string> docs;
  const std::vector<std::string> lines = corpus_lines();
  for (int d = 0; d < 8; ++d) {
    std::string text;
    for (size_t i = size_t(d); i < lines.size(); i += 8) text += lines[i] + "\n";
    if (d == 2) text += "\n\n  \xe2\x82\xac \xf0\x9f\x98\x80 trailing  ";  // unseen characters
    if (d == 5) text.clear();                                              // an empty document
    docs.push_back(text);
    std::ofstream(dir / ("doc" + std::to_string(d) + ".txt"), std::ios::binary) << text;
  }
  const std::string cmd = "/usr/bin/python3 " + tool.string() + " " + (dir / "doc*.txt").string() +
                          " --out-dir " + (dir / "out").string() +
                          " --tokenizer bpe --vocab-size 340 --val-every 4 >" +
                          (dir / "log.txt").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::string train = (dir / "out" / "train.h5").string();
  TokenFile file(train);
  const TokenizerInfo& info = file.tokenizer();
  EXPECT_EQ(info.type, "sentencepiece");
  EXPECT_EQ(info.eot, 1);
  EXPECT_FALSE(info.model.empty());
  const Tokenizer tok(info, train);
  std::vector<uint32_t> want;
  for (int d = 0; d < 8; ++d) {
    if (d % 4 == 3) continue;  // val documents
    for (int32_t id : tok.encode(docs[size_t(d)])) want.push_back(uint32_t(id));
    want.push_back(uint32_t(info.eot));
  }
  H5Handle h5(H5Fopen(train.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  H5Handle ds(H5Dopen2(h5.get(), "tokens", H5P_DEFAULT), H5Dclose);
  H5Handle space(H5Dget_space(ds.get()), H5Sclose);
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  std::vector<uint32_t> got(n);
  ASSERT_GE(H5Dread(ds.get(), H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, got.data()), 0);
  EXPECT_EQ(got, want);
  // And decoding the stored ids gives the documents back.
  std::vector<int32_t> ids(got.begin(), got.end());
  std::string all;
  for (int d = 0; d < 8; ++d)
    if (d % 4 != 3) all += docs[size_t(d)];
  EXPECT_EQ(tok.decode(ids), all);
  fs::remove_all(dir);
}
