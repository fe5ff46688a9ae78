// The input deck: YAML text -> Config. The checks run in this order and the first problem found
// is thrown as one line: YAML syntax, deck structure (sections, unknown and duplicate keys),
// overrides, value types, the required key, ranges. Nothing here prints, exits or aborts.
#include "config/config.hpp"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <string_view>
#include <utility>
#include <variant>

#include "common/error.hpp"
#include "common/files.hpp"
#include "common/limits.hpp"
#include "config/blend.hpp"

namespace tessera {
namespace {

// parallel.dp, tp, pp: a positive integer or the word `auto`, stored as 0.
struct IntOrAuto {
  int* value;
};

using FieldRef =
    std::variant<int*, uint64_t*, double*, bool*, std::string*, IntOrAuto, std::vector<int>*>;

struct Field {
  const char* section;
  const char* key;
  FieldRef ref;
};

// Every deck key, pointing into `c`, in the order to_yaml writes them. The one list that ties a
// deck name to a struct field: parsing, overrides, suggestions and to_yaml all walk it.
std::vector<Field> fields_of(Config& c) {
  return {
      {"model", "arch", &c.model.arch},
      {"model", "n_layer", &c.model.n_layer},
      {"model", "n_head", &c.model.n_head},
      {"model", "n_kv_head", &c.model.n_kv_head},
      {"model", "n_embd", &c.model.n_embd},
      {"model", "ffn_hidden", &c.model.ffn_hidden},
      {"model", "ffn_multiple", &c.model.ffn_multiple},
      {"model", "block_size", &c.model.block_size},
      {"model", "vocab_size", &c.model.vocab_size},
      {"model", "vocab_multiple", &c.model.vocab_multiple},
      {"model", "init_std", &c.model.init_std},
      {"model", "attention", &c.model.attention},
      {"model", "tie_embeddings", &c.model.tie_embeddings},
      {"model", "norm_eps", &c.model.norm_eps},
      {"model", "rope_theta", &c.model.rope_theta},
      {"data", "train", &c.data.train},
      {"data", "val", &c.data.val},
      {"data", "format", &c.data.format},
      {"data", "dtype", &c.data.dtype},
      {"data", "seq_len", &c.data.seq_len},
      {"data", "prefetch", &c.data.prefetch},
      {"data", "readers", &c.data.readers},
      {"data", "direct_io", &c.data.direct_io},
      {"data", "check_tokens", &c.data.check_tokens},
      {"data", "trace", &c.data.trace},
      {"train", "steps", &c.train.steps},
      {"train", "batch_size", &c.train.batch_size},
      {"train", "micro_batch", &c.train.micro_batch},
      {"train", "seed", &c.train.seed},
      {"train", "recompute", &c.train.recompute},
      {"train", "anomaly_window", &c.train.anomaly_window},
      {"train", "anomaly_sigma", &c.train.anomaly_sigma},
      {"train", "anomaly_action", &c.train.anomaly_action},
      {"optim", "lr", &c.optim.lr},
      {"optim", "min_lr", &c.optim.min_lr},
      {"optim", "warmup_steps", &c.optim.warmup_steps},
      {"optim", "decay_steps", &c.optim.decay_steps},
      {"optim", "weight_decay", &c.optim.weight_decay},
      {"optim", "beta1", &c.optim.beta1},
      {"optim", "beta2", &c.optim.beta2},
      {"optim", "eps", &c.optim.eps},
      {"optim", "grad_clip", &c.optim.grad_clip},
      {"eval", "every", &c.eval.every},
      {"eval", "batches", &c.eval.batches},
      {"checkpoint", "dir", &c.checkpoint.dir},
      {"checkpoint", "every", &c.checkpoint.every},
      {"checkpoint", "restart", &c.checkpoint.restart},
      {"checkpoint", "init_from", &c.checkpoint.init_from},
      {"checkpoint", "collective_bytes", &c.checkpoint.collective_bytes},
      {"checkpoint", "reserve", &c.checkpoint.reserve},
      {"checkpoint", "keep", &c.checkpoint.keep},
      {"checkpoint", "async", &c.checkpoint.async},
      {"log", "every", &c.log.every},
      {"log", "peak_gflops", &c.log.peak_gflops},
      {"run", "dir", &c.run.dir},
      {"run", "max_minutes", &c.run.max_minutes},
      {"run", "hang_timeout", &c.run.hang_timeout},
      {"device", "backend", &c.device.backend},
      {"device", "precision", &c.device.precision},
      {"device", "threads", &c.device.threads},
      {"parallel", "dp", IntOrAuto{&c.parallel.dp}},
      {"parallel", "tp", IntOrAuto{&c.parallel.tp}},
      {"parallel", "pp", IntOrAuto{&c.parallel.pp}},
      {"parallel", "schedule", &c.parallel.schedule},
      {"parallel", "zero", &c.parallel.zero},
      {"parallel", "stage_layers", &c.parallel.stage_layers},
      {"parallel", "sequence_parallel", &c.parallel.sequence_parallel},
      {"parallel", "virtual_stages", &c.parallel.virtual_stages},
  };
}

const char* const kSections[] = {"model", "data", "train", "optim", "eval",
                                 "checkpoint", "log", "run", "device", "parallel"};

std::string dotted(const Field& f) { return std::string(f.section) + "." + f.key; }

bool is_section(std::string_view name) {
  return std::find(std::begin(kSections), std::end(kSections), name) != std::end(kSections);
}

// Appends `ch`, a control character as the escape YAML's double quotes use (\n, \t, \x01).
void append_escaped(std::string& out, unsigned char ch) {
  if (ch == '\n') {
    out += "\\n";
  } else if (ch == '\t') {
    out += "\\t";
  } else if (ch < 0x20 || ch == 0x7f) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02X", ch);
    out += buf;
  } else {
    out += static_cast<char>(ch);
  }
}

// Control characters escaped, so that a message stays one line whatever the deck holds.
std::string one_line(std::string_view s) {
  std::string out;
  for (unsigned char ch : s) append_escaped(out, ch);
  return out;
}

// A value as messages show it: quoted, one line, cut short if long.
std::string shown(std::string_view s) {
  std::string text = one_line(s);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return "'" + text + "'";
}

// "file:LINE:COL", 1-based; just "file" where yaml-cpp has no position.
std::string at(const std::string& origin, const YAML::Mark& mark) {
  if (mark.is_null()) return one_line(origin);
  return one_line(origin) + ":" + std::to_string(mark.line + 1) + ":" +
         std::to_string(mark.column + 1);
}

[[noreturn]] void fail(const std::string& where, const std::string& problem) {
  throw UserError(where + ": " + problem, kExitBadInput);
}

// Optimal string alignment distance: Levenshtein plus adjacent transpositions, so that
// "n_layres" is one edit from "n_layer".
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); i++) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); j++) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); i++) {
    for (size_t j = 1; j <= b.size(); j++) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// Close enough to be a typo of `candidate` rather than a different word.
bool is_close(std::string_view word, std::string_view candidate) {
  return edit_distance(word, candidate) <= 1 + candidate.size() / 4;
}

// " (did you mean model.n_layer?)" for an unknown `section.key`, preferring the same section; a
// key put under the wrong section (train.lr) finds its own (optim.lr). Without a close match it
// lists the section's keys.
std::string suggest_key(const std::vector<Field>& fields, std::string_view section,
                        std::string_view key) {
  const Field* best = nullptr;
  size_t best_score = 0;
  for (const Field& f : fields) {
    if (!is_close(key, f.key)) continue;
    size_t score = edit_distance(key, f.key) + (section == f.section ? 0 : 1);
    if (!best || score < best_score) {
      best = &f;
      best_score = score;
    }
  }
  if (best) return " (did you mean " + dotted(*best) + "?)";
  std::string known;
  for (const Field& f : fields) {
    if (section != f.section) continue;
    known += (known.empty() ? "" : ", ") + std::string(f.key);
  }
  return " (" + std::string(section) + " has: " + known + ")";
}

// " (did you mean model?)" for an unknown section; a key written at the top level
// (steps: 10) finds its section (train.steps).
std::string suggest_section(const std::vector<Field>& fields, std::string_view name) {
  for (const Field& f : fields) {
    if (name == f.key) return " (did you mean " + dotted(f) + "? keys go inside their section)";
  }
  const char* best = nullptr;
  size_t best_distance = 0;
  for (const char* s : kSections) {
    size_t d = edit_distance(name, s);
    if (is_close(name, s) && (!best || d < best_distance)) {
      best = s;
      best_distance = d;
    }
  }
  if (best) return " (did you mean " + std::string(best) + "?)";
  std::string known;
  for (const char* s : kSections) known += (known.empty() ? "" : ", ") + std::string(s);
  return " (sections: " + known + ")";
}

// Where a key's value came from, so that an error about it can point there.
struct Source {
  bool present = false;
  YAML::Node value;
  std::string where;     // "deck.yaml:3:12: model.n_layer" or "command line: model.n_layer=3"
  long long order = -1;  // deck: byte offset of the value; overrides follow the deck, in order
  int key_line = 0;      // deck: 1-based line of the key, for duplicates
};

// The deck being read: the field table over the Config under construction and where each value
// came from, parallel to it.
struct Deck {
  std::string origin;
  std::vector<Field> fields;
  std::vector<Source> sources;
  std::string data_where;  // where to report a missing data.train

  size_t index(std::string_view section, std::string_view key) const {
    for (size_t i = 0; i < fields.size(); i++) {
      if (section == fields[i].section && key == fields[i].key) return i;
    }
    return fields.size();
  }

  size_t index(std::string_view name) const {
    size_t dot = name.find('.');
    return index(name.substr(0, dot), name.substr(dot + 1));
  }

  // An absent key (its default) is reported against the deck as a whole.
  std::string where(size_t i) const {
    if (sources[i].present) return sources[i].where;
    return one_line(origin) + ": " + dotted(fields[i]);
  }

  [[noreturn]] void fail_key(std::string_view name, const std::string& problem) const {
    fail(where(index(name)), problem);
  }

  // A rule between keys is reported at whichever was given last (or the one given at all); on a
  // tie (none given), at the first named.
  [[noreturn]] void fail_latest(const std::vector<std::string_view>& names,
                                const std::string& problem) const {
    size_t latest = index(names[0]);
    for (std::string_view name : names) {
      if (sources[index(name)].order > sources[latest].order) latest = index(name);
    }
    fail(where(latest), problem);
  }

  [[noreturn]] void fail_later(std::string_view a, std::string_view b,
                               const std::string& problem) const {
    fail_latest({a, b}, problem);
  }
};

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

// The shortest text that reads back to the same double: 0.0001, 1e-05.
std::string shortest(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, ec == std::errc() ? end : buf);
}

