#pragma once

namespace tessera {
inline constexpr const char* kSoftwareVersion = "tessera 0.1.0";
}
