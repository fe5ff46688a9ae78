#include "io/json.hpp"

#include <cstdio>

#include "common/error.hpp"
#include "common/limits.hpp"

namespace tessera {

std::string json_text(const JsonRow& row) {
  return row.dump(-1, ' ', false, JsonRow::error_handler_t::replace);
}

namespace {

const Json& null_json() {
  static const Json null;
  return null;
}

// A member's step of a JSON path: ".name" (at the root "name") for an identifier, else ["..."]
// as JSON writes it.
std::string member_step(const std::string& path, const std::string& key) {
  bool identifier = !key.empty() && !(key[0] >= '0' && key[0] <= '9');
  for (char c : key)
    identifier = identifier && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                                (c >= '0' && c <= '9') || c == '_');
  if (identifier) return path.empty() ? key : "." + key;
  std::string out = "[\"";
  for (char c : key) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\u%04x", unsigned(c));
      out += hex;
    } else {
      out += c;
    }
  }
  return out + "\"]";
}

// nlohmann's own DOM builder (nlohmann::detail, as 3.9 to 3.11 have it) with the nesting counted.
// A parser callback could count it too, but parsed a 7 MB file 50 times slower (7 s, not 0.1 s).
class DepthBoundDom : public nlohmann::detail::json_sax_dom_parser<Json> {
 public:
  using Dom = nlohmann::detail::json_sax_dom_parser<Json>;
  DepthBoundDom(Json& doc, const std::string& where, const std::string& what)
      : Dom(doc, true), where_(where), what_(what) {}
  bool start_object(std::size_t n) { return enter() && Dom::start_object(n); }
  bool start_array(std::size_t n) { return enter() && Dom::start_array(n); }
  bool end_object() {
    --depth_;
    return Dom::end_object();
  }
  bool end_array() {
    --depth_;
    return Dom::end_array();
  }

 private:
  bool enter() {
    if (++depth_ > limits::kJsonDepth)
      throw UserError(where_ + ": not JSON tessera reads: nested more than " +
                      std::to_string(limits::kJsonDepth) + " levels deep (a " + what_ +
                      " nests a few)");
    return true;
  }
  const std::string& where_;
  const std::string& what_;
  int depth_ = 0;
};

}  // namespace

const char* json_kind(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::string: return "a string";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "an integer";
    case Json::value_t::number_float: return "a number with a fraction or exponent";
    default: return "a value JSON does not have";
  }
}

void check_json_bytes(int64_t bytes, const std::string& where, const std::string& what,
                      int64_t max_bytes, const char* max_bytes_why) {
  if (bytes > max_bytes)
    throw UserError(where + ": " + std::to_string(bytes) + " bytes, more than the " +
                    std::to_string(max_bytes) + " a " + what + " may have (" + max_bytes_why + ")");
}

Json parse_json(std::string_view text, const std::string& where, const std::string& what,
                int64_t max_bytes, const char* max_bytes_why) {
  check_json_bytes(int64_t(text.size()), where, what, max_bytes, max_bytes_why);
  // nlohmann skips a byte-order mark; strict JSON (and Python's json) does not have one.
  if (text.substr(0, 3) == "\xEF\xBB\xBF")
    throw UserError(where + ": not valid JSON at line 1, column 1: a UTF-8 byte-order mark "
                    "(JSON text starts with its value)");
  Json doc;
  try {
    DepthBoundDom sax(doc, where, what);
    Json::sax_parse(text.begin(), text.end(), &sax);
    return doc;
  } catch (const Json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 2, column 3: syntax error ..."
    std::string why = e.what();
    const size_t at = why.find(" at line ");
    why = at == std::string::npos ? ": " + why : why.substr(at);
    throw UserError(where + ": not valid JSON" + why);
  } catch (const Json::exception& e) {
    // A number beyond a double (out_of_range 406): "[json.exception.out_of_range.406] number ..."
    std::string why = e.what();
    const size_t at = why.find("] ");
    throw UserError(where + ": not JSON tessera reads: " +
                    (at == std::string::npos ? why : why.substr(at + 2)));
  }
}

JsonAt JsonAt::operator[](const std::string& key) const {
  if (!v_->is_object()) fail("an object");
  const auto it = v_->find(key);
  return JsonAt(it == v_->end() ? null_json() : *it, *where_, path_ + member_step(path_, key));
}

JsonAt JsonAt::operator[](size_t i) const {
  return JsonAt((*v_)[i], *where_, path_ + "[" + std::to_string(i) + "]");
}

size_t JsonAt::size(size_t max, const char* why) const {
  if (v_->is_null()) return 0;
  if (!v_->is_object() && !v_->is_array()) fail("an object or an array");
  if (v_->size() > max)
    refuse(": " + std::to_string(v_->size()) + " entries, more than the " + std::to_string(max) +
           " tessera reads (" + why + ")");
  return v_->size();
}

const std::string& JsonAt::string() const {
  if (!v_->is_string()) fail("a string");
  return v_->get_ref<const std::string&>();
}

bool JsonAt::boolean(bool if_null) const {
  if (v_->is_null()) return if_null;
  if (!v_->is_boolean()) fail("true, false or null");
  return v_->get<bool>();
}

int64_t JsonAt::integer(int64_t lo, int64_t hi) const {
  if (v_->is_number_unsigned() && v_->get<uint64_t>() <= uint64_t(hi) && int64_t(v_->get<uint64_t>()) >= lo)
    return int64_t(v_->get<uint64_t>());
  if (v_->is_number_integer() && !v_->is_number_unsigned() && v_->get<int64_t>() >= lo &&
      v_->get<int64_t>() <= hi)
    return v_->get<int64_t>();
  if (v_->is_number_integer())
    refuse(": expected an integer from " + std::to_string(lo) + " to " + std::to_string(hi) +
           ", found " + v_->dump());
  fail("an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
}

std::string JsonAt::type() const {
  if (!v_->is_object()) return "?";
  const auto it = v_->find("type");
  return it != v_->end() && it->is_string() ? it->get<std::string>() : "?";
}

void JsonAt::fail(const std::string& expected) const {
  refuse(": expected " + expected + ", found " + json_kind(*v_));
}

void JsonAt::refuse(const std::string& detail) const {
  throw UserError(*where_ + ": " + path() + detail);
}

}  // namespace tessera
