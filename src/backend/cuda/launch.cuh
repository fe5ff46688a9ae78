#pragma once
// The one way a kernel starts: launch<kernel>(grid, block, smem, stream, args...).
//
// Under nvcc it is kernel<<<grid, block, smem, stream>>>(args...). In the emulated build
// (TESSERA_CUDA_EMU, `make test-cuda-host`) g++ compiles the kernels as C++ and the launch queues
// the grid, its arguments copied, on the stream; every block and thread of it runs on the CPU
// when the stream's work runs (device/emu/kernel.hpp); the pointer arguments are checked to be
// device memory first, and what it reads and writes is told to the race detector. The caller
// checks the launch with
// CUDA_CHECK_LAUNCH() in both.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <tuple>
#include <type_traits>

#ifdef TESSERA_CUDA_EMU
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "device/emu/kernel.hpp"
#endif

// Static shared memory: TESSERA_SHARED(float, tile, [64][65]) declares `__shared__ float
// tile[64][65]`. The emulator runs one block after another on a host thread whose statics are
// the block's storage, so there the declaration also poisons it (0xFF: NaN) the first time a
// thread of each new block passes it: a block that reads shared memory it did not write sees NaN,
// not the previous block's values (a bare __shared__ does not compile in the emulated build).
#ifdef TESSERA_CUDA_EMU
#define TESSERA_SHARED(type, name, extents) \
  static thread_local type name extents;    \
  ::tessera::emu::poison_shared(&name, sizeof(name))
#else
#define TESSERA_SHARED(type, name, extents) __shared__ type name extents
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

// The kernel's parameter types, which say what it may write: a `T*` parameter is written, a
// `const T*` one only read (the emulator's race detector, device/emu/races.hpp).
template <typename F>
struct parameters;
template <typename... P>
struct parameters<void (*)(P...)> {
  using type = std::tuple<P...>;
};

// The element each pointer argument points at, read or written as its parameter's type says.
template <auto Kernel, typename... Args, size_t... I>
std::vector<emu::Touch> touches(std::index_sequence<I...>, const Args&... args) {
  using P = typename parameters<decltype(Kernel)>::type;
  static_assert(std::tuple_size_v<P> == sizeof...(Args), "one argument per kernel parameter");
  std::vector<emu::Touch> t;
  auto one = [&](auto i, const auto& a) {
    using Param = std::tuple_element_t<decltype(i)::value, P>;
    if constexpr (std::is_pointer_v<Param>)
      t.push_back({static_cast<const void*>(a), 1, !std::is_const_v<std::remove_pointer_t<Param>>});
  };
  (one(std::integral_constant<size_t, I>{}, args), ...);
  return t;
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
  // By value, as a launch captures its arguments: the grid may run after the caller's copies die.
  auto bound = std::make_shared<const std::tuple<Args...>>(args...);
  emu::run_grid(name, grid, block, smem, stream,
                detail::touches<Kernel>(std::index_sequence_for<Args...>{}, args...),
                [](const void* closure) {
                  std::apply([](const Args&... a) { Kernel(a...); },
                             *static_cast<const std::tuple<Args...>*>(closure));
                },
                bound);
#else
  Kernel<<<grid, block, smem, stream>>>(args...);
#endif
}

}  // namespace tessera::cuda