// shortest(), spelled so that YAML 1.1 readers (PyYAML) see a float too: they need a '.' and a
// signed exponent, "1.0e-08" rather than "1e-08".
std::string format_double(double v) {
  std::string text = shortest(v);
  size_t e = text.find('e');
  std::string mantissa = text.substr(0, e);
  if (mantissa.find('.') == std::string::npos) mantissa += ".0";
  if (e == std::string::npos) return mantissa;
  std::string power = text.substr(e + 1);
  return mantissa + (power[0] == '-' || power[0] == '+' ? "e" : "e+") + power;
}

// A double-quoted YAML string that yaml-cpp and PyYAML both read back unchanged.
std::string quote(std::string_view s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    append_escaped(out, ch);
  }
  return out + "\"";
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

YAML::Node load_yaml(const std::string& text, const std::string& origin) {
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
             (*control == '\0' ? "" : code) + ": a deck is text (YAML allows tab, line feed "
             "and carriage return, no other control character)");
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

// Walks the document's sections and keys, recording where each known key's value is. Refuses
// what is not a map of maps, unknown names and duplicates (which yaml-cpp keeps silently).
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
      YAML::Node value = entry.second;
      if (!key_node.IsScalar()) {
        fail(section_where, "expected a key name, got " + kind_of(key_node) + " at " +
                                at(origin, key_node.Mark()));
      }
      const std::string& key = key_node.Scalar();
      std::string key_where = at(origin, key_node.Mark()) + ": " + one_line(section + "." + key);
      size_t i = deck.index(section, key);
      if (i == deck.fields.size())
        fail(key_where, "unknown key" + suggest_key(deck.fields, section, key));
      Source& source = deck.sources[i];
      if (source.present) {
        fail(key_where, "duplicate key (first at line " + std::to_string(source.key_line) + ")");
      }
      // An empty value's mark is wherever the next token starts, so point at its key instead.
      YAML::Mark mark = value.IsNull() ? key_node.Mark() : value.Mark();
      source.present = true;
      source.value = value;
      source.where = at(origin, mark) + ": " + dotted(deck.fields[i]);
      source.order = mark.pos;
      source.key_line = key_node.Mark().line + 1;
    }
  }
}

