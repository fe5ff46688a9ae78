// Reading a deck: YAML text -> the values of a Config, each with where it came from (Source).
// The text is checked before yaml-cpp parses it (control characters, unclosed quotes, a second
// document), then walked section by section (unknown and duplicate names), then overridden from
// the command line, and every given value is converted to its field's type in the order given.
#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <type_traits>
#include <utility>

#include "common/error.hpp"
#include "config/deck.hpp"
#include "config/yaml_map.hpp"

namespace tessera::deck_internal {
namespace {

// "file:LINE:COL", 1-based; just "file" where yaml-cpp has no position.
std::string at(const std::string& origin, const YAML::Mark& mark) {
  if (mark.is_null()) return one_line(origin);
  return one_line(origin) + ":" + std::to_string(mark.line + 1) + ":" +
         std::to_string(mark.column + 1);
}

std::string kind_of(const YAML::Node& node) {
  if (node.IsNull()) return "nothing";
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a sequence";
  return shown(node.Scalar());
}

// The text of a scalar value, or an error naming what was expected.
const std::string& scalar_text(const Source& s, const char* expected) {
  if (!s.value.IsScalar()) {
    std::string hint = s.value.IsNull() && std::string_view(expected) == "a string"
                           ? " (write \"\" for an empty one)"
                           : "";
    fail(s.where, std::string("expected ") + expected + ", got " + kind_of(s.value) + hint);
  }
  return s.value.Scalar();
}

bool all_digits(std::string_view s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

// Decimal integers only: 1.5, 1e3 and 0x10 are refused rather than rounded or guessed at.
int to_int(const Source& s) {
  const std::string& text = scalar_text(s, "an integer");
  size_t sign = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
  if (!all_digits(std::string_view(text).substr(sign))) {
    fail(s.where, "expected an integer, got " + shown(text));
  }
  std::string_view number = text;
  if (text[0] == '+') number.remove_prefix(1);  // from_chars takes '-' but not '+'
  int value = 0;
  auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (ec != std::errc() || end != number.data() + number.size()) {
    fail(s.where, "expected an integer from " + std::to_string(std::numeric_limits<int>::min()) +
                      " to " + std::to_string(std::numeric_limits<int>::max()) + ", got " +
                      shown(text));
  }
  return value;
}

int to_int_or_auto(const Source& s) {
  const std::string& text = scalar_text(s, "an integer or auto");
  if (text == "auto") return 0;
  size_t sign = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
  if (!all_digits(std::string_view(text).substr(sign))) {
    fail(s.where, "expected an integer or auto, got " + shown(text));
  }
  return to_int(s);
}

// A YAML sequence of integers, block or flow ([3, 3, 2]). In the deck an entry's error points at
// the entry; on the command line at the override.
std::vector<int> to_int_list(const Source& s, const std::string& origin, const std::string& name) {
  if (!s.value.IsSequence()) {
    std::string hint = s.value.IsNull() ? " (write [] for the default)" : "";
    fail(s.where, "expected a sequence of integers, got " + kind_of(s.value) + hint);
  }
  const bool in_deck = s.key_line > 0;
  std::vector<int> out;
  for (const YAML::Node& entry : s.value) {
    // Built whole: assigning to a Node that already refers to one overwrites that one's content.
    Source e{true, entry, in_deck ? at(origin, entry.Mark()) + ": " + name : s.where, s.order,
             s.key_line};
    out.push_back(to_int(e));
  }
  return out;
}

uint64_t to_uint64(const Source& s) {
  const std::string& text = scalar_text(s, "an integer");
  std::string_view digits = text;
  if (!digits.empty() && digits[0] == '+') digits.remove_prefix(1);
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (!all_digits(digits) || ec != std::errc() || end != digits.data() + digits.size()) {
    fail(s.where, "expected an integer from 0 to " +
                      std::to_string(std::numeric_limits<uint64_t>::max()) + ", got " +
                      shown(text));
  }
  return value;
}

// true or false, as YAML 1.2 spells them; yes/no/on/off are refused rather than guessed at.
bool to_bool(const Source& s) {
  const std::string& text = scalar_text(s, "true or false");
  if (text == "true") return true;
  if (text == "false") return false;
  fail(s.where, "expected true or false, got " + shown(text));
}

// YAML 1.2 decimal numbers: [-+]?(D+(.D*)?|.D+)([eE][-+]?D+)?, so 3e-4, 1 and .5 all read, while
// inf, nan and hexadecimal, which strtod would take, do not.
bool is_decimal_number(std::string_view s) {
  size_t i = 0, n = s.size();
  auto digits = [&] {
    size_t start = i;
    while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    return i - start;
  };
  if (i < n && (s[i] == '-' || s[i] == '+')) i++;
  size_t mantissa = digits();
  if (i < n && s[i] == '.') {
    i++;
    mantissa += digits();
  }
  if (mantissa == 0) return false;
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    i++;
    if (i < n && (s[i] == '-' || s[i] == '+')) i++;
    if (digits() == 0) return false;
  }
  return i == n;
}

double to_double(const Source& s) {
  const std::string& text = scalar_text(s, "a number");
  if (!is_decimal_number(text)) fail(s.where, "expected a number, got " + shown(text));
  std::string_view digits = text;
  if (digits[0] == '+') digits.remove_prefix(1);
  double value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc() || end != digits.data() + digits.size() || !std::isfinite(value)) {
    fail(s.where, "expected a number within the range of a double, got " + shown(text));
  }
  return value;
}

// A quoted value must close on its own line. YAML lets a quoted scalar run on over lines, so a
// missing closing quote silently swallows the keys below it into the string (or fails far away
// with "end of map not found"); in a deck that is always a typo. Reported at the opening quote,
// with the key of its line (block style: "section:" unindented, "  key:" below it).
void check_quotes(const std::string& text, const std::string& origin) {
  std::string section, name;
  size_t line_start = 0;
  for (int line = 1; line_start < text.size(); line++) {
    size_t line_end = text.find('\n', line_start);
    if (line_end == std::string::npos) line_end = text.size();
    const std::string_view l(text.data() + line_start, line_end - line_start);
    const size_t indent = l.find_first_not_of(" \t");
    const size_t colon = l.find(':');
    if (indent != std::string_view::npos && colon != std::string_view::npos && colon > indent &&
        l[indent] != '#' && l[indent] != '"' && l[indent] != '\'') {
      const std::string word(l.substr(indent, colon - indent));
      if (indent == 0) section = name = word;
      else name = section + "." + word;
    }
    bool value_start = true;  // at a place where a scalar may begin
    int flow = 0;             // depth of [ ] and { }
    for (size_t i = 0; i < l.size(); i++) {
      const char ch = l[i];
      const bool blank_next = i + 1 == l.size() || l[i + 1] == ' ' || l[i + 1] == '\t';
      if (ch == '#' && (i == 0 || l[i - 1] == ' ' || l[i - 1] == '\t')) break;  // a comment
      if ((ch == '"' || ch == '\'') && value_start) {
        size_t j = i + 1;
        for (; j < l.size(); j++) {
          if (ch == '"' && l[j] == '\\') j++;  // an escape: \" does not close
          else if (ch == '\'' && l[j] == '\'' && j + 1 < l.size() && l[j + 1] == '\'') j++;
          else if (l[j] == ch) break;
        }
        if (j >= l.size()) {
          fail(one_line(origin) + ":" + std::to_string(line) + ":" + std::to_string(i + 1) +
                   (name.empty() ? "" : ": " + one_line(name)),
               std::string("the ") + (ch == '"' ? "double" : "single") +
                   "-quoted value is not closed on its line (add the closing quote)");
        }
        i = j;
        value_start = false;
      } else if ((ch == ':' && (blank_next || flow > 0)) || (ch == ',' && flow > 0)) {
        value_start = true;  // a value (or, in flow style, an entry) follows, after blanks
      } else if ((ch == '-' || ch == '?') && value_start && blank_next) {
        // a block sequence entry or complex key: still at a value's start
      } else if ((ch == '[' || ch == '{') && value_start) {
        flow++;
      } else if ((ch == ']' || ch == '}') && flow > 0) {
        flow--;
        value_start = false;
      } else if (ch != ' ' && ch != '\t' && ch != '\r') {
        value_start = false;
      }
    }
    line_start = line_end + 1;
  }
}

// The documents of a YAML stream as the parser reports them: where the latest one starts, where
// its first node is if it holds anything but one null, and whether it starts where the one
// before did.
struct Documents : YAML::EventHandler {
  YAML::Mark start, node;
  int count = 0;
  bool only_null = true, stuck = false;
  void OnDocumentStart(const YAML::Mark& mark) override {
    stuck = count > 0 && mark.pos == start.pos;
    start = mark;
    ++count;
    only_null = true;
  }
  void saw(const YAML::Mark& mark) {
    if (only_null) node = mark;
    only_null = false;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { saw(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override { saw(mark); }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override { saw(mark); }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override { saw(mark); }
  void OnMapEnd() override {}
};

}  // namespace

[[noreturn]] void fail(const std::string& where, const std::string& problem) {
  throw UserError(where + ": " + problem, kExitBadInput);
}

YAML::Node load_yaml(const std::string& text, const std::string& origin, const char* what) {
  // yaml-cpp 0.7 loops, allocating without bound, on a NUL byte and on other control characters
  // (found by tests/fuzz). YAML allows none but tab, line feed and carriage return, so a deck
  // holding one is refused, by position, before it reaches the parser.
  const auto control = std::find_if(text.begin(), text.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return (u < 0x20 && u != '\t' && u != '\n' && u != '\r') || u == 0x7f;
  });
  if (control != text.end()) {
    const size_t at_byte = size_t(control - text.begin());
    const size_t newline = text.rfind('\n', at_byte);
    const size_t column = at_byte - (newline == std::string::npos ? 0 : newline + 1) + 1;
    const long line = long(std::count(text.begin(), control, '\n')) + 1;
    char code[8];
    std::snprintf(code, sizeof code, "0x%02X", static_cast<unsigned char>(*control));
    fail(one_line(origin) + ":" + std::to_string(line) + ":" + std::to_string(column),
         std::string(*control == '\0' ? "a NUL byte" : "control character ") +
             (*control == '\0' ? "" : code) + ": " + what + " is text (YAML allows tab, line "
             "feed and carriage return, no other control character)");
  }
  check_quotes(text, origin);
  // yaml-cpp 0.7's LoadAll never ends, allocating a null document per turn, on a token that no
  // document can start with (a ',' at the top level: found by tests/fuzz; yaml-cpp issue 1040):
  // the documents are walked here as events, one starting where the one before did is refused,
  // and only then is the first one loaded.
  Documents documents;
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    while (parser.HandleNextDocument(documents)) {
      if (documents.stuck)
        fail(at(origin, documents.start), std::string("unexpected '") + text[documents.start.pos] +
                                              "': no YAML document can start with it");
      // A trailing "---" makes an empty second document, harmless; a second deck is not.
      if (documents.count > 1 && !documents.only_null)
        fail(at(origin, documents.node), "expected one YAML document, found a second");
    }
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    fail(at(origin, e.mark), e.msg);
  }
}

// One key's value: where it is, refused when the key is unknown or given twice.
void read_key(Deck& deck, const std::string& section, const std::string& key,
              const YAML::Node& key_node, const YAML::Node& value) {
  const std::string key_where =
      at(deck.origin, key_node.Mark()) + ": " + one_line(section + "." + key);
  const size_t i = deck.index(section, key);
  if (i == deck.fields.size())
    fail(key_where, "unknown key" + suggest_key(deck.fields, section, key));
  Source& source = deck.sources[i];
  if (source.present)
    fail(key_where, "duplicate key (first at line " + std::to_string(source.key_line) + ")");
  // An empty value's mark is wherever the next token starts, so point at its key instead.
  const YAML::Mark mark = value.IsNull() ? key_node.Mark() : value.Mark();
  source.present = true;
  source.value = value;
  source.where = at(deck.origin, mark) + ": " + dotted(deck.fields[i]);
  source.order = mark.pos;
  source.key_line = key_node.Mark().line + 1;
}

void read_sections(const YAML::Node& root, Deck& deck) {
  const std::string& origin = deck.origin;
  deck.data_where = one_line(origin) + ":1:1";
  if (root.IsNull()) return;  // an empty deck: only data.train will be missing
  if (!root.IsMap()) {
    fail(at(origin, root.Mark()),
         "expected a map of sections (model:, data:, ...), got " + kind_of(root));
  }
  std::vector<std::pair<std::string, int>> seen;  // section name, line
  for (const auto& section_entry : root) {
    YAML::Node name_node = section_entry.first;
    YAML::Node body = section_entry.second;
    if (!name_node.IsScalar()) {
      fail(at(origin, name_node.Mark()), "expected a section name, got " + kind_of(name_node));
    }
    const std::string& section = name_node.Scalar();
    std::string section_where = at(origin, name_node.Mark()) + ": " + one_line(section);
    if (!is_section(section))
      fail(section_where, "unknown section" + suggest_section(deck.fields, section));
    for (const auto& [name, line] : seen) {
      if (name == section)
        fail(section_where, "duplicate section (first at line " + std::to_string(line) + ")");
    }
    seen.emplace_back(section, name_node.Mark().line + 1);
    if (section == "data") deck.data_where = at(origin, name_node.Mark());
    if (body.IsNull()) continue;  // "eval:" with nothing under it: all defaults
    if (!body.IsMap()) {
      fail(at(origin, body.Mark()) + ": " + one_line(section),
           "expected a map of keys, got " + kind_of(body));
    }

    for (const auto& entry : body) {
      YAML::Node key_node = entry.first;
      if (!key_node.IsScalar()) {
        fail(section_where, "expected a key name, got " + kind_of(key_node) + " at " +
                                at(origin, key_node.Mark()));
      }
      // A group of keys (model.moe): a map of its own, one level deep.
      const std::string& key = key_node.Scalar();
      if (is_group(deck.fields, section, key)) {
        const YAML::Node& group = entry.second;
        const std::string where = at(origin, key_node.Mark()) + ": " + one_line(section + "." + key);
        if (group.IsNull()) continue;  // "moe:" with nothing under it: all defaults
        if (!group.IsMap()) fail(where, "expected a map of keys, got " + kind_of(group));
        for (const auto& inner : group) {
          if (!inner.first.IsScalar())
            fail(where, "expected a key name, got " + kind_of(inner.first) + " at " +
                            at(origin, inner.first.Mark()));
          read_key(deck, section, key + "." + inner.first.Scalar(), inner.first, inner.second);
        }
        continue;
      }
      read_key(deck, section, key, key_node, entry.second);
    }
  }
}

void apply_override(const std::string& text, size_t position, Deck& deck) {
  std::string where = "command line: " + one_line(text);
  size_t eq = text.find('=');
  if (eq == std::string::npos) fail(where, "expected section.key=value");
  std::string name = text.substr(0, eq);
  std::string value_text = text.substr(eq + 1);
  size_t dot = name.find('.');
  if (dot == std::string::npos) {
    for (const Field& f : deck.fields) {
      if (name == f.key) {
        fail(where, "expected section.key=value (did you mean " + dotted(f) + "=" +
                        one_line(value_text) + "?)");
      }
    }
    fail(where, "expected section.key=value");
  }
  std::string section = name.substr(0, dot), key = name.substr(dot + 1);
  if (!is_section(section)) fail(where, "unknown section" + suggest_section(deck.fields, section));
  size_t i = deck.index(section, key);
  if (i == deck.fields.size()) fail(where, "unknown key" + suggest_key(deck.fields, section, key));

  YAML::Node value;
  if (value_text.empty()) {
    value = YAML::Node(std::string());  // "data.val=": the empty string, not YAML's null
  } else {
    try {
      value = YAML::Load(value_text);
    } catch (const YAML::Exception& e) {
      fail(where, e.msg);
    }
  }
  Source& source = deck.sources[i];
  source.present = true;
  source.value = value;
  source.where = where;
  source.order = std::numeric_limits<int>::max() + static_cast<long long>(position);
}

// One of a choice's words: its index.
int to_word(const Source& s, const Choice& c) {
  const std::string text = scalar_text(s, "a string");
  for (int i = 0; i < c.count; ++i)
    if (text == c.words[i]) return i;
  fail(s.where, "must be " + word_list(c) + ", got " + shown(text));
}

void convert_values(Deck& deck) {
  std::vector<size_t> given;
  for (size_t i = 0; i < deck.fields.size(); i++) {
    if (deck.sources[i].present) given.push_back(i);
  }
  std::sort(given.begin(), given.end(),
            [&](size_t a, size_t b) { return deck.sources[a].order < deck.sources[b].order; });
  for (size_t i : given) {
    const Source& s = deck.sources[i];
    std::visit(
        [&](auto field) {
          using T = decltype(field);
          if constexpr (std::is_same_v<T, int*>) *field = to_int(s);
          if constexpr (std::is_same_v<T, uint64_t*>) *field = to_uint64(s);
          if constexpr (std::is_same_v<T, double*>) *field = to_double(s);
          if constexpr (std::is_same_v<T, bool*>) *field = to_bool(s);
          if constexpr (std::is_same_v<T, std::string*>) *field = scalar_text(s, "a string");
          if constexpr (std::is_same_v<T, IntOrAuto>) *field.value = to_int_or_auto(s);
          if constexpr (std::is_same_v<T, std::vector<int>*>) {
            *field = to_int_list(s, deck.origin, dotted(deck.fields[i]));
          }
          if constexpr (std::is_same_v<T, Choice>) field.set(to_word(s, field));
        },
        deck.fields[i].ref);
  }
}

}  // namespace tessera::deck_internal

