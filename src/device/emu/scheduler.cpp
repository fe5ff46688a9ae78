// The CUDA emulator's grid scheduler (kernel.hpp says what it emulates and what it cannot see).
//
// A block's threads are fibers on stacks of their own. The scheduler resumes every
// ready fiber, in forward or shuffled order, until each has blocked at __syncthreads, blocked in
// a warp collective or ended; then it releases whatever can go on: a warp collective whose mask's
// lanes have all arrived (each gets its source lane's value), else the barrier once every live
// thread waits there. When nothing can be released and threads remain, the block would hang on a
// GPU: that is reported with each waiting thread and what it waits for.
//
// A switch between fibers saves the callee-saved registers and the floating-point control words
// and swaps the stack pointer (switch_stack below, x86-64): no system call, where swapcontext
// makes one each time to save the signal mask. Elsewhere the fibers are ucontexts.
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "device/emu/kernel.hpp"
#include "device/emu/memory.hpp"
#include "device/emu/streams.hpp"

#if defined(__SANITIZE_ADDRESS__)
extern "C" void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom,
                                               size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old,
                                                size_t* size_old);
#endif

#if defined(__x86_64__)
// switch_stack(save, to): pushes rbp, rbx, r12-r15 and MXCSR / the x87 control word, stores the
// stack pointer in *save, loads `to`, pops the same from there and returns into that context.
extern "C" void tessera_emu_switch_stack(void** save, void* to);
asm(R"(
  .pushsection .text
  .globl tessera_emu_switch_stack
  .type tessera_emu_switch_stack, @function
tessera_emu_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size tessera_emu_switch_stack, .-tessera_emu_switch_stack
  .popsection
)");
#endif

namespace tessera::emu {

thread_local Coords g_at;

namespace {

constexpr int kWarp = 32;
constexpr unsigned kMaxThreads = 1024;
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kStackBytes = size_t(512) << 10;  // ASan's redzones make frames several times larger
#else
constexpr size_t kStackBytes = size_t(128) << 10;
#endif
constexpr size_t kGuardBytes = 4096;

enum class State { ready, barrier, warp, done };

// Where a suspended fiber (or the scheduler) resumes.
struct Context {
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
};

void switch_to(Context& save, Context& to) {
#if defined(__x86_64__)
  tessera_emu_switch_stack(&save.sp, to.sp);
#else
  swapcontext(&save.uc, &to.uc);
#endif
}

struct Fiber {
  Context ctx;
  char* stack = nullptr;  // kGuardBytes of PROT_NONE, then kStackBytes
  State state = State::ready;
  uint3 tid{};
  int lane = 0;
  // The warp collective it waits in.
  unsigned mask = 0;
  int src = 0;
  uint64_t value = 0, result = 0;
  const char* what = nullptr;
  void* fake_stack = nullptr;  // ASan's bookkeeping across switches
};

struct Launch {
  const char* kernel;
  dim3 grid, block;
  Body body;
  const void* closure;
  std::vector<unsigned char> smem;
};

// One host thread's scheduler.
struct Runner {
  std::vector<Fiber> fibers;  // stacks kept between launches
  Context sched;
  Fiber* current = nullptr;
  Launch* launch = nullptr;
  const void* sched_bottom = nullptr;
  size_t sched_size = 0;
  void* sched_fake_stack = nullptr;
  uint64_t block_serial = 0;  // counts the blocks run: poison_shared's "new block"
  std::vector<std::pair<void*, uint64_t>> poisoned;  // static shared storage, the block it was poisoned for
};
thread_local Runner r;

// TESSERA_EMU_ORDER: forward, random, or random:SEED.
struct Order {
  bool random = false;
  std::mt19937_64 rng;
  Order() {
    const char* s = std::getenv("TESSERA_EMU_ORDER");
    if (!s || !*s || std::string(s) == "forward") return;
    const std::string v = s;
    if (v.rfind("random", 0) != 0 || (v.size() > 6 && v[6] != ':'))
      fault("TESSERA_EMU_ORDER=" + v + ": expected forward, random or random:SEED");
    random = true;
    rng.seed(v.size() > 7 ? std::strtoull(v.c_str() + 7, nullptr, 10) : std::random_device{}());
  }
  template <typename T>
  void arrange(std::vector<T>& v) {
    if (random) std::shuffle(v.begin(), v.end(), rng);
  }
};
Order& order() {
  static Order o;
  return o;
}

std::string coords(uint3 c) {
  char b[48];
  std::snprintf(b, sizeof b, "(%u,%u,%u)", c.x, c.y, c.z);
  return b;
}

[[noreturn]] void kernel_fault(const std::string& what) {
  std::string where = "kernel " + std::string(r.launch ? r.launch->kernel : "?") + ", block " +
                      coords(g_at.block);
  if (r.current) where += ", thread " + coords(r.current->tid);
  fault(where + ": " + what);
}

std::string hex(unsigned x) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", x);
  return b;
}

void asan_start(void** fake, const void* bottom, size_t size) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_start_switch_fiber(fake, bottom, size);
#else
  (void)fake, (void)bottom, (void)size;
#endif
}
void asan_finish(void* fake, const void** bottom, size_t* size) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(fake, bottom, size);
#else
  (void)fake, (void)bottom, (void)size;
