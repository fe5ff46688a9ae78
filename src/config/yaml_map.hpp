#pragma once
// tessera's other YAML files (the machine files of `tessera plan`) read by the deck's own rules
// (config/read.cpp), so that they are no less strict: the text checked before yaml-cpp parses it
// (control characters, a quoted value not closed on its line, a second document), every problem
// one line "FILE:LINE:COL: key: problem" (UserError, exit 2), a key given twice refused (yaml-cpp
// keeps both silently), numbers only in YAML 1.2's decimal spelling and finite, integers only in
// decimal digits and within an int.
#include <yaml-cpp/yaml.h>

#include <string>
#include <string_view>
#include <vector>

namespace tessera {

// One top-level `key: value` of the file.
struct YamlEntry {
  std::string key;
  YAML::Node value;
  std::string key_where;  // "FILE:LINE:COL: key", at the key
  std::string where;      // the same at the value (at the key where the value is empty)
};

// The file's one document as a map of scalar keys, each given once, in the file's order; an
// empty file is an empty map. `what` names the file in a message about its text ("a machine
// file").
std::vector<YamlEntry> read_yaml_map(const std::string& text, const std::string& origin,
                                     const char* what);

// An entry's value, or a UserError at e.where: "expected a number, got 'lots'".
double yaml_number(const YamlEntry& e);
int yaml_int(const YamlEntry& e);
bool yaml_bool(const YamlEntry& e);
std::string yaml_string(const YamlEntry& e);

// A value as the deck's messages show it: quoted, one line (control characters escaped), cut
// short if long; a number in its shortest spelling (0.001, 1e-06).
std::string yaml_shown(std::string_view s);
std::string yaml_shortest(double v);

}  // namespace tessera