namespace tessera {

using namespace deck_internal;

std::vector<YamlEntry> read_yaml_map(const std::string& text, const std::string& origin,
                                     const char* what) {
  const YAML::Node root = load_yaml(text, origin, what);
  std::vector<YamlEntry> entries;
  std::vector<int> lines;  // each entry's key's, for a duplicate's message
  if (root.IsNull()) return entries;
  if (!root.IsMap()) fail(at(origin, root.Mark()), "expected a map of keys, got " + kind_of(root));
  for (const auto& entry : root) {
    const YAML::Node& key = entry.first;
    if (!key.IsScalar()) fail(at(origin, key.Mark()), "expected a key name, got " + kind_of(key));
    YamlEntry e{key.Scalar(), entry.second, at(origin, key.Mark()) + ": " + one_line(key.Scalar()),
                ""};
    for (size_t i = 0; i < entries.size(); ++i)
      if (entries[i].key == e.key)
        fail(e.key_where, "duplicate key (first at line " + std::to_string(lines[i]) + ")");
    // An empty value's mark is wherever the next token starts: its key is where it is.
    e.where = e.value.IsNull() ? e.key_where
                               : at(origin, e.value.Mark()) + ": " + one_line(e.key);
    entries.push_back(std::move(e));
    lines.push_back(key.Mark().line + 1);
  }
  return entries;
}

namespace {
// The deck's conversions take a Source: the entry as one.
Source source_of(const YamlEntry& e) { return {true, e.value, e.where, 0, 0}; }
}  // namespace

double yaml_number(const YamlEntry& e) { return to_double(source_of(e)); }
int yaml_int(const YamlEntry& e) { return to_int(source_of(e)); }
bool yaml_bool(const YamlEntry& e) { return to_bool(source_of(e)); }
std::string yaml_string(const YamlEntry& e) { return scalar_text(source_of(e), "a string"); }

std::string yaml_shown(std::string_view s) { return shown(s); }
std::string yaml_shortest(double v) { return shortest(v); }

}  // namespace tessera
