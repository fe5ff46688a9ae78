#pragma once
// Text a user gave (a machine file's name, a refusal quoting a deck value) inside tessera's JSON
// output (`tessera plan --json`): quoted and escaped, so that any text leaves the document valid.
#include <cstdio>
#include <string>
#include <string_view>

namespace tessera {

// `s` as a JSON string, quotes included: '"' and '\' escaped, control characters as \u00XX, and
// a byte that is not part of well-formed UTF-8 as U+FFFD (JSON text is UTF-8; a name from a
// Latin-1 file would otherwise make the whole document unreadable).
inline std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const auto u = static_cast<unsigned char>(s[i]);
    if (u == '"' || u == '\\') {
      out += '\\';
      out += char(u);
      ++i;
    } else if (u < 0x20 || u == 0x7f) {
      char code[8];
      std::snprintf(code, sizeof code, "\\u%04x", u);
      out += code;
      ++i;
    } else if (u < 0x80) {
      out += char(u);
      ++i;
    } else {
      // A UTF-8 sequence: its length by the lead byte, then continuation bytes 10xxxxxx; overlong
      // forms, surrogates and code points past U+10FFFF are not well formed.
      const size_t n = u >= 0xc2 && u <= 0xdf ? 2 : u >= 0xe0 && u <= 0xef ? 3
                       : u >= 0xf0 && u <= 0xf4 ? 4 : 0;
      bool ok = n > 0 && i + n <= s.size();
      for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
      if (ok && n > 2) {
        const auto second = static_cast<unsigned char>(s[i + 1]);
        ok = !(u == 0xe0 && second < 0xa0) && !(u == 0xed && second >= 0xa0) &&
             !(u == 0xf0 && second < 0x90) && !(u == 0xf4 && second >= 0x90);
      }
      if (ok) {
        out.append(s.substr(i, n));
        i += n;
      } else {
        out += "\\ufffd";
        ++i;
      }
    }
  }
  return out + "\"";
}

}  // namespace tessera