#endif
}

// Back to the scheduler from the running fiber; returns when the scheduler resumes it (never,
// once it has ended).
void yield_to_scheduler() {
  Fiber* f = r.current;
  asan_start(f->state == State::done ? nullptr : &f->fake_stack, r.sched_bottom, r.sched_size);
  switch_to(f->ctx, r.sched);
  asan_finish(f->fake_stack, nullptr, nullptr);
}

// The first frame of every fiber; it never returns (the scheduler does not resume it once done).
void fiber_main() {
  asan_finish(nullptr, &r.sched_bottom, &r.sched_size);
  r.launch->body(r.launch->closure);
  r.current->state = State::done;
  yield_to_scheduler();
  __builtin_unreachable();
}

void resume(Fiber& f) {
  r.current = &f;
  g_at.thread = f.tid;
  asan_start(&r.sched_fake_stack, f.stack + kGuardBytes, kStackBytes);
  switch_to(r.sched, f.ctx);
  asan_finish(r.sched_fake_stack, nullptr, nullptr);
  r.current = nullptr;
}

void prepare(Fiber& f, uint3 tid, int linear) {
  if (!f.stack) {
    void* p = mmap(nullptr, kGuardBytes + kStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fault("cannot map a fiber stack");
    mprotect(p, kGuardBytes, PROT_NONE);  // an overflowing CUDA thread faults here
    f.stack = static_cast<char*>(p);
  }
#if defined(__x86_64__)
  // What switch_stack pops, top down: fiber_main as the return address (with a null one above
  // it, so fiber_main starts with the stack alignment of a call), six zero registers, and this
  // thread's MXCSR and x87 control word.
  auto* top = reinterpret_cast<uint64_t*>(f.stack + kGuardBytes + kStackBytes);
  top[-1] = 0;
  top[-2] = reinterpret_cast<uint64_t>(&fiber_main);
  for (int k = 3; k <= 8; k++) top[-k] = 0;
  uint32_t mxcsr = 0;
  uint16_t fpucw = 0;
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(fpucw));
  top[-9] = uint64_t(mxcsr) | uint64_t(fpucw) << 32;
  f.ctx.sp = top - 9;
#else
  getcontext(&f.ctx.uc);
  f.ctx.uc.uc_stack.ss_sp = f.stack + kGuardBytes;
  f.ctx.uc.uc_stack.ss_size = kStackBytes;
  f.ctx.uc.uc_link = nullptr;
  makecontext(&f.ctx.uc, fiber_main, 0);
#endif
  f.state = State::ready;
  f.tid = tid;
  f.lane = linear % kWarp;
  f.what = nullptr;
}