// "section.key=value": the value is read as a YAML scalar and replaces the deck's.
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

// Stores each given value into its field, in the order they were given, so that the first bad
// value in the file is the one reported.
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
        },
        deck.fields[i].ref);
  }
}

std::string num(int v) { return std::to_string(v); }
std::string num(long long v) { return std::to_string(v); }
std::string num(double v) { return shortest(v); }

// "[3, 3, 2]", as the deck writes it.
std::string flow(const std::vector<int>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); i++) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

void at_least(const Deck& deck, std::string_view name, long long v, long long min) {
  if (v < min) deck.fail_key(name, "must be >= " + num(min) + ", got " + num(v));
}

void positive(const Deck& deck, std::string_view name, double v) {
  if (!(v > 0)) deck.fail_key(name, "must be > 0, got " + num(v));
}

void non_negative(const Deck& deck, std::string_view name, double v) {
  if (!(v >= 0)) deck.fail_key(name, "must be >= 0, got " + num(v));
}

void below_one(const Deck& deck, std::string_view name, double v) {
  if (!(v >= 0 && v < 1)) deck.fail_key(name, "must be in [0, 1), got " + num(v));
}

// dp, tp, pp: 0 is how `auto` is stored, so a 0 is only fine where the deck said auto.
void positive_or_auto(const Deck& deck, std::string_view name, int v) {
  const Source& s = deck.sources[deck.index(name)];
  bool said_auto = v == 0 && s.present && s.value.IsScalar() && s.value.Scalar() == "auto";
  if (v < 1 && !said_auto) deck.fail_key(name, "must be >= 1 or auto, got " + num(v));
}

