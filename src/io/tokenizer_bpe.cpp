#include "io/tokenizer_bpe.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdio>
#include <functional>

#include "common/error.hpp"
#include "common/limits.hpp"
#include "io/json.hpp"

namespace tessera {

namespace {

// GPT-2's pattern: what a ByteLevel pre-tokenizer with use_regex applies.
const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Pieces longer than this are not cached (long runs of spaces or digits are rare and unique).
constexpr size_t kCachedPieceBytes = 64;
constexpr size_t kCacheEntries = 1 << 18;

// GPT-2's bytes_to_unicode(): byte b is spelled in the vocabulary as code point kByteChar[b].
struct ByteMap {
  uint32_t to_char[256];
  int to_byte[324];  // code point -> byte, -1 if none (every code point used is below 324)
  ByteMap() {
    std::fill(std::begin(to_byte), std::end(to_byte), -1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_char[b] = printable ? uint32_t(b) : uint32_t(256 + extra++);
      to_byte[to_char[b]] = b;
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

// The raw bytes a vocabulary entry spells, or false when it holds a character the byte map does
// not use (an added token written as its text).
bool unmap(const std::string& token, std::string* bytes) {
  const ByteMap& m = byte_map();
  bytes->clear();
  for (size_t i = 0; i < token.size();) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    uint32_t cp = 0;
    size_t n = 1;
    if (c < 0x80) cp = c;
    else if ((c & 0xE0) == 0xC0 && i + 1 < token.size()) cp = c & 0x1F, n = 2;
    else return false;
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(token[i + k]) & 0x3F);
    if (cp >= 324 || m.to_byte[cp] < 0) return false;
    bytes->push_back(char(m.to_byte[cp]));
    i += n;
  }
  return true;
}

// \s and \S as Unicode White_Space (Oniguruma's and tiktoken's reading; PCRE2's \s leaves out
// U+0085 and \v-like separators); other escapes are copied as they are.
std::string white_space_as_property(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') out += "\\p{White_Space}";
      else if (e == 'S') out += "\\P{White_Space}";
      else out += std::string{'\\', e};
    } else {
      out += pattern[i];
    }
  }
  return out;
}

struct StringViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

}  // namespace

struct ByteLevelBpe::Regex {
  pcre2_code* code = nullptr;
  std::string source;
  ~Regex() { pcre2_code_free(code); }
};

class ByteLevelBpe::Scratch {
 public:
  explicit Scratch(const std::vector<std::unique_ptr<Regex>>& patterns) {
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 << 10, 8 << 20, nullptr);
    if (context && stack) pcre2_jit_stack_assign(context, nullptr, stack);
    for (const auto& p : patterns) match.push_back(pcre2_match_data_create_from_pattern(p->code, nullptr));
  }
  ~Scratch() {
    for (pcre2_match_data* m : match) pcre2_match_data_free(m);
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  std::vector<pcre2_match_data*> match;
  std::unordered_map<std::string, std::vector<int32_t>, StringViewHash, std::equal_to<>> cache;
  // encode_piece's work space
  std::vector<int32_t> ids;
  std::vector<int> prev, next;
  std::vector<std::pair<uint32_t, uint32_t>> heap;  // (rank, position)
  std::vector<std::pair<size_t, std::string_view>> todo;  // split's (pattern, part), next on top
};

