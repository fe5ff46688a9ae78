#include "io/tokenizer.hpp"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cctype>
#include <iterator>

#include "common/error.hpp"
#include "common/limits.hpp"
#include "io/hdf5_util.hpp"

namespace tessera {

std::string read_tokenizer_model(hid_t loc, const std::string& file, const std::string& name) {
  if (H5Lexists(loc, name.c_str(), H5P_DEFAULT) <= 0) return "";
  H5Handle dset(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) throw UserError(file + ": cannot open the tokenizer model dataset " + name);
  H5Handle type(H5Dget_type(dset.get()), H5Tclose);
  H5Handle space(H5Dget_space(dset.get()), H5Sclose);
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_size(type.get()) != 1 ||
      H5Sget_simple_extent_ndims(space.get()) != 1)
    throw UserError(file + ": the tokenizer model " + name + " must be a 1-D uint8 dataset");
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  if (n > uint64_t(limits::kTokenizerModelBytes))
    throw UserError(file + ": the tokenizer model " + name + " declares " + std::to_string(n) +
                    " bytes, more than the " + std::to_string(limits::kTokenizerModelBytes >> 20) +
                    " MiB a sentencepiece model can be");
  std::string model(size_t(n), '\0');
  if (n > 0 && H5Dread(dset.get(), H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, model.data()) < 0)
    throw UserError(file + ": read of the tokenizer model " + name + " failed", kExitIO);
  return model;
}

void write_tokenizer_model(hid_t loc, const std::string& name, const std::string& model,
                           bool write_data, hid_t dxpl) {
  if (model.empty()) return;
  const hsize_t n = model.size();
  H5Handle space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  H5Handle dset(H5Dcreate2(loc, name.c_str(), H5T_STD_U8LE, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                           H5P_DEFAULT),
                H5Dclose);
  if (!dset.valid() ||
      (write_data &&
       H5Dwrite(dset.get(), H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, dxpl, model.data()) < 0))
    throw UserError("HDF5: cannot write the tokenizer model " + name, kExitIO);
}

namespace {

// A loaded sentencepiece model, or UserError naming `where` and what is wrong with it.
std::unique_ptr<sentencepiece::SentencePieceProcessor> load_model(const TokenizerInfo& info,
                                                                   const std::string& where) {
  if (info.model.empty())
    throw UserError(where + ": tokenizer 'sentencepiece' without its model (a token file keeps it "
                    "in /tokenizer_model, a checkpoint in /tokenizer/model)");
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->LoadFromSerializedProto(info.model);
  if (!status.ok()) {
    std::string why = status.ToString();
    while (!why.empty() && std::isspace(static_cast<unsigned char>(why.back()))) why.pop_back();
    throw UserError(where + ": the sentencepiece tokenizer model (" +
                    std::to_string(info.model.size()) +
                    " bytes) does not load (a damaged file, or not one tools/prepare_data.py wrote): " +
                    why);
  }
  if (sp->GetPieceSize() != info.vocab_size)
    throw UserError(where + ": the sentencepiece model has " + std::to_string(sp->GetPieceSize()) +
                    " pieces, the vocab_size attribute says " + std::to_string(info.vocab_size));
  if (info.eot < 0 || info.eot >= info.vocab_size)
    throw UserError(where + ": eot " + std::to_string(info.eot) + " is not an id of the " +
                    std::to_string(info.vocab_size) + "-piece sentencepiece model");
  return sp;
}

}  // namespace

void check_tokenizer(const TokenizerInfo& info, const std::string& file) {
  // "none": Megatron and raw data record no tokenizer (vocab_size 0, eot -1).
  const char* const known[] = {"byte", "sentencepiece", "gpt2", "llama3", "none"};
  if (std::find(std::begin(known), std::end(known), info.type) == std::end(known))
    throw UserError(file + ": unknown tokenizer '" + info.type +
                    "' (tessera knows byte, sentencepiece, gpt2, llama3 and none)");
  const int64_t min_vocab = info.type == "none" ? 0 : 1;
  if (info.vocab_size < min_vocab || info.vocab_size > limits::kVocab)
    throw UserError(file + ": tokenizer vocab_size " + std::to_string(info.vocab_size) +
                    " is outside " + std::to_string(min_vocab) + ".." +
                    std::to_string(limits::kVocab) + " (" + limits::kVocabWhy + ")");
  // -1: no end-of-text token recorded.
  if (info.eot < -1 || (info.eot >= info.vocab_size && info.vocab_size > 0))
    throw UserError(file + ": tokenizer eot " + std::to_string(info.eot) +
                    " is not an id of the vocabulary (0.." + std::to_string(info.vocab_size - 1) +
                    ")");
  if (info.type == "sentencepiece") load_model(info, file);
}

Tokenizer::Tokenizer(const TokenizerInfo& info, const std::string& where)
    : info_(info), where_(where) {
  if (info_.type == "sentencepiece") {
    sp_ = load_model(info_, where_);
  } else if (info_.type != "byte") {
    throw UserError(where_ + ": tokenizer '" + info_.type +
                    "' cannot be encoded or decoded by this tessera (it knows byte and "
                    "sentencepiece)");
  }
}

Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  if (!sp_) {
    ids.reserve(text.size());
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::vector<int> pieces;
  const auto status = sp_->Encode(text, &pieces);
  if (!status.ok()) throw UserError(where_ + ": sentencepiece cannot encode the text: " + status.ToString());
  ids.assign(pieces.begin(), pieces.end());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  if (!sp_) {
    for (int32_t id : ids)
      if (id >= 0 && id < 256) text.push_back(char(id));
    return text;
  }
  std::vector<int> pieces;
  pieces.reserve(ids.size());
  for (int32_t id : ids)
    if (id >= 0 && id < info_.vocab_size && id != info_.eot) pieces.push_back(id);
  const auto status = sp_->Decode(pieces, &text);
  if (!status.ok()) throw UserError(where_ + ": sentencepiece cannot decode: " + status.ToString());
  return text;
}

}  // namespace tessera
