#include "common/gpu_datasheet.hpp"

namespace tessera {

GpuPeaks datasheet_peaks(int major, int minor, bool pcie) {
  constexpr double T = 1e12;
  if (major == 9 && minor == 0)
    return pcie ? GpuPeaks{51 * T, 378 * T, 756 * T, 1513 * T}
                : GpuPeaks{67 * T, 494.5 * T, 989.5 * T, 1979 * T};
  if (major == 8 && minor == 0) return {19.5 * T, 156 * T, 312 * T, 0};
  return {};
}

}  // namespace tessera