namespace {

// The pre-tokenizer's patterns and its add_prefix_space, or UserError naming the kind found.
void read_pre_tokenizer(const JsonAt& pre, std::vector<std::string>* patterns, bool* prefix_space) {
  const std::string expect =
      " (tessera reads byte-level BPE: a ByteLevel pre-tokenizer, alone or after Split patterns, "
      "as GPT-2 and LLaMA 3 have)";
  if (pre.is_null()) pre.refuse(": none" + expect);
  std::vector<JsonAt> steps;
  if (pre.type() == "Sequence") {
    const JsonAt list = pre["pretokenizers"];
    if (!list->is_array()) list.fail("an array of pre-tokenizers");
    const size_t n = list.size(limits::kPreTokenizerSteps, limits::kPreTokenizerStepsWhy);
    for (size_t i = 0; i < n; ++i) steps.push_back(list[i]);
  } else {
    steps.push_back(pre);
  }
  bool byte_level = false;
  for (const JsonAt& s : steps) {
    if (!s->is_object()) s.fail("a pre-tokenizer object");
    const std::string type = s.type();
    if (type == "ByteLevel") {
      byte_level = true;
      if (s["use_regex"].boolean(true)) patterns->push_back(kGpt2Pattern);
      *prefix_space = s["add_prefix_space"].boolean(false);
    } else if (type == "Split") {
      const JsonAt pattern = s["pattern"];
      if (!pattern->is_object() || !pattern->contains("Regex"))
        pattern.fail("{\"Regex\": \"...\"}" + expect);
      patterns->push_back(pattern["Regex"].string());
      const std::string& behavior = s["behavior"].string();
      const bool invert = s["invert"].boolean(false);
      if (behavior != "Isolated" || invert)
        s.refuse(": a Split pre-tokenizer of behavior '" + behavior + "'" + (invert ? " inverted" : "") +
                 ": tessera reads Isolated, not inverted (as GPT-2 and LLaMA 3 have)");
    } else {
      s.refuse(": type '" + type + "'" + expect);
    }
  }
  if (!byte_level) pre.refuse(": no ByteLevel step" + expect);
}

// The kind checks of the model, the normalizer and the decoder.
void check_kind(const JsonAt& root) {
  const std::string expect =
      " (tessera reads byte-level BPE tokenizer.json files, as GPT-2 and LLaMA 3 have)";
  if (!root->is_object()) root.fail("an object" + expect);
  const JsonAt model = root["model"];
  if (!model->is_object()) model.fail("an object" + expect);
  // Files of older Hugging Face tokenizers leave the type out of a BPE (it has merges).
  const std::string type = model["type"].is_null() && model->contains("merges") ? "BPE" : model.type();
  if (type != "BPE") throw UserError(model.where() + ": model type '" + type + "'" + expect);
  if (model["byte_fallback"].boolean(false))
    model.refuse(": a BPE with byte_fallback (sentencepiece-style, as LLaMA 2's)" + expect);
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const JsonAt a = model[affix];
    if (!a.is_null() && !a.string().empty()) a.refuse(": '" + a.string() + "'" + expect);
  }
  if (const JsonAt n = root["normalizer"]; !n.is_null())
    n.refuse(": type '" + n.type() + "'" + expect);
  if (const JsonAt d = root["decoder"]; !d.is_null() && d.type() != "ByteLevel")
    d.refuse(": type '" + d.type() + "'" + expect);
}

}  // namespace

ByteLevelBpe::ByteLevelBpe(const std::string& json, const std::string& where) : where_(where) {
  const Json doc = parse_json(json, where_, "tokenizer.json", limits::kTokenizerJsonBytes,
                              limits::kTokenizerJsonBytesWhy);
  const JsonAt root(doc, where_);
  check_kind(root);
  std::vector<std::string> sources;
  read_pre_tokenizer(root["pre_tokenizer"], &sources, &add_prefix_space_);
  for (const std::string& source : sources) compile_pattern(source);
  const JsonAt model = root["model"];
  ignore_merges_ = model["ignore_merges"].boolean(false);
  std::unordered_map<std::string, int32_t> spelled;  // the vocabulary as the file spells it
  read_vocabulary(model, root["added_tokens"], &spelled);
  read_merges(model, spelled);
  if (const JsonAt t = root["tessera"]; t->is_object()) {
    auto id = [&](const char* key) -> int64_t {
      JsonAt v = t[key];
      if (v->is_array() && !v->empty()) v = v[size_t(0)];  // eos as a list
      return v.is_null() ? -1 : v.integer(0, vocab_size() - 1);
    };
    bos_ = id("bos_token_id");
    eos_ = id("eos_token_id");
    pad_ = id("pad_token_id");
  }
}

void ByteLevelBpe::compile_pattern(const std::string& source) {
  auto re = std::make_unique<Regex>();
  re->source = source;
  const std::string pattern = white_space_as_property(source);
  int error = 0;
  PCRE2_SIZE offset = 0;
  re->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                           PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (!re->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    throw UserError(where_ + ": the pre-tokenizer pattern " + source + " does not compile: " +
                    reinterpret_cast<const char*>(message));
  }
  pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);  // where JIT is missing, the interpreter
  patterns_.push_back(std::move(re));
}

