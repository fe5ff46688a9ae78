#include "io/tokenizer.hpp"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <iterator>

#include "common/error.hpp"
#include "common/limits.hpp"
#include "io/hdf5_util.hpp"
#include "io/tokenizer_bpe.hpp"

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
                    " MiB a tokenizer model can be");
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
                    " bytes) does not load (a damaged file, or not one tools/data/prepare_data.py wrote): " +
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

// A loaded hf-bpe tokenizer.json, checked against the attributes recorded beside it.
std::unique_ptr<ByteLevelBpe> load_bpe(const TokenizerInfo& info, const std::string& where) {
  if (info.model.empty())
    throw UserError(where + ": tokenizer 'hf-bpe' without its tokenizer.json (a token file keeps "
                    "it in /tokenizer_model, a checkpoint in /tokenizer/model)");
  auto bpe = std::make_unique<ByteLevelBpe>(info.model, where + " (its hf-bpe tokenizer.json)");
  if (bpe->vocab_size() != info.vocab_size)
    throw UserError(where + ": the hf-bpe tokenizer.json has " + std::to_string(bpe->vocab_size()) +
                    " ids, the vocab_size attribute says " + std::to_string(info.vocab_size));
  return bpe;
}

}  // namespace

bool tokenizer_known(const TokenizerInfo& info) {
  return info.type == "byte" || !info.model.empty();
}

std::string tokenizer_hash(const TokenizerInfo& info) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xFF) * 1099511628211ull;
  };
  mix(info.type);
  mix(std::to_string(info.vocab_size));
  mix(info.model);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

std::string tokenizer_mismatch(const TokenizerInfo& a, const std::string& a_where,
                               const TokenizerInfo& b, const std::string& b_where) {
  auto name = [](const TokenizerInfo& t) {
    return "'" + t.type + "' (vocab_size " + std::to_string(t.vocab_size) +
           (tokenizer_known(t) ? ", hash " + tokenizer_hash(t) : std::string()) + ")";
  };
  const bool known = tokenizer_known(a) && tokenizer_known(b);
  if (a.vocab_size > 0 && b.vocab_size > 0 && a.vocab_size != b.vocab_size)
    return a_where + " has tokenizer " + name(a) + ", " + b_where + " has " + name(b) +
           ": their vocabularies differ";
  if (known && tokenizer_hash(a) != tokenizer_hash(b))
    return a_where + " has tokenizer " + name(a) + ", " + b_where + " has " + name(b) +
           ": the same ids mean different text";
  return "";
}

void check_tokenizer(const TokenizerInfo& info, const std::string& file) {
  // "none": Megatron and raw data record no tokenizer (vocab_size 0, eot -1).
  const char* const known[] = {"byte", "sentencepiece", "hf-bpe", "gpt2", "llama3", "none"};
  if (std::find(std::begin(known), std::end(known), info.type) == std::end(known))
    throw UserError(file + ": unknown tokenizer '" + info.type +
                    "' (tessera knows byte, sentencepiece, hf-bpe, gpt2, llama3 and none)");
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
  if (info.type == "hf-bpe") load_bpe(info, file);
}

Tokenizer::Tokenizer(const TokenizerInfo& info, const std::string& where)
    : info_(info), where_(where) {
  if (info_.type == "sentencepiece") {
    sp_ = load_model(info_, where_);
  } else if (info_.type == "hf-bpe") {
    bpe_ = load_bpe(info_, where_);
  } else if (info_.type != "byte") {
    throw UserError(where_ + ": tokenizer '" + info_.type +
                    "' cannot be encoded or decoded by this tessera (it knows byte, sentencepiece "
                    "and hf-bpe, which tools/data/prepare_data.py --tokenizer tokenizer.json and "
                    "tools/interop/import_weights.py --tokenizer store)");
  }
}

Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  if (bpe_) return bpe_->encode(text);
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
  if (bpe_) return bpe_->decode(ids);
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

int64_t Tokenizer::bos() const {
  return bpe_ && bpe_->bos() >= 0 && bpe_->bos() != info_.eot ? bpe_->bos() : -1;
}

std::vector<uint32_t> Tokenizer::token_byte_lengths() const {
  std::vector<uint32_t> bytes(size_t(std::max<int64_t>(info_.vocab_size, 0)), 0);
  for (size_t id = 0; id < bytes.size(); ++id) {
    if (int64_t(id) == info_.eot) continue;
    if (bpe_) {
      bytes[id] = uint32_t(bpe_->token_bytes(int32_t(id)).size());
    } else if (sp_) {
      const int i = int(id);
      if (sp_->IsControl(i) || sp_->IsUnknown(i) || sp_->IsUnused(i)) continue;
      if (sp_->IsByte(i)) {
        bytes[id] = 1;
        continue;
      }
      const std::string piece = sp_->IdToPiece(i);
      static const std::string kSpace = "\xE2\x96\x81";  // U+2581, sentencepiece's space
      uint32_t n = 0;
      for (size_t k = 0; k < piece.size();) {
        if (piece.compare(k, kSpace.size(), kSpace) == 0) k += kSpace.size(), n += 1;
        else ++k, ++n;
      }
      bytes[id] = n;
    } else {
      bytes[id] = id < 256 ? 1 : 0;
    }
  }
  return bytes;
}

}  // namespace tessera
