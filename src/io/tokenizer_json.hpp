#pragma once
// A small JSON reader for tokenizer files (Hugging Face tokenizer.json): the whole document as a
// tree of values. Strict RFC 8259 (no comments, no trailing commas), \u escapes with surrogate
// pairs turned into UTF-8, nesting at most 128 deep. A malformed document is one UserError naming
// the file, the line and column, and what was expected there.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

struct JsonValue {
  enum class Kind { null, boolean, number, string, array, object };
  Kind kind = Kind::null;
  bool boolean = false;
  double number = 0;
  std::string string;                                    // a string's UTF-8 bytes
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;  // in document order

  bool is_null() const { return kind == Kind::null; }
  bool is_string() const { return kind == Kind::string; }
  bool is_object() const { return kind == Kind::object; }
  bool is_array() const { return kind == Kind::array; }
  // The member `key` of an object, or nullptr (also when this is not an object).
  const JsonValue* get(const std::string& key) const;
  // The kind's name, for messages: "an object", "a string", ...
  const char* kind_name() const;
};

// Parses text as one JSON document; `where` (the file) names it in errors.
JsonValue parse_json(const std::string& text, const std::string& where);

}  // namespace tessera
