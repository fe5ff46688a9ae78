// The input deck: YAML text -> Config. The checks run in this order and the first problem found
// is thrown as one line: YAML syntax, deck structure (sections, unknown and duplicate keys),
// overrides, value types, the required key, ranges. Nothing here prints, exits or aborts.
#include "config/config.hpp"

#include <string>
#include <vector>

#include "common/files.hpp"
#include "common/limits.hpp"
#include "config/deck.hpp"

namespace tessera {

using namespace deck_internal;

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
         "required key missing (the HDF5 token file made by tools/data/prepare_data.py)");
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

}  // namespace tessera
