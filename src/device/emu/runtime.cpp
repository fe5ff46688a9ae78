// The CUDA emulator's runtime: the cuda* calls tessera makes, defined against the declarations of
// the CUDA headers (cuda_runtime_api.h), on host memory; queued work (copies, memsets) runs when
// streams.hpp's mode says: at once (sync) or deferred until the host synchronises (async).
//
// cudaMalloc gives 256-byte aligned host memory filled with 0xFF bytes (a NaN in fp32, fp64 and
// bf16), so an output that a kernel should have written and did not shows up. Copies and memsets
// check their direction and that every byte lies in one allocation; a bad one returns the error a
// GPU would (cudaErrorInvalidValue) and says why on stderr.
//
// Devices: TESSERA_EMU_DEVICES (default 8) identical devices named "tessera CUDA emulator",
// compute capability 0.0 (so no datasheet peak applies), each with its own UUID, of
// TESSERA_EMU_DEVICE_MEMORY bytes (default 16 GiB: a cudaMalloc beyond it fails as on a full GPU).
// CUDA_VISIBLE_DEVICES selects and orders them as the driver does (a list of indices, cut at the
// first one that is not a device; set but empty: none).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "device/emu/memory.hpp"
#include "device/emu/races.hpp"
#include "device/emu/streams.hpp"