std::string describe(const std::vector<Fiber>& fibers, size_t n) {
  std::ostringstream s;
  int shown = 0;
  for (size_t i = 0; i < n && shown < 4; i++) {
    const Fiber& f = fibers[i];
    if (f.state == State::done) continue;
    s << (shown++ ? "; " : "") << "thread " << coords(f.tid) << " waits in "
      << (f.state == State::barrier ? "__syncthreads()"
                                    : std::string(f.what) + "(mask " + hex(f.mask) + ")");
  }
  return s.str();
}

// Releases every warp collective whose lanes have all arrived; true when one was.
bool release_warps(size_t n) {
  bool released = false;
  for (size_t w = 0; w * kWarp < n; w++) {
    Fiber* lanes = &r.fibers[w * kWarp];
    const int count = int(std::min<size_t>(kWarp, n - w * kWarp));
    for (int l = 0; l < count; l++) {
      if (lanes[l].state != State::warp) continue;
      const unsigned mask = lanes[l].mask;
      bool complete = true;
      for (int k = 0; k < kWarp; k++) {
        if (!(mask >> k & 1u)) continue;
        r.current = &lanes[l];
        if (k >= count)
          kernel_fault(std::string(lanes[l].what) + "(mask " + hex(mask) + ") names lane " +
                       std::to_string(k) + ", which the block does not have");
        const Fiber& g = lanes[k];
        if (g.state == State::done)
          kernel_fault(std::string(lanes[l].what) + "(mask " + hex(mask) + ") names lane " +
                       std::to_string(k) + ", which has exited: the collective never completes");
        if (g.state == State::warp && (g.mask != mask || g.what != lanes[l].what))
          kernel_fault("lanes " + std::to_string(l) + " and " + std::to_string(k) +
                       " wait in different warp collectives: " + lanes[l].what + "(mask " +
                       hex(mask) + ") and " + g.what + "(mask " + hex(g.mask) + ")");
        if (g.state != State::warp) complete = false;
      }
      r.current = nullptr;
      if (!complete) continue;
      for (int k = 0; k < kWarp; k++) {
        if (!(mask >> k & 1u)) continue;
        Fiber& g = lanes[k];
        if (!(mask >> g.src & 1u)) {
          r.current = &g;
          kernel_fault(std::string(g.what) + "(mask " + hex(mask) + ") reads lane " +
                       std::to_string(g.src) + ", which is not in the mask");
        }
        g.result = lanes[g.src].value;
      }
      for (int k = 0; k < kWarp; k++)
        if (mask >> k & 1u) lanes[k].state = State::ready;
      released = true;
    }
  }
  return released;
}

// Releases the block barrier when every live thread waits at it.
bool release_barrier(size_t n) {
  bool any = false;
  for (size_t i = 0; i < n; i++) {
    if (r.fibers[i].state == State::warp) return false;
    any = any || r.fibers[i].state == State::barrier;
  }
  for (size_t i = 0; i < n; i++)
    if (r.fibers[i].state == State::barrier) r.fibers[i].state = State::ready;
  return any;
}

void run_block(uint3 block) {
  g_at.block = block;
  const dim3 bd = r.launch->block;
  const size_t n = size_t(bd.x) * bd.y * bd.z;
  if (r.fibers.size() < n) r.fibers.resize(n);
  std::vector<size_t> sequence(n);
  for (size_t i = 0; i < n; i++) {
    const uint3 tid{unsigned(i % bd.x), unsigned(i / bd.x % bd.y), unsigned(i / (size_t(bd.x) * bd.y))};
    prepare(r.fibers[i], tid, int(i));
    sequence[i] = i;
  }
  std::fill(r.launch->smem.begin(), r.launch->smem.end(), 0xFF);  // NaN until written
  r.block_serial++;
  size_t live = n;
  for (;;) {
    order().arrange(sequence);
    for (size_t i : sequence) {
      if (r.fibers[i].state != State::ready) continue;
      resume(r.fibers[i]);
      if (r.fibers[i].state == State::done) live--;
    }
    if (live == 0) return;
    if (release_warps(n) || release_barrier(n)) continue;
    kernel_fault("the block can never finish: " + describe(r.fibers, n));
  }
}

}  // namespace