// An upper bound, with the reason it is there.
void at_most(const Deck& deck, std::string_view name, long long v, long long max, const char* why) {
  if (v > max) deck.fail_key(name, "must be <= " + num(max) + " (" + why + "), got " + num(v));
}

void not_empty(const Deck& deck, std::string_view name, const std::string& v, const char* meaning) {
  if (v.empty()) deck.fail_key(name, std::string("must not be empty (") + meaning + ")");
}

// The layout rules that need no world size; src/parallel/topology.cpp checks the resolved layout
// again (check_layout) once `auto` is known. 0 in dp, tp, pp is auto.
void validate_parallel(const Config& c, const Deck& deck) {
  const ParallelConfig& p = c.parallel;
  positive_or_auto(deck, "parallel.dp", p.dp);
  positive_or_auto(deck, "parallel.tp", p.tp);
  positive_or_auto(deck, "parallel.pp", p.pp);
  const std::pair<std::string_view, int> sizes[] = {
      {"parallel.dp", p.dp}, {"parallel.tp", p.tp}, {"parallel.pp", p.pp}};
  std::vector<std::string_view> autos;
  for (const auto& [key, v] : sizes) {
    if (v == 0) autos.push_back(key);
  }
  if (autos.size() > 1) {
    std::string which(autos[0]);
    for (size_t k = 1; k < autos.size(); k++) {
      which += (k + 1 == autos.size() ? " and " : ", ") + std::string(autos[k]);
    }
    deck.fail_latest(autos, which + " are auto; at most one of dp, tp, pp may be auto");
  }
  if (p.schedule != "gpipe" && p.schedule != "1f1b") {
    deck.fail_key("parallel.schedule", "must be gpipe or 1f1b, got " + shown(p.schedule));
  }
  if (p.zero != 0 && p.zero != 1) {
    deck.fail_key("parallel.zero", "must be 0 or 1, got " + num(p.zero));
  }

  const ModelConfig& m = c.model;
  if (p.tp > 0 && m.n_head % p.tp != 0) {
    deck.fail_later("parallel.tp", "model.n_head",
                    "parallel.tp = " + num(p.tp) + " does not divide model.n_head = " +
                        num(m.n_head));
  }
  if (p.tp > 0 && m.n_kv_head > 0 && m.n_kv_head % p.tp != 0) {
    deck.fail_later("parallel.tp", "model.n_kv_head",
                    "parallel.tp = " + num(p.tp) + " does not divide model.n_kv_head = " +
                        num(m.n_kv_head) + " (each rank needs whole key/value heads)");
  }
  if (p.tp > 0 && m.ffn_hidden > 0 && m.ffn_hidden % p.tp != 0) {
    deck.fail_later("parallel.tp", "model.ffn_hidden",
                    "parallel.tp = " + num(p.tp) + " does not divide model.ffn_hidden = " +
                        num(m.ffn_hidden));
  }
  at_least(deck, "parallel.virtual_stages", p.virtual_stages, 1);
  if (p.virtual_stages > 1) {
    if (p.schedule != "1f1b")
      deck.fail_later("parallel.schedule", "parallel.virtual_stages",
                      "parallel.virtual_stages = " + num(p.virtual_stages) +
                          " interleaves the 1f1b schedule, but parallel.schedule = " + p.schedule);
    if (!p.stage_layers.empty())
      deck.fail_later("parallel.stage_layers", "parallel.virtual_stages",
                      "parallel.virtual_stages = " + num(p.virtual_stages) +
                          " splits the layers evenly: parallel.stage_layers must be []");
    if (p.pp == 1)
      deck.fail_later("parallel.pp", "parallel.virtual_stages",
                      "parallel.virtual_stages = " + num(p.virtual_stages) +
                          " needs parallel.pp >= 2 (one stage has nothing to interleave)");
    if (p.pp > 1 && m.n_layer % (p.pp * p.virtual_stages) != 0)
      deck.fail_later("model.n_layer", "parallel.virtual_stages",
                      "parallel.virtual_stages = " + num(p.virtual_stages) +
                          " does not divide the layers of each stage (model.n_layer = " +
                          num(m.n_layer) + " over parallel.pp = " + num(p.pp) +
                          "): every virtual stage needs the same number of layers");
  }
  const std::vector<int>& layers = p.stage_layers;
  if (!layers.empty()) {
    const std::string given = "parallel.stage_layers = " + flow(layers);
    long long sum = 0;
    for (int n : layers) {
      if (n < 1) {
        deck.fail_key("parallel.stage_layers",
                      "every stage needs at least one layer, got " + flow(layers));
      }
      sum += n;
    }
    if (p.pp > 0 && static_cast<int>(layers.size()) != p.pp) {
      deck.fail_later("parallel.stage_layers", "parallel.pp",
                      given + " has " + num(static_cast<long long>(layers.size())) +
                          " entries, but parallel.pp = " + num(p.pp));
    }
    if (sum != m.n_layer) {
      deck.fail_later("parallel.stage_layers", "model.n_layer",
                      given + " sums to " + num(sum) + ", but model.n_layer = " + num(m.n_layer));
    }
  } else if (p.pp > m.n_layer) {
    deck.fail_later("parallel.pp", "model.n_layer",
                    "parallel.pp = " + num(p.pp) + " is more than model.n_layer = " +
                        num(m.n_layer) + " (every stage needs at least one layer)");
  }

  // train.micro_batch is per data-parallel rank: a step is batch_size / (dp * micro_batch)
  // micro-batches on every rank; micro_batch 0 is batch_size / dp (no accumulation).
  const TrainConfig& t = c.train;
  if (p.dp > 0) {
    long long per = static_cast<long long>(p.dp) * std::max(t.micro_batch, 1);
    std::string per_text = t.micro_batch > 0
                               ? "parallel.dp x train.micro_batch = " + num(p.dp) + " x " +
                                     num(t.micro_batch) + " = " + num(per)
                               : "parallel.dp = " + num(p.dp);
    const char* problem = t.batch_size < per        ? " is less than "
                          : t.batch_size % per != 0 ? " is not a multiple of "
                                                    : nullptr;
    if (problem) {
      deck.fail_latest({"train.batch_size", "train.micro_batch", "parallel.dp"},
                       "train.batch_size = " + num(t.batch_size) + problem + per_text);
    }
  }
}