namespace tessera::emu {

namespace {

struct Allocation {
  size_t bytes;
  Space space;
};

// Allocations by base address; the prefetcher's threads allocate pinned memory too.
std::mutex g_mutex;
std::map<uintptr_t, Allocation> g_allocations;
std::set<const void*> g_streams, g_events;
thread_local cudaError_t g_last_error = cudaSuccess;
thread_local int g_device = 0;

struct Handle {
  int kind;  // streams and events are distinct objects whose addresses name them
};

// The errors the emulator returns, named and described as the CUDA runtime does.
struct ErrorText {
  cudaError_t code;
  const char *name, *text;
};
const ErrorText& error_text(cudaError_t e) {
  static const ErrorText table[] = {
      {cudaSuccess, "cudaSuccess", "no error"},
      {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
      {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
      {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
       "invalid configuration argument"},
      {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
      {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
      {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
      {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
      {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
  };
  for (const ErrorText& t : table)
    if (t.code == e) return t;
  return table[sizeof table / sizeof table[0] - 1];
}

size_t g_device_bytes = 0;  // cudaMalloc'd and not freed

// The physical devices CUDA_VISIBLE_DEVICES leaves visible, in its order.
const std::vector<int>& visible_devices() {
  static const std::vector<int> visible = [] {
    const char* s = std::getenv("TESSERA_EMU_DEVICES");
    const int physical = s ? std::max(0, std::atoi(s)) : 8;
    std::vector<int> v;
    const char* list = std::getenv("CUDA_VISIBLE_DEVICES");
    if (!list) {
      for (int d = 0; d < physical; d++) v.push_back(d);
      return v;
    }
    std::stringstream in(list);
    for (std::string item; std::getline(in, item, ',');) {
      char* end = nullptr;
      const long d = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || d < 0 || d >= physical) break;
      v.push_back(int(d));
    }
    return v;
  }();
  return visible;
}
int device_count() { return int(visible_devices().size()); }

size_t device_memory() {
  const char* s = std::getenv("TESSERA_EMU_DEVICE_MEMORY");
  return s ? size_t(std::strtoull(s, nullptr, 10)) : size_t(16) << 30;
}

cudaError_t fail(cudaError_t e, const std::string& why) {
  say(why);
  return e;
}

void* allocate(size_t bytes, Space space) {
  if (space == Space::device) {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_device_bytes + bytes > device_memory()) return nullptr;
    g_device_bytes += bytes;
  }
  void* p = nullptr;
  if (posix_memalign(&p, 256, bytes) != 0) return nullptr;
  std::memset(p, 0xFF, bytes);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_allocations[reinterpret_cast<uintptr_t>(p)] = {bytes, space};
  return p;
}

cudaError_t release(void* p, Space space, const char* call) {
  if (p == nullptr) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_allocations.find(reinterpret_cast<uintptr_t>(p));
    if (it == g_allocations.end() || it->second.space != space)
      return fail(cudaErrorInvalidValue, std::string(call) + ": not the start of an allocation of " +
                                             (space == Space::device ? "device" : "pinned") +
                                             " memory");
    if (space == Space::device) g_device_bytes -= it->second.bytes;
    g_allocations.erase(it);
  }
  std::free(p);
  return cudaSuccess;
}

const char* space_name(Space s) {
  return s == Space::device ? "device memory" : s == Space::pinned ? "pinned host memory"
                                                                   : "host memory";
}

// Where the memcpy kinds say each side must be: device, or not device.
cudaError_t check_copy(const char* call, void* dst, const void* src, size_t bytes,
                       cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind == cudaMemcpyDefault) return cudaSuccess;
  for (int side = 0; side < 2; side++) {
    const void* p = side == 0 ? dst : src;
    const bool want_device = side == 0 ? dst_dev : src_dev;
    const Space s = space_of(p, bytes);
    if (want_device && s != Space::device)
      return fail(cudaErrorInvalidValue,
                  std::string(call) + ": the " + (side == 0 ? "destination" : "source") +
                      " is not device memory for " + std::to_string(bytes) + " bytes: " +
                      check_device_range(p, bytes));
    if (!want_device && s == Space::device)
      return fail(cudaErrorInvalidValue, std::string(call) + ": the " +
                                             (side == 0 ? "destination" : "source") +
                                             " is device memory, but the kind says host");
  }
  return cudaSuccess;
}

}  // namespace

Space space_of(const void* p, size_t bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_allocations.upper_bound(a);
  if (it == g_allocations.begin()) return Space::none;
  --it;
  return a + bytes <= it->first + it->second.bytes ? it->second.space : Space::none;
}

std::string check_device_range(const void* p, size_t bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_allocations.upper_bound(a);
  if (it != g_allocations.begin()) {
    --it;
    const uintptr_t end = it->first + it->second.bytes;
    if (a <= end && it->second.space == Space::device) {
      if (a + bytes <= end) return "";
      return std::to_string(a + bytes - end) + " bytes past the end of a device allocation of " +
             std::to_string(it->second.bytes) + " bytes (at offset " +
             std::to_string(a - it->first) + ")";
    }
    if (a < end) return std::string("it is ") + space_name(it->second.space);
  }
  return "it is host memory";
}

size_t allocation_bytes(const void* p) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto it = g_allocations.find(reinterpret_cast<uintptr_t>(p));
  return it == g_allocations.end() ? 0 : it->second.bytes;
}

void set_last_error(cudaError_t e) { g_last_error = e; }

bool valid_stream(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return true;
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_streams.count(s) > 0;
}

void say(const std::string& what) { std::fprintf(stderr, "cuda emulator: %s\n", what.c_str()); }

void fault(const std::string& what) {
  say(what);
  std::fflush(stderr);
  std::abort();
}

}  // namespace tessera::emu

using namespace tessera::emu;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = device_count();
  return *count > 0 ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return cudaErrorInvalidDevice;
  g_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = g_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= device_count()) return cudaErrorInvalidDevice;
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "tessera CUDA emulator");
  prop->uuid.bytes[0] = char(visible_devices()[size_t(device)] + 1);
  prop->totalGlobalMem = device_memory();
  prop->sharedMemPerBlock = size_t(48) << 10;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->multiProcessorCount = 1;
  prop->pciDeviceID = visible_devices()[size_t(device)];
  // TESSERA_EMU_COMPUTE=MAJOR.MINOR: the compute capability reported (default 0.0, no GPU's),
  // for the tests of what a GPU of that generation is refused.
  if (const char* cc = std::getenv("TESSERA_EMU_COMPUTE"))
    if (std::sscanf(cc, "%d.%d", &prop->major, &prop->minor) != 2)
      fault(std::string("TESSERA_EMU_COMPUTE=") + cc + ": expected MAJOR.MINOR, e.g. 8.0");
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  drain();
  host_waited_all();
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  std::lock_guard<std::mutex> lock(g_mutex);
  *total = device_memory();
  *free = *total - std::min(*total, g_device_bytes);
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = g_last_error;
  g_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return g_last_error; }

const char* cudaGetErrorString(cudaError_t error) { return error_text(error).text; }

const char* cudaGetErrorName(cudaError_t error) { return error_text(error).name; }

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  *ptr = allocate(bytes, Space::device);
  return *ptr ? cudaSuccess : cudaErrorMemoryAllocation;
}

// Both wait for the device first, as CUDA's do: queued work may still use the memory.
cudaError_t cudaFree(void* ptr) {
  drain();
  host_waited_all();
  if (ptr && space_of(ptr, 0) == Space::device) forget_range(ptr, allocation_bytes(ptr));
  return release(ptr, Space::device, "cudaFree");
}

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int flags) {
  (void)flags;
  *ptr = allocate(bytes > 0 ? bytes : 1, Space::pinned);
  return *ptr ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) { return cudaHostAlloc(ptr, bytes, 0); }