// model.vocab and added_tokens: every id's bytes, the special ones, and the token of each byte.
void ByteLevelBpe::read_vocabulary(const JsonAt& model, const JsonAt& added,
                                   std::unordered_map<std::string, int32_t>* spelled) {
  const JsonAt vocab = model["vocab"];
  if (!vocab->is_object() || vocab->empty()) vocab.fail("a non-empty object of token -> id");
  vocab.size(size_t(limits::kVocab), limits::kVocabWhy);
  int64_t size = 0;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const int64_t i = vocab[it.key()].integer(0, limits::kVocab - 1);
    spelled->emplace(it.key(), int32_t(i));
    size = std::max(size, i + 1);
  }
  if (!added.is_null() && !added->is_array()) added.fail("an array of tokens");
  const size_t n_added = added.size(size_t(limits::kVocab), limits::kVocabWhy);
  for (size_t k = 0; k < n_added; ++k) {
    const JsonAt a = added[k];
    if (!a->is_object()) a.fail("a token {\"id\": ..., \"content\": ...}");
    a["content"].string();
    a["special"].boolean(false);
    size = std::max(size, a["id"].integer(0, limits::kVocab - 1) + 1);
  }
  token_bytes_.assign(size_t(size), std::string());
  special_.assign(size_t(size), 0);
  std::string bytes;
  for (const auto& [token, id] : *spelled) {
    if (!unmap(token, &bytes)) bytes = token;
    token_bytes_[size_t(id)] = bytes;
    vocab_.emplace(bytes, id);
  }
  for (size_t k = 0; k < n_added; ++k) {
    const JsonAt a = added[k];
    const int32_t id = int32_t(a["id"]->get<int64_t>());
    const std::string& content = a["content"].string();
    added_.emplace_back(content, id);
    if (a["special"].boolean(false)) {
      special_[size_t(id)] = 1;
      token_bytes_[size_t(id)].clear();
    } else if (!spelled->count(content)) {
      token_bytes_[size_t(id)] = content;
    }
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(std::string(1, char(b)));
    if (it == vocab_.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      vocab.refuse(": byte " + std::string(hex) + " (spelled U+" + std::to_string(byte_map().to_char[b]) +
                   ") has no token: not a byte-level BPE vocabulary");
    }
    byte_token_[b] = it->second;
  }
}

// model.merges, "a b" strings or ["a", "b"] pairs, ranked by their order.
void ByteLevelBpe::read_merges(const JsonAt& model,
                               const std::unordered_map<std::string, int32_t>& spelled) {
  const JsonAt merges = model["merges"];
  if (!merges->is_array()) merges.fail("an array of merges");
  const size_t n = merges.size(size_t(limits::kVocab), limits::kVocabWhy);
  for (uint32_t rank = 0; rank < n; ++rank) {
    const JsonAt m = merges[rank];
    std::string left, right;
    if (m->is_string()) {
      const std::string& s = m.string();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        m.refuse(": '" + s + "' is not two tokens separated by one space");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m->is_array() && m->size() == 2 && (*m)[0].is_string() && (*m)[1].is_string()) {
      left = (*m)[0].get<std::string>();
      right = (*m)[1].get<std::string>();
    } else {
      m.fail("a string \"a b\" or a pair [\"a\", \"b\"]");
    }
    auto l = spelled.find(left), r = spelled.find(right), lr = spelled.find(left + right);
    if (l == spelled.end() || r == spelled.end() || lr == spelled.end())
      m.refuse(": '" + left + " " + right + "': '" +
               (l == spelled.end() ? left : r == spelled.end() ? right : left + right) +
               "' is not in model.vocab");
    const uint64_t pair = (uint64_t(uint32_t(l->second)) << 32) | uint32_t(r->second);
    merges_.emplace(pair, (uint64_t(rank) << 32) | uint32_t(lr->second));
  }
}

ByteLevelBpe::~ByteLevelBpe() = default;

void ByteLevelBpe::ScratchDeleter::operator()(Scratch* s) const { delete s; }

ByteLevelBpe::ScratchPtr ByteLevelBpe::make_scratch() const {
  return ScratchPtr(new Scratch(patterns_));
}

int64_t ByteLevelBpe::added_token(const std::string& content) const {
  for (const auto& [c, id] : added_)
    if (c == content) return id;
  return -1;
}