// Range rules, in deck order; a rule between two keys follows the second of them.
void validate(const Config& c, const Deck& deck) {
  const ModelConfig& m = c.model;
  const bool llama = m.arch == "llama";
  if (m.arch != "gpt2" && !llama)
    deck.fail_key("model.arch", "must be gpt2 or llama, got " + shown(m.arch));
  at_least(deck, "model.n_layer", m.n_layer, 1);
  at_most(deck, "model.n_layer", m.n_layer, limits::kLayers, limits::kLayersWhy);
  at_least(deck, "model.n_head", m.n_head, 1);
  at_most(deck, "model.n_head", m.n_head, limits::kEmbd, limits::kEmbdWhy);
  at_least(deck, "model.n_kv_head", m.n_kv_head, 0);
  if (m.n_kv_head > 0 && !llama && m.n_kv_head != m.n_head) {
    deck.fail_later("model.arch", "model.n_kv_head",
                    "model.n_kv_head = " + num(m.n_kv_head) +
                        " needs model.arch: llama (GPT-2 has n_head key/value heads)");
  }
  if (m.n_kv_head > 0 && m.n_head % m.n_kv_head != 0) {
    deck.fail_later("model.n_head", "model.n_kv_head",
                    "model.n_kv_head = " + num(m.n_kv_head) + " does not divide model.n_head = " +
                        num(m.n_head));
  }
  at_least(deck, "model.n_embd", m.n_embd, 1);
  at_most(deck, "model.n_embd", m.n_embd, limits::kEmbd, limits::kEmbdWhy);
  if (m.n_embd % m.n_head != 0) {
    deck.fail_later("model.n_embd", "model.n_head",
                    "model.n_embd = " + num(m.n_embd) +
                        " is not a multiple of model.n_head = " + num(m.n_head));
  }
  if (llama && (m.n_embd / m.n_head) % 2 != 0) {
    deck.fail_later("model.n_embd", "model.n_head",
                    "model.n_embd / model.n_head = " + num(m.n_embd / m.n_head) +
                        " is odd: llama's rotary embeddings rotate pairs of a head's values");
  }
  at_least(deck, "model.ffn_hidden", m.ffn_hidden, 0);
  at_most(deck, "model.ffn_hidden", m.ffn_hidden, limits::kFfn, limits::kFfnWhy);
  if (!llama && m.ffn_hidden != 0 && m.ffn_hidden != 4 * m.n_embd) {
    deck.fail_later("model.arch", "model.ffn_hidden",
                    "model.ffn_hidden = " + num(m.ffn_hidden) +
                        " needs model.arch: llama (GPT-2's MLP is 4 n_embd = " +
                        num(4 * m.n_embd) + " wide)");
  }
  at_least(deck, "model.ffn_multiple", m.ffn_multiple, 1);
  at_most(deck, "model.ffn_multiple", m.ffn_multiple, limits::kFfn, limits::kFfnWhy);
  at_least(deck, "model.block_size", m.block_size, 1);
  at_most(deck, "model.block_size", m.block_size, limits::kBlock, limits::kBlockWhy);
  at_least(deck, "model.vocab_size", m.vocab_size, 0);
  at_most(deck, "model.vocab_size", m.vocab_size, limits::kVocab, limits::kVocabWhy);
  at_least(deck, "model.vocab_multiple", m.vocab_multiple, 1);
  at_most(deck, "model.vocab_multiple", m.vocab_multiple, limits::kVocabMultiple,
          limits::kVocabMultipleWhy);
  positive(deck, "model.init_std", m.init_std);
  if (m.tie_embeddings != "auto" && m.tie_embeddings != "true" && m.tie_embeddings != "false") {
    deck.fail_key("model.tie_embeddings", "must be auto, true or false, got " +
                                              shown(m.tie_embeddings));
  }
  positive(deck, "model.norm_eps", m.norm_eps);
  if (!llama && m.norm_eps != 1e-5) {
    deck.fail_later("model.arch", "model.norm_eps",
                    "model.norm_eps = " + num(m.norm_eps) +
                        " needs model.arch: llama (GPT-2's LayerNorm uses 1e-5)");
  }
  positive(deck, "model.rope_theta", m.rope_theta);
  if (m.attention != "gemm" && m.attention != "fused") {
    deck.fail_key("model.attention", "must be gemm or fused, got " + shown(m.attention));
  } else if (m.attention == "fused" && m.n_embd % m.n_head == 0 &&
             m.n_embd / m.n_head > kMaxFusedHeadSize) {
    deck.fail_later("model.n_head", "model.attention",
                    "model.attention = fused takes head sizes up to " + num(kMaxFusedHeadSize) +
                        ", and model.n_embd / model.n_head = " + num(m.n_embd / m.n_head) +
                        ": use model.attention: gemm or more heads");
  }

  not_empty(deck, "data.train", c.data.train, "the training token file");
  std::vector<BlendEntry> blend;
  if (std::string e = parse_blend(c.data.train, &blend); !e.empty()) deck.fail_key("data.train", e);
  const std::string& format = c.data.format;
  if (format != "auto" && format != "hdf5" && format != "llmc" && format != "megatron" &&
      format != "raw") {
    deck.fail_key("data.format", "must be auto, hdf5, llmc, megatron or raw, got " + shown(format));
  }
  if (c.data.dtype != "uint16" && c.data.dtype != "uint32") {
    deck.fail_key("data.dtype", "must be uint16 or uint32, got " + shown(c.data.dtype));
  }
  at_least(deck, "data.seq_len", c.data.seq_len, 1);
  at_least(deck, "data.prefetch", c.data.prefetch, 0);
  at_most(deck, "data.prefetch", c.data.prefetch, limits::kPrefetch, limits::kPrefetchWhy);
  at_least(deck, "data.readers", c.data.readers, 1);
  at_most(deck, "data.readers", c.data.readers, limits::kReaders, limits::kReadersWhy);
  if (c.data.seq_len > m.block_size) {
    deck.fail_later("data.seq_len", "model.block_size",
                    "data.seq_len = " + num(c.data.seq_len) +
                        " is more than model.block_size = " + num(m.block_size));
  }

  const TrainConfig& t = c.train;
  at_least(deck, "train.steps", t.steps, 0);
  at_least(deck, "train.batch_size", t.batch_size, 1);
  at_least(deck, "train.micro_batch", t.micro_batch, 0);
  if (static_cast<long long>(t.batch_size) * c.data.seq_len > limits::kStepTokens) {
    deck.fail_later("train.batch_size", "data.seq_len",
                    "train.batch_size x data.seq_len = " + num(t.batch_size) + " x " +
                        num(c.data.seq_len) + " tokens per step is more than " +
                        num(static_cast<long long>(limits::kStepTokens)) + " (" +
                        limits::kStepTokensWhy + ")");
  }
  if (t.recompute != "none" && t.recompute != "selective" && t.recompute != "full") {
    deck.fail_key("train.recompute", "must be none, selective or full, got " + shown(t.recompute));
  }
  at_least(deck, "train.anomaly_window", t.anomaly_window, 2);
  at_most(deck, "train.anomaly_window", t.anomaly_window, 100000, "a window of steps kept in memory");
  non_negative(deck, "train.anomaly_sigma", t.anomaly_sigma);
  if (t.anomaly_action != "stop" && t.anomaly_action != "skip" && t.anomaly_action != "rollback") {
    deck.fail_key("train.anomaly_action",
                  "must be stop, skip or rollback, got " + shown(t.anomaly_action));
  }
  if (t.micro_batch > 0 && t.batch_size % t.micro_batch != 0) {
    deck.fail_later("train.batch_size", "train.micro_batch",
                    "train.batch_size = " + num(t.batch_size) +
                        " is not a multiple of train.micro_batch = " + num(t.micro_batch));
  }

  const OptimConfig& o = c.optim;
  positive(deck, "optim.lr", o.lr);
  non_negative(deck, "optim.min_lr", o.min_lr);
  if (o.min_lr > o.lr) {
    deck.fail_later("optim.lr", "optim.min_lr",
                    "optim.min_lr = " + num(o.min_lr) + " is more than optim.lr = " + num(o.lr));
  }
  at_least(deck, "optim.warmup_steps", o.warmup_steps, 0);
  at_least(deck, "optim.decay_steps", o.decay_steps, 0);
  non_negative(deck, "optim.weight_decay", o.weight_decay);
  below_one(deck, "optim.beta1", o.beta1);
  below_one(deck, "optim.beta2", o.beta2);
  positive(deck, "optim.eps", o.eps);
  non_negative(deck, "optim.grad_clip", o.grad_clip);

  at_least(deck, "eval.every", c.eval.every, 0);
  at_least(deck, "eval.batches", c.eval.batches, 1);
  at_least(deck, "checkpoint.every", c.checkpoint.every, 0);
  at_least(deck, "checkpoint.collective_bytes", c.checkpoint.collective_bytes, 0);
  at_least(deck, "checkpoint.keep", c.checkpoint.keep, 0);
  not_empty(deck, "checkpoint.restart", c.checkpoint.restart, "auto, none or a checkpoint path");
  at_least(deck, "log.every", c.log.every, 1);
  non_negative(deck, "log.peak_gflops", c.log.peak_gflops);
  not_empty(deck, "run.dir", c.run.dir, "the run directory");
  non_negative(deck, "run.max_minutes", c.run.max_minutes);
  non_negative(deck, "run.hang_timeout", c.run.hang_timeout);
  const std::string& backend = c.device.backend;
  if (backend != "cpu" && backend != "cuda" && backend != "auto") {
    deck.fail_key("device.backend", "must be cpu, cuda or auto, got " + shown(backend));
  }
  const std::string& precision = c.device.precision;
  if (precision != "fp32" && precision != "bf16") {
    deck.fail_key("device.precision", "must be fp32 or bf16, got " + shown(precision));
  }
  if (precision == "bf16" && backend == "cpu") {
    deck.fail_later("device.backend", "device.precision",
                    "device.precision = bf16 needs device.backend: cuda or auto (the CPU backend "
                    "is fp32)");
  }
  at_least(deck, "device.threads", c.device.threads, 0);
  at_most(deck, "device.threads", c.device.threads, limits::kThreads, limits::kThreadsWhy);
  validate_parallel(c, deck);
}

}  // namespace