cudaError_t cudaFreeHost(void* ptr) {
  drain();
  host_waited_all();
  if (ptr && space_of(ptr, 0) == Space::pinned) forget_range(ptr, allocation_bytes(ptr));
  return release(ptr, Space::pinned, "cudaFreeHost");
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync: no such stream");
  if (const cudaError_t e = check_copy("cudaMemcpyAsync", dst, src, bytes, kind); e != cudaSuccess)
    return e;
  if (bytes == 0) return cudaSuccess;
  // As CUDA: from pageable host memory the source is staged when the copy is queued (the caller
  // may reuse it on return); into pageable host memory the copy completes before the call
  // returns, after the stream's earlier work; pinned and device memory are read and written when
  // the copy runs.
  touch(stream, "cudaMemcpyAsync", {{src, bytes, false}, {dst, bytes, true}});
  if (space_of(src, bytes) == Space::none) {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
    enqueue(stream, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
  } else if (space_of(dst, bytes) == Space::none) {
    flush(stream);
    host_waited(stream);
    std::memmove(dst, src, bytes);
  } else {
    enqueue(stream, [dst, src, bytes] { std::memmove(dst, src, bytes); });
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  drain();
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
  drain();
  host_waited(nullptr);  // the legacy stream's: the streams tessera makes do not block on it
  return e;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle, "cudaMemsetAsync: no such stream");
  if (bytes == 0) return cudaSuccess;
  if (const std::string why = check_device_range(ptr, bytes); !why.empty())
    return fail(cudaErrorInvalidValue, "cudaMemsetAsync of " + std::to_string(bytes) + " bytes: " + why);
  touch(stream, "cudaMemsetAsync", {{ptr, bytes, true}});
  enqueue(stream, [ptr, value, bytes] { std::memset(ptr, value, bytes); });
  return cudaSuccess;
}

cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  const cudaError_t e = cudaMemsetAsync(ptr, value, bytes, nullptr);
  drain();
  return e;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  (void)flags;
  auto* h = new Handle{1};
  *stream = reinterpret_cast<cudaStream_t>(h);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_streams.insert(h);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  drain();  // its queued work still runs, as on a GPU
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_streams.erase(stream)) return cudaErrorInvalidResourceHandle;
  delete reinterpret_cast<Handle*>(stream);
  return cudaSuccess;
}

// A host wait: every stream's queued work runs (streams.hpp), in the mode's order.
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (!valid_stream(stream)) return cudaErrorInvalidResourceHandle;
  if (collective_hung())
    fault("cudaStreamSynchronize on a stream behind a hung collective: it waits for ever on a GPU "
          "(a bounded wait is device::wait_stream)");
  drain();
  host_waited(stream);
  return cudaSuccess;
}

// As a wait: what the host reads after a query that says done must be there.
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (!valid_stream(stream)) return cudaErrorInvalidResourceHandle;
  if (collective_hung()) return cudaErrorNotReady;
  drain();
  host_waited(stream);
  return cudaSuccess;
}

namespace {
// When each event's stream reached it (the host's clock as the emulator runs the stream's work):
// what cudaEventElapsedTime reads. Their own lock: the stamp runs inside a drain.
std::mutex g_times_mutex;
std::map<cudaEvent_t, std::chrono::steady_clock::time_point> g_times;
}  // namespace

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  (void)flags;
  auto* h = new Handle{2};
  *event = reinterpret_cast<cudaEvent_t>(h);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_events.insert(h);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_events.erase(event)) return cudaErrorInvalidResourceHandle;
  forget_event(event);
  {
    std::lock_guard<std::mutex> times(g_times_mutex);
    g_times.erase(event);
  }
  races_forget_event(event);
  delete reinterpret_cast<Handle*>(event);
  return cudaSuccess;
}

static bool valid_event(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_events.count(event) > 0;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!valid_event(event) || !valid_stream(stream)) return cudaErrorInvalidResourceHandle;
  record(event, stream);
  races_record(event, stream);
  enqueue(stream, [event] {
    std::lock_guard<std::mutex> lock(g_times_mutex);
    g_times[event] = std::chrono::steady_clock::now();
  });
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!valid_event(start) || !valid_event(end)) return cudaErrorInvalidResourceHandle;
  drain();
  std::lock_guard<std::mutex> lock(g_times_mutex);
  const auto a = g_times.find(start), b = g_times.find(end);
  if (a == g_times.end() || b == g_times.end()) return cudaErrorInvalidResourceHandle;
  *ms = std::chrono::duration<float, std::milli>(b->second - a->second).count();
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!valid_event(event)) return cudaErrorInvalidResourceHandle;
  drain();
  host_waited_event(event);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (!valid_event(event)) return cudaErrorInvalidResourceHandle;
  drain();
  host_waited_event(event);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  (void)flags;
  if (!valid_event(event) || !valid_stream(stream)) return cudaErrorInvalidResourceHandle;
  wait_event(stream, event);
  races_wait(stream, event);
  return cudaSuccess;
}

}  // extern "C"
