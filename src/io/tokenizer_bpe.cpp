#include "io/tokenizer_bpe.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

#include "common/error.hpp"
#include "common/limits.hpp"
#include "io/tokenizer_json.hpp"

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

int64_t int_of(const JsonValue& v, const std::string& where, const std::string& what) {
  if (v.kind != JsonValue::Kind::number || v.number != std::floor(v.number) || v.number < 0 ||
      v.number >= double(limits::kVocab))
    throw UserError(where + ": " + what + " must be a token id from 0 to " +
                    std::to_string(limits::kVocab - 1) + ", got " + v.kind_name());
  return int64_t(v.number);
}

std::string type_of(const JsonValue& v) {
  const JsonValue* t = v.get("type");
  return t && t->is_string() ? t->string : std::string("?");
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
void read_pre_tokenizer(const JsonValue* pre, const std::string& where,
                        std::vector<std::string>* patterns, bool* prefix_space) {
  const std::string expect =
      " (tessera reads byte-level BPE: a ByteLevel pre-tokenizer, alone or after Split patterns, "
      "as GPT-2 and LLaMA 3 have)";
  if (!pre || pre->is_null()) throw UserError(where + ": no pre_tokenizer" + expect);
  std::vector<const JsonValue*> steps;
  if (type_of(*pre) == "Sequence") {
    const JsonValue* list = pre->get("pretokenizers");
    if (!list || !list->is_array()) throw UserError(where + ": pre_tokenizer Sequence without its pretokenizers list");
    for (const JsonValue& s : list->array) steps.push_back(&s);
  } else {
    steps.push_back(pre);
  }
  bool byte_level = false;
  for (const JsonValue* s : steps) {
    const std::string type = type_of(*s);
    if (type == "ByteLevel") {
      byte_level = true;
      const JsonValue* regex = s->get("use_regex");
      if (!regex || regex->is_null() || regex->boolean) patterns->push_back(kGpt2Pattern);
      const JsonValue* space = s->get("add_prefix_space");
      *prefix_space = space && space->boolean;
    } else if (type == "Split") {
      const JsonValue* pattern = s->get("pattern");
      const JsonValue* regex = pattern ? pattern->get("Regex") : nullptr;
      const JsonValue* behavior = s->get("behavior");
      const JsonValue* invert = s->get("invert");
      if (!regex || !regex->is_string())
        throw UserError(where + ": a Split pre-tokenizer without a {\"Regex\": ...} pattern" + expect);
      if (!behavior || behavior->string != "Isolated" || (invert && invert->boolean))
        throw UserError(where + ": a Split pre-tokenizer of behavior '" +
                        (behavior ? behavior->string : std::string("?")) +
                        "'" + (invert && invert->boolean ? " inverted" : "") +
                        ": tessera reads Isolated, not inverted (as GPT-2 and LLaMA 3 have)");
      patterns->push_back(regex->string);
    } else {
      throw UserError(where + ": pre-tokenizer '" + type + "'" + expect);
    }
  }
  if (!byte_level) throw UserError(where + ": the pre-tokenizer has no ByteLevel step" + expect);
}

// The kind checks of the model, the normalizer and the decoder.
void check_kind(const JsonValue& root, const std::string& where) {
  const std::string expect =
      " (tessera reads byte-level BPE tokenizer.json files, as GPT-2 and LLaMA 3 have)";
  if (!root.is_object()) throw UserError(where + ": the document is " + root.kind_name() + ", not an object" + expect);
  const JsonValue* model = root.get("model");
  if (!model || !model->is_object()) throw UserError(where + ": no \"model\" object" + expect);
  if (type_of(*model) != "BPE")
    throw UserError(where + ": model type '" + type_of(*model) + "'" + expect);
  const JsonValue* fallback = model->get("byte_fallback");
  if (fallback && fallback->boolean)
    throw UserError(where + ": a BPE with byte_fallback (sentencepiece-style, as LLaMA 2's)" + expect);
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const JsonValue* a = model->get(affix);
    if (a && a->is_string() && !a->string.empty())
      throw UserError(where + ": model." + affix + " '" + a->string + "'" + expect);
  }
  if (const JsonValue* n = root.get("normalizer"); n && !n->is_null())
    throw UserError(where + ": normalizer '" + type_of(*n) + "'" + expect);
  if (const JsonValue* d = root.get("decoder"); d && !d->is_null() && type_of(*d) != "ByteLevel")
    throw UserError(where + ": decoder '" + type_of(*d) + "'" + expect);
}

}  // namespace