void syncthreads() {
  if (!r.current) fault("__syncthreads() outside a kernel");
  r.current->state = State::barrier;
  yield_to_scheduler();
}

uint64_t warp_collective(unsigned mask, uint64_t value, int src, const char* what) {
  Fiber* f = r.current;
  if (!f) fault(std::string(what) + " outside a kernel");
  if (!(mask >> f->lane & 1u))
    kernel_fault(std::string(what) + "(mask " + hex(mask) + ") called by lane " +
                 std::to_string(f->lane) + ", which the mask leaves out");
  f->mask = mask;
  f->value = value;
  f->src = src;
  f->what = what;
  f->state = State::warp;
  yield_to_scheduler();
  return f->result;
}

int lane_id() {
  const Coords& c = g_at;
  const size_t linear =
      c.thread.x + size_t(c.block_dim.x) * (c.thread.y + size_t(c.block_dim.y) * c.thread.z);
  return int(linear % kWarp);
}

void* dynamic_shared() {
  if (!r.launch) fault("dynamic shared memory outside a kernel");
  return r.launch->smem.data();
}

void poison_shared(void* p, size_t bytes) {
  if (!r.launch) fault("shared memory declared outside a kernel");
  for (auto& [q, serial] : r.poisoned)
    if (q == p) {
      if (serial != r.block_serial) std::memset(p, 0xFF, bytes);
      serial = r.block_serial;
      return;
    }
  std::memset(p, 0xFF, bytes);
  r.poisoned.emplace_back(p, r.block_serial);
}

void run_grid(const char* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
              const std::vector<Touch>& touches, Body body, std::shared_ptr<const void> closure) {
  if (r.launch) fault(std::string("kernel ") + kernel + " launched from inside a kernel");
  const size_t threads = size_t(block.x) * block.y * block.z;
  // The limits of every GPU since sm_30 (maxThreadsPerBlock, maxThreadsDim, maxGridSize) and
  // the 48 KiB of dynamic shared memory a launch gets without an opt-in attribute.
  if (threads == 0 || threads > kMaxThreads || block.z > 64 || grid.x == 0 || grid.y == 0 ||
      grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535 ||
      smem > (size_t(48) << 10)) {
    say(std::string("kernel ") + kernel + ": invalid launch configuration: grid " +
        coords({grid.x, grid.y, grid.z}) + ", block " + coords({block.x, block.y, block.z}) + ", " +
        std::to_string(smem) + " bytes of shared memory");
    set_last_error(cudaErrorInvalidConfiguration);
    return;
  }
  if (!valid_stream(stream)) {
    say(std::string("kernel ") + kernel + ": launched on a stream that does not exist");
    set_last_error(cudaErrorInvalidResourceHandle);
    return;
  }
  touch(stream, kernel, touches);
  // The grid runs when its stream gets to it (streams.hpp), from the arguments as they were now.
  enqueue(stream, [kernel, grid, block, smem, body, closure] {
    Launch launch{kernel, grid, block, body, closure.get(), std::vector<unsigned char>(smem)};
    r.launch = &launch;
    g_at.grid_dim = grid;
    g_at.block_dim = block;
    std::vector<uint3> blocks;
    blocks.reserve(size_t(grid.x) * grid.y * grid.z);
    for (unsigned z = 0; z < grid.z; z++)
      for (unsigned y = 0; y < grid.y; y++)
        for (unsigned x = 0; x < grid.x; x++) blocks.push_back({x, y, z});
    order().arrange(blocks);
    for (const uint3& b : blocks) run_block(b);
    r.launch = nullptr;
    g_at = Coords{};
  });
}

void check_kernel_pointer(const char* kernel, int argument, const void* p) {
  if (p == nullptr || space_of(p, 0) != Space::none) return;
  fault(std::string("kernel ") + kernel + ": argument " + std::to_string(argument) +
        " is a host pointer, not device memory (an illegal address on a GPU)");
}

}  // namespace tessera::emu