Config parse_deck(const std::string& yaml_text, const std::string& origin,
                  const std::vector<std::string>& overrides) {
  Config config;
  Deck deck;
  deck.origin = origin;
  deck.fields = fields_of(config);
  deck.sources.resize(deck.fields.size());

  read_sections(load_yaml(yaml_text, origin), deck);
  for (size_t i = 0; i < overrides.size(); i++) apply_override(overrides[i], i, deck);
  convert_values(deck);
  if (!deck.sources[deck.index("data.train")].present) {
    fail(deck.data_where + ": data.train",
         "required key missing (the HDF5 token file made by tools/prepare_data.py)");
  }
  validate(config, deck);
  return config;
}

Config load_deck(const std::string& path, const std::vector<std::string>& overrides) {
  Config config =
      parse_deck(read_regular_file(path, "deck", size_t(limits::kDeckBytes)), path, overrides);
  config.deck_path = path;
  return config;
}

std::string to_yaml(const Config& config) {
  Config copy = config;  // fields_of points into a Config it may write through
  std::string out;
  const char* section = "";
  for (const Field& f : fields_of(copy)) {
    if (std::string_view(section) != f.section) {
      section = f.section;
      out += std::string(section) + ":\n";
    }
    out += "  " + std::string(f.key) + ": ";
    std::visit(
        [&](auto field) {
          using T = decltype(field);
          if constexpr (std::is_same_v<T, std::string*>) {
            out += quote(*field);
          } else if constexpr (std::is_same_v<T, double*>) {
            out += format_double(*field);
          } else if constexpr (std::is_same_v<T, bool*>) {
            out += *field ? "true" : "false";
          } else if constexpr (std::is_same_v<T, IntOrAuto>) {
            out += *field.value == 0 ? "auto" : std::to_string(*field.value);
          } else if constexpr (std::is_same_v<T, std::vector<int>*>) {
            out += flow(*field);
          } else {
            out += std::to_string(*field);
          }
        },
        f.ref);
    out += "\n";
  }
  return out;
}

}  // namespace tessera