ByteLevelBpe::ByteLevelBpe(const std::string& json, const std::string& where) : where_(where) {
  const JsonValue root = parse_json(json, where);
  check_kind(root, where);
  std::vector<std::string> sources;
  read_pre_tokenizer(root.get("pre_tokenizer"), where, &sources, &add_prefix_space_);
  for (const std::string& source : sources) compile_pattern(source);
  const JsonValue& model = *root.get("model");
  const JsonValue* ignore = model.get("ignore_merges");
  ignore_merges_ = ignore && ignore->boolean;
  std::unordered_map<std::string, int32_t> spelled;  // the vocabulary as the file spells it
  read_vocabulary(model, root.get("added_tokens"), &spelled);
  read_merges(model, spelled);
  if (const JsonValue* t = root.get("tessera"); t && t->is_object()) {
    auto id = [&](const char* key) -> int64_t {
      const JsonValue* v = t->get(key);
      if (v && v->is_array() && !v->array.empty()) v = &v->array[0];  // eos as a list
      if (!v || v->is_null()) return -1;
      const int64_t i = int_of(*v, where, std::string("tessera.") + key);
      if (i >= vocab_size())
        throw UserError(where + ": tessera." + key + " " + std::to_string(i) + " is not an id of the " +
                        std::to_string(vocab_size()) + "-token vocabulary");
      return i;
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
void ByteLevelBpe::read_vocabulary(const JsonValue& model, const JsonValue* added,
                                   std::unordered_map<std::string, int32_t>* spelled) {
  const JsonValue* vocab = model.get("vocab");
  if (!vocab || !vocab->is_object() || vocab->object.empty())
    throw UserError(where_ + ": model.vocab must be a non-empty object of token -> id");
  int64_t size = 0;
  for (const auto& [token, id] : vocab->object) {
    const int64_t i = int_of(id, where_, "model.vocab[\"" + token + "\"]");
    spelled->emplace(token, int32_t(i));
    size = std::max(size, i + 1);
  }
  if (added && !added->is_null() && !added->is_array())
    throw UserError(where_ + ": added_tokens must be an array");
  if (added)
    for (const JsonValue& a : added->array) {
      const JsonValue* content = a.get("content");
      const JsonValue* id = a.get("id");
      if (!content || !content->is_string() || !id)
        throw UserError(where_ + ": each of added_tokens needs an id and a content string");
      size = std::max(size, int_of(*id, where_, "added token '" + content->string + "'") + 1);
    }
  token_bytes_.assign(size_t(size), std::string());
  special_.assign(size_t(size), 0);
  std::string bytes;
  for (const auto& [token, id] : *spelled) {
    if (!unmap(token, &bytes)) bytes = token;
    token_bytes_[size_t(id)] = bytes;
    vocab_.emplace(bytes, id);
  }
  if (added)
    for (const JsonValue& a : added->array) {
      const int32_t id = int32_t(a.get("id")->number);
      const JsonValue* special = a.get("special");
      added_.emplace_back(a.get("content")->string, id);
      if (special && special->boolean) {
        special_[size_t(id)] = 1;
        token_bytes_[size_t(id)].clear();
      } else if (!spelled->count(a.get("content")->string)) {
        token_bytes_[size_t(id)] = a.get("content")->string;
      }
    }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(std::string(1, char(b)));
    if (it == vocab_.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      throw UserError(where_ + ": byte " + hex + " (spelled U+" +
                      std::to_string(byte_map().to_char[b]) +
                      ") has no token in model.vocab: not a byte-level BPE vocabulary");
    }
    byte_token_[b] = it->second;
  }
}

// model.merges, "a b" strings or ["a", "b"] pairs, ranked by their order.
void ByteLevelBpe::read_merges(const JsonValue& model,
                               const std::unordered_map<std::string, int32_t>& spelled) {
  const JsonValue* merges = model.get("merges");
  if (!merges || !merges->is_array()) throw UserError(where_ + ": model.merges must be an array");
  uint32_t rank = 0;
  for (const JsonValue& m : merges->array) {
    std::string left, right;
    if (m.is_string()) {
      const size_t space = m.string.find(' ');
      if (space == std::string::npos || m.string.find(' ', space + 1) != std::string::npos)
        throw UserError(where_ + ": merge " + std::to_string(rank) + " '" + m.string +
                        "' is not two tokens separated by one space");
      left = m.string.substr(0, space);
      right = m.string.substr(space + 1);
    } else if (m.is_array() && m.array.size() == 2 && m.array[0].is_string() && m.array[1].is_string()) {
      left = m.array[0].string;
      right = m.array[1].string;
    } else {
      throw UserError(where_ + ": merge " + std::to_string(rank) +
                      " must be a string \"a b\" or a pair [\"a\", \"b\"], got " + m.kind_name());
    }
    auto l = spelled.find(left), r = spelled.find(right), lr = spelled.find(left + right);
    if (l == spelled.end() || r == spelled.end() || lr == spelled.end())
      throw UserError(where_ + ": merge " + std::to_string(rank) + " '" + left + " " + right +
                      "': '" + (l == spelled.end() ? left : r == spelled.end() ? right : left + right) +
                      "' is not in model.vocab");
    const uint64_t pair = (uint64_t(uint32_t(l->second)) << 32) | uint32_t(r->second);
    merges_.emplace(pair, (uint64_t(rank) << 32) | uint32_t(lr->second));
    ++rank;
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
