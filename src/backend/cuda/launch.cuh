#pragma once
// The one way a kernel starts: launch<kernel>(grid, block, smem, stream, args...).
//
// Under nvcc it is kernel<<<grid, block, smem, stream>>>(args...). In the emulated build
// (TESSERA_CUDA_EMU, `make test-cuda-host`) g++ compiles the kernels as C++ and the launch runs
// every block and thread of the grid on the CPU before it returns (device/emu/kernel.hpp); the
// pointer arguments are checked to be device memory first. The caller checks the launch with
// CUDA_CHECK_LAUNCH() in both.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <tuple>
#include <type_traits>

#ifdef TESSERA_CUDA_EMU
#include <string>

#include "device/emu/kernel.hpp"
#endif

namespace tessera::cuda {

#ifdef TESSERA_CUDA_EMU
namespace detail {
// "bias_rows_kernel<float, 4>" out of this function's own signature ("... [with auto Kernel =
// tessera::cuda::{anonymous}::bias_rows_kernel<float, 4>]"), for the emulator's messages.
template <auto Kernel>
const char* kernel_name() {
  static const std::string name = [](std::string s) {
    const size_t at = s.find("Kernel = ");
    if (at != std::string::npos) s = s.substr(at + 9);
    s = s.substr(0, s.find_first_of(";]"));
    const size_t qualified = s.rfind("::", s.find('<'));  // namespaces before the template's name
    return qualified == std::string::npos ? s : s.substr(qualified + 2);
  }(__PRETTY_FUNCTION__);
  return name.c_str();
}
}  // namespace detail
#endif

template <auto Kernel, typename... Args>
void launch(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, const Args&... args) {
#ifdef TESSERA_CUDA_EMU
  const char* name = detail::kernel_name<Kernel>();
  int index = 0;
  auto check = [&](const auto& a) {
    if constexpr (std::is_pointer_v<std::decay_t<decltype(a)>>)
      emu::check_kernel_pointer(name, index, a);
    index++;
  };
  (check(args), ...);
  const std::tuple<const Args&...> bound(args...);
  emu::run_grid(name, grid, block, smem, stream,
                [](const void* closure) {
                  std::apply([](const Args&... a) { Kernel(a...); },
                             *static_cast<const std::tuple<const Args&...>*>(closure));
                },
                &bound);
#else
  Kernel<<<grid, block, smem, stream>>>(args...);
#endif
}

}  // namespace tessera::cuda
