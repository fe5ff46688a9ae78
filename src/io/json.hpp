#pragma once
// JSON files a user hands tessera (a Hugging Face tokenizer.json), read by nlohmann::json with
// bounds: a size the caller names and limits::kJsonDepth levels of nesting. nlohmann parses and
// destroys without recursion, but copying, comparing or dumping a value recurses once per level.
// A malformed document is one UserError naming the file, the line and column and what was
// expected there; a value of the wrong kind (JsonAt) one naming the file, the value's JSON path
// (`pre_tokenizer.pretokenizers[3].pattern`) and what was expected.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace tessera {

using Json = nlohmann::json;
// A document tessera writes (metrics.jsonl rows, `plan --json`): its keys in the order they were
// set, non-finite numbers written as null (JSON has no NaN or infinity).
using JsonRow = nlohmann::ordered_json;
// A written document on one line: text that is not well-formed UTF-8 (a name from a Latin-1
// file) gets U+FFFD for each bad byte rather than making the whole document unreadable.
std::string json_text(const JsonRow& row);

// UserError unless bytes <= max_bytes: "where: N bytes, more than the M a <what> may have (why)".
void check_json_bytes(int64_t bytes, const std::string& where, const std::string& what,
                      int64_t max_bytes, const char* max_bytes_why);

// Parses text as one JSON document; `where` (the file) names it in errors, `what` says what the
// file is ("tokenizer.json") when it is larger than max_bytes.
Json parse_json(std::string_view text, const std::string& where, const std::string& what,
                int64_t max_bytes, const char* max_bytes_why);

// A value of a parsed document and its JSON path, for reading it with checks. Absent members
// read as null. The document and `where` must outlive it.
class JsonAt {
 public:
  JsonAt(const Json& value, const std::string& where) : v_(&value), where_(&where) {}
  JsonAt(const Json&&, const std::string&) = delete;  // both are kept by address
  JsonAt(const Json&, const std::string&&) = delete;

  const Json& operator*() const { return *v_; }
  const Json* operator->() const { return v_; }
  // "model.merges[3]"; "the document" for the root.
  std::string path() const { return path_.empty() ? "the document" : path_; }
  const std::string& where() const { return *where_; }
  bool is_null() const { return v_->is_null(); }

  // Member `key` (null when absent); UserError unless this is an object.
  JsonAt operator[](const std::string& key) const;
  // Element i of an array (i < size()).
  JsonAt operator[](size_t i) const;
  // The members of an object or elements of an array (0 for null); UserError for another kind
  // or for more than max of them (`why` says why that is the limit).
  size_t size(size_t max, const char* why) const;

  // The value as a string, a boolean (null: if_null), an integer in lo..hi; UserError otherwise.
  const std::string& string() const;
  bool boolean(bool if_null) const;
  int64_t integer(int64_t lo, int64_t hi) const;
  // A string member "type", or "?" (for messages about kinds tessera does not read).
  std::string type() const;

  // UserError "where: path: expected <expected>, found <kind of the value>".
  [[noreturn]] void fail(const std::string& expected) const;
  // UserError "where: path<detail>" (detail starts with ':' or ' ').
  [[noreturn]] void refuse(const std::string& detail) const;

 private:
  JsonAt(const Json& value, const std::string& where, std::string path)
      : v_(&value), where_(&where), path_(std::move(path)) {}
  const Json* v_;
  const std::string* where_;
  std::string path_;
};

// "an object", "a string", ... of a value, for messages.
const char* json_kind(const Json& v);

}  // namespace tessera
