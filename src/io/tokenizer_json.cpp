#include "io/tokenizer_json.hpp"

#include <cstdlib>

#include "common/error.hpp"

namespace tessera {

const JsonValue* JsonValue::get(const std::string& key) const {
  if (kind != Kind::object) return nullptr;
  for (const auto& [k, v] : object)
    if (k == key) return &v;
  return nullptr;
}

const char* JsonValue::kind_name() const {
  switch (kind) {
    case Kind::null: return "null";
    case Kind::boolean: return "a boolean";
    case Kind::number: return "a number";
    case Kind::string: return "a string";
    case Kind::array: return "an array";
    case Kind::object: return "an object";
  }
  return "?";
}

namespace {

constexpr int kMaxDepth = 128;

class Parser {
 public:
  Parser(const std::string& text, const std::string& where) : s_(text), where_(where) {}

  JsonValue document() {
    JsonValue v = value(0);
    skip_space();
    if (at_ < s_.size()) fail("the end of the document after its value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& expected) const {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < at_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        column = 1;
      } else if ((static_cast<unsigned char>(s_[i]) & 0xC0) != 0x80) {
        ++column;
      }
    }
    const std::string found = at_ >= s_.size() ? "the end of the file"
                                               : "'" + std::string(1, s_[at_]) + "'";
    throw UserError(where_ + ": not valid JSON at line " + std::to_string(line) + ", column " +
                    std::to_string(column) + ": expected " + expected + ", found " + found);
  }

  void skip_space() {
    while (at_ < s_.size() &&
           (s_[at_] == ' ' || s_[at_] == '\t' || s_[at_] == '\n' || s_[at_] == '\r'))
      ++at_;
  }

  bool eat(char c) {
    skip_space();
    if (at_ < s_.size() && s_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }

  void literal(const char* word, size_t n) {
    if (s_.compare(at_, n, word) != 0) fail("a value (object, array, string, number, true, false or null)");
    at_ += n;
  }

  JsonValue value(int depth) {
    if (depth > kMaxDepth) fail("at most " + std::to_string(kMaxDepth) + " levels of nesting");
    skip_space();
    if (at_ >= s_.size()) fail("a value");
    JsonValue v;
    const char c = s_[at_];
    if (c == '{') {
      v.kind = JsonValue::Kind::object;
      ++at_;
      if (eat('}')) return v;
      do {
        skip_space();
        if (at_ >= s_.size() || s_[at_] != '"') fail("a member name in double quotes");
        std::string key = string();
        if (!eat(':')) fail("':' after the member name");
        v.object.emplace_back(std::move(key), value(depth + 1));
      } while (eat(','));
      if (!eat('}')) fail("',' or '}' in an object");
    } else if (c == '[') {
      v.kind = JsonValue::Kind::array;
      ++at_;
      if (eat(']')) return v;
      do v.array.push_back(value(depth + 1));
      while (eat(','));
      if (!eat(']')) fail("',' or ']' in an array");
    } else if (c == '"') {
      v.kind = JsonValue::Kind::string;
      v.string = string();
    } else if (c == 't') {
      literal("true", 4);
      v.kind = JsonValue::Kind::boolean;
      v.boolean = true;
    } else if (c == 'f') {
      literal("false", 5);
      v.kind = JsonValue::Kind::boolean;
    } else if (c == 'n') {
      literal("null", 4);
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = JsonValue::Kind::number;
      v.number = number();
    } else {
      fail("a value (object, array, string, number, true, false or null)");
    }
    return v;
  }

  double number() {
    const size_t start = at_;
    auto digits = [&] {
      const size_t from = at_;
      while (at_ < s_.size() && s_[at_] >= '0' && s_[at_] <= '9') ++at_;
      if (at_ == from) fail("a digit");
    };
    if (s_[at_] == '-') ++at_;
    if (at_ < s_.size() && s_[at_] == '0') ++at_;
    else digits();
    if (at_ < s_.size() && s_[at_] == '.') {
      ++at_;
      digits();
    }
    if (at_ < s_.size() && (s_[at_] == 'e' || s_[at_] == 'E')) {
      ++at_;
      if (at_ < s_.size() && (s_[at_] == '+' || s_[at_] == '-')) ++at_;
      digits();
    }
    return std::strtod(s_.substr(start, at_ - start).c_str(), nullptr);
  }

  unsigned hex4() {
    if (at_ + 4 > s_.size()) fail("four hex digits after \\u");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i, ++at_) {
      const char c = s_[at_];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f') v |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= unsigned(c - 'A' + 10);
      else fail("four hex digits after \\u");
    }
    return v;
  }

  static void put_utf8(unsigned cp, std::string& out) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  // A string at s_[at_] == '"'; raw bytes are copied as they are (the file's own UTF-8).
  std::string string() {
    ++at_;
    std::string out;
    while (true) {
      const size_t from = at_;
      while (at_ < s_.size() && s_[at_] != '"' && s_[at_] != '\\' &&
             static_cast<unsigned char>(s_[at_]) >= 0x20)
        ++at_;
      out.append(s_, from, at_ - from);
      if (at_ >= s_.size()) fail("'\"' to close the string");
      const char c = s_[at_];
      if (c == '"') {
        ++at_;
        return out;
      }
      if (c != '\\') fail("no control character inside a string (escape it)");
      if (++at_ >= s_.size()) fail("an escape after '\\'");
      const char e = s_[at_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && s_.compare(at_, 2, "\\u") == 0) {
            const size_t back = at_;
            at_ += 2;
            const unsigned low = hex4();
            if (low >= 0xDC00 && low < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            else at_ = back;  // a lone high surrogate, then another escape
          }
          put_utf8(cp, out);  // a lone surrogate is kept as its (WTF-8) bytes
          break;
        }
        default:
          --at_;
          fail("one of \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX");
      }
    }
  }

  const std::string& s_;
  const std::string& where_;
  size_t at_ = 0;
};

}  // namespace

JsonValue parse_json(const std::string& text, const std::string& where) {
  return Parser(text, where).document();
}

}  // namespace tessera
