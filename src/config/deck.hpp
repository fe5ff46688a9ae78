#pragma once
// Inside the deck reader, shared by its files (not for use outside src/config/): the key table
// (Field, fields_of) and the spelling of keys and values, in config/keys.cpp; where each value
// came from (Source, Deck) and the reading of YAML text and overrides into a Config, in
// config/read.cpp; the range rules, in config/validate.cpp. config/config.cpp strings them
// together in the order its comment gives.
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "config/config.hpp"

namespace tessera::deck_internal {

// parallel.dp, tp, pp: a positive integer or the word `auto`, stored as 0.
struct IntOrAuto {
  int* value;
};

// A word of a fixed list, stored as its enum (config.hpp's deck words): words[i] spells E(i).
struct Choice {
  const char* const* words;
  int count;
  std::function<int()> get;
  std::function<void(int)> set;
};

using FieldRef = std::variant<int*, uint64_t*, double*, bool*, std::string*, IntOrAuto,
                              std::vector<int>*, Choice>;

struct Field {
  const char* section;
  const char* key;
  FieldRef ref;
};

// config/keys.cpp: the key table and the spelling of keys and values.

// Every deck key, pointing into `c`, in the order to_yaml writes them. The one list that ties a
// deck name to a struct field: parsing, overrides, suggestions and to_yaml all walk it.
std::vector<Field> fields_of(Config& c);

std::string dotted(const Field& f);

// "gemm or fused", "none, selective or full": a choice's words as messages list them.
std::string word_list(const Choice& c);

bool is_section(std::string_view name);
// Whether `key` of `section` names a group of keys (model.moe: the keys "moe.experts", ...).
bool is_group(const std::vector<Field>& fields, std::string_view section, std::string_view key);

// " (did you mean model.n_layer?)" for an unknown `section.key`, preferring the same section; a
// key put under the wrong section (train.lr) finds its own (optim.lr). Without a close match it
// lists the section's keys.
std::string suggest_key(const std::vector<Field>& fields, std::string_view section,
                        std::string_view key);

// " (did you mean model?)" for an unknown section; a key written at the top level
// (steps: 10) finds its section (train.steps).
std::string suggest_section(const std::vector<Field>& fields, std::string_view name);

// Control characters escaped, so that a message stays one line whatever the deck holds.
std::string one_line(std::string_view s);

// A value as messages show it: quoted, one line, cut short if long.
std::string shown(std::string_view s);

// The shortest text that reads back to the same double: 0.0001, 1e-05.
std::string shortest(double v);

// "[3, 3, 2]", as the deck writes it.
std::string flow(const std::vector<int>& v);

// config/read.cpp: YAML text and overrides -> the values of a Config, each with its position.

// Throws UserError("where: problem"), exit 2.
[[noreturn]] void fail(const std::string& where, const std::string& problem);

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

// The deck's one YAML document. Refused by position: a control character, a quoted value not
// closed on its line, a YAML syntax error, a second document.
// `what` names the text in the message about a control character.
YAML::Node load_yaml(const std::string& text, const std::string& origin,
                     const char* what = "a deck");

// Walks the document's sections and keys, recording where each known key's value is. Refuses
// what is not a map of maps, unknown names and duplicates (which yaml-cpp keeps silently).
void read_sections(const YAML::Node& root, Deck& deck);

// "section.key=value": the value is read as a YAML scalar and replaces the deck's.
void apply_override(const std::string& text, size_t position, Deck& deck);

// Stores each given value into its field, in the order they were given, so that the first bad
// value in the file is the one reported.
void convert_values(Deck& deck);

// config/validate.cpp.

// Range rules, in deck order; a rule between two keys follows the second of them.
void validate(const Config& c, const Deck& deck);

}  // namespace tessera::deck_internal