// One piece's ids: its bytes, merged by rank (the leftmost pair of the lowest rank first).
void ByteLevelBpe::encode_piece(std::string_view piece, Scratch& sc, std::vector<int32_t>* out) const {
  if (piece.size() == 1) {
    out->push_back(byte_token_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  const bool cached = piece.size() <= kCachedPieceBytes;
  if (cached) {
    auto hit = sc.cache.find(piece);
    if (hit != sc.cache.end()) {
      out->insert(out->end(), hit->second.begin(), hit->second.end());
      return;
    }
  }
  const size_t first = out->size();
  auto whole = ignore_merges_ ? vocab_.find(std::string(piece)) : vocab_.end();
  if (whole != vocab_.end()) {
    out->push_back(whole->second);
  } else {
    const int n = int(piece.size());
    auto& ids = sc.ids;
    auto& prev = sc.prev;
    auto& next = sc.next;
    auto& heap = sc.heap;
    ids.resize(size_t(n));
    prev.resize(size_t(n));
    next.resize(size_t(n));
    heap.clear();
    for (int i = 0; i < n; ++i) {
      ids[i] = byte_token_[static_cast<unsigned char>(piece[size_t(i)])];
      prev[i] = i - 1;
      next[i] = i + 1 < n ? i + 1 : -1;
    }
    auto rank_of = [&](int i, uint64_t* merged) {
      if (i < 0 || next[i] < 0) return false;
      auto m = merges_.find((uint64_t(uint32_t(ids[i])) << 32) | uint32_t(ids[next[i]]));
      if (m == merges_.end()) return false;
      *merged = m->second;
      return true;
    };
    const auto later = std::greater<std::pair<uint32_t, uint32_t>>();
    auto push = [&](int i) {
      uint64_t merged;
      if (rank_of(i, &merged)) {
        heap.emplace_back(uint32_t(merged >> 32), uint32_t(i));
        std::push_heap(heap.begin(), heap.end(), later);
      }
    };
    for (int i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), later);
      const auto [rank, pos] = heap.back();
      heap.pop_back();
      const int i = int(pos);
      uint64_t merged;
      // A stale entry: its left symbol was merged away (ids[i] < 0) or its pair changed.
      if (ids[i] < 0 || !rank_of(i, &merged) || uint32_t(merged >> 32) != rank) continue;
      const int j = next[i];
      ids[i] = int32_t(uint32_t(merged));
      ids[j] = -1;
      next[i] = next[j];
      if (next[j] >= 0) prev[next[j]] = i;
      push(prev[i]);
      push(i);
    }
    for (int i = 0; i >= 0; i = next[i]) out->push_back(ids[i]);
  }
  if (cached) {
    if (sc.cache.size() >= kCacheEntries) sc.cache.clear();
    sc.cache.emplace(std::string(piece), std::vector<int32_t>(out->begin() + long(first), out->end()));
  }
}

// Splits text by the first pattern (the matches and the text between them), each part by the
// next pattern, and encodes the parts of the last: depth first, left to right, off a stack of
// (pattern, part) rather than a call per pattern.
void ByteLevelBpe::split(std::string_view text, Scratch& sc, std::vector<int32_t>* out) const {
  auto& todo = sc.todo;
  todo.assign(1, {0, text});
  while (!todo.empty()) {
    const auto [level, part] = todo.back();
    todo.pop_back();
    if (part.empty()) continue;
    if (level == patterns_.size()) {
      encode_piece(part, sc, out);
      continue;
    }
    pcre2_code* code = patterns_[level]->code;
    pcre2_match_data* md = sc.match[level];
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(part.data());
    const size_t first = todo.size();
    size_t gap = 0, from = 0;  // the text not yet cut off starts at gap; the search at from
    while (from <= part.size()) {
      const int rc = pcre2_match(code, subject, part.size(), from, 0, md, sc.context);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof message);
        throw UserError(where_ + ": the pre-tokenizer pattern " + patterns_[level]->source +
                        " failed on the text: " + reinterpret_cast<const char*>(message));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t start = ov[0], end = ov[1];
      if (end == start) {  // an empty match: search again one byte on (the byte stays in the gap)
        from = start + 1;
        continue;
      }
      if (start > gap) todo.emplace_back(level + 1, part.substr(gap, start - gap));
      todo.emplace_back(level + 1, part.substr(start, end - start));
      gap = from = end;
    }
    if (gap < part.size()) todo.emplace_back(level + 1, part.substr(gap));
    std::reverse(todo.begin() + long(first), todo.end());  // the leftmost part on top
  }
}

void ByteLevelBpe::encode(std::string_view text, Scratch& scratch, std::vector<int32_t>* out) const {
  if (add_prefix_space_ && !text.empty() && text[0] != ' ') {
    std::string spaced(text.size() + 1, ' ');
    text.copy(spaced.data() + 1, text.size());
    split(spaced, scratch, out);
  } else {
    split(text, scratch, out);
  }
}

std::vector<int32_t> ByteLevelBpe::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  const auto scratch = make_scratch();
  encode(text, *scratch, &ids);
  return ids;
}

std::string ByteLevelBpe::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (int32_t id : ids)
    if (id >= 0 && id < vocab_size()) text += token_bytes_[size_t(id)];
  return text;
}

}  // namespace tessera
