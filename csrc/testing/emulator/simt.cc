// The SIMT emulator's scheduler and checks (see simt.h).
#include "testing/emulator/simt.h"

#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/cuda_devices.h"

// The linker's bounds of the section __shared__ variables live in.
extern "C" char __start_jgsess_simt_shared[];
extern "C" char __stop_jgsess_simt_shared[];

// The section's last page (simt.cc links after the kernels): with its alignment, the section
// starts and ends on page boundaries, so protecting it protects nothing else (the GOT, say).
__attribute__((section("jgsess_simt_shared"), aligned(4096), used)) char jgsess_simt_pad[4096];

namespace jgsess::simt {
namespace {

constexpr size_t kStackBytes = 256 * 1024;
// The race check watches the first blocks a launch runs (its order is shuffled); the others run
// the same code unwatched (trapping every shared access of a 512-block launch costs seconds).
constexpr unsigned kWatchedBlocks = 16;
constexpr int kWarp = 32;

enum class State { kReady, kBarrier, kWarp, kDone };

struct Thread {
  jmp_buf resume;  // where it yielded (once started)
  bool started = false;
  Here here;
  int id = 0;  // linear index in the block
  State state = State::kReady;
  // the warp operation it waits in
  const char* op = nullptr;
  uint32_t mask = 0;
  uint64_t value = 0;
  unsigned delta = 0;
  uint64_t result = 0;
};

// Who touched a shared location since the last barrier.
struct Access {
  int writer = -1;
  int reader = -1;
  bool readers = false;  // read by more than one thread
};

struct Block {
  const char* kernel = "";
  const std::function<void()>* body = nullptr;
  std::vector<Thread> threads;
  jmp_buf scheduler;
  int running = -1;
  bool failed = false;
  std::string message;
  std::unordered_map<uintptr_t, Access> shared;
  sigjmp_buf fault;
};

thread_local Block* current_block = nullptr;
thread_local ucontext_t fresh;  // a thread's first context, before makecontext gives it a stack
thread_local std::vector<void*> stacks;
thread_local int last_error = 0;
std::mutex launch_log_mutex;
std::vector<std::tuple<std::string, std::tuple<unsigned, unsigned, unsigned>,
                       std::tuple<unsigned, unsigned, unsigned>>>
    launch_log;
thread_local std::string last_message;
const Here kOutside{};

std::string Where(const Block& b, int thread) {
  const Here& h = b.threads[thread].here;
  char text[160];
  std::snprintf(text, sizeof(text), "%s block (%u,%u,%u) thread (%u,%u,%u)", b.kernel, h.block.x,
                h.block.y, h.block.z, h.thread.x, h.thread.y, h.thread.z);
  return text;
}

void Fail(Block& b, const std::string& message) {
  if (b.failed) return;
  b.failed = true;
  b.message = message;
}

Thread& Running() { return current_block->threads[current_block->running]; }

void* Stack(size_t i) {
  while (stacks.size() <= i) {
    void* stack = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    stacks.push_back(stack);
  }
  return stacks[i];
}

// Switches between the scheduler and a thread go by _setjmp/_longjmp (no signal-mask system
// call, unlike swapcontext); a thread starts on its own stack through setcontext.
void Yield() {
  Block& b = *current_block;
  if (_setjmp(b.threads[b.running].resume) == 0) _longjmp(b.scheduler, 1);
}

void Entry() {
  Block& b = *current_block;
  (*b.body)();
  b.threads[b.running].state = State::kDone;
  _longjmp(b.scheduler, 1);
}

void Resume(Block& b, int i) {
  b.running = i;
  here = &b.threads[i].here;
  if (_setjmp(b.scheduler) == 0) {
    Thread& t = b.threads[i];
    if (t.started) _longjmp(t.resume, 1);
    t.started = true;
    ucontext_t start = fresh;
    start.uc_stack.ss_sp = Stack(i);
    start.uc_stack.ss_size = kStackBytes;
    start.uc_link = nullptr;
    makecontext(&start, Entry, 0);
    setcontext(&start);
  }
  b.running = -1;
  here = &kOutside;
}

// ---- shared memory: every access traps while a block's threads run (x86-64 Linux) ----

#if defined(__x86_64__) && defined(__linux__)
constexpr bool kTrapShared = true;
#else
constexpr bool kTrapShared = false;
#endif

uintptr_t SharedBegin() { return reinterpret_cast<uintptr_t>(__start_jgsess_simt_shared); }
uintptr_t SharedEnd() { return reinterpret_cast<uintptr_t>(__stop_jgsess_simt_shared); }

struct Pages {
  uintptr_t begin = 0, end = 0;
};

Pages SharedPages() {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return {SharedBegin() & ~(page - 1), (SharedEnd() + page - 1) & ~(page - 1)};
}

void Protect(bool on) {
  const Pages p = SharedPages();
  if (p.end > p.begin) {
    mprotect(reinterpret_cast<void*>(p.begin), p.end - p.begin,
             on ? PROT_NONE : PROT_READ | PROT_WRITE);
  }
}

void OnShared(uintptr_t address, bool write) {
  Block& b = *current_block;
  const int me = b.running;
  Access& a = b.shared[address];
  const auto race = [&](int other, const char* what) {
    char text[96];
    std::snprintf(text, sizeof(text), "shared-memory race at offset %zu: %s by ",
                  static_cast<size_t>(address - SharedBegin()), what);
    Fail(b, text + Where(b, other) + " and " + Where(b, me) + " between the same two barriers");
  };
  if (write) {
    if (a.writer >= 0 && a.writer != me) race(a.writer, "written");
    if (a.reader >= 0 && (a.reader != me || a.readers)) race(a.reader, "read and written");
    a.writer = me;
  } else {
    if (a.writer >= 0 && a.writer != me) race(a.writer, "written and read");
    if (a.reader < 0) a.reader = me;
    if (a.reader != me) a.readers = true;
  }
}

struct sigaction previous_segv, previous_trap;
thread_local bool stepping = false;

void Chain(const struct sigaction& previous, int sig, siginfo_t* info, void* context) {
  if (previous.sa_flags & SA_SIGINFO) {
    previous.sa_sigaction(sig, info, context);
  } else if (previous.sa_handler != SIG_IGN && previous.sa_handler != SIG_DFL) {
    previous.sa_handler(sig);
  } else {
    signal(sig, SIG_DFL);  // the access faults again, now fatally
  }
}

void OnSegv(int sig, siginfo_t* info, void* context) {
  const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
  Block* b = current_block;
  const Pages p = SharedPages();
  if (b != nullptr && b->running >= 0) {
    if constexpr (kTrapShared) {
      if (address >= p.begin && address < p.end) {
        auto* uc = static_cast<ucontext_t*>(context);
        const bool write = (uc->uc_mcontext.gregs[REG_ERR] & 2) != 0;
        if (address >= SharedBegin() && address < SharedEnd()) OnShared(address, write);
        Protect(false);
        uc->uc_mcontext.gregs[REG_EFL] |= 0x100;  // trap after this one access
        stepping = true;
        return;
      }
    }
    auto* uc = static_cast<ucontext_t*>(context);
    const bool write = (uc->uc_mcontext.gregs[REG_ERR] & 2) != 0;
    Fail(*b, std::string("invalid global ") + (write ? "write" : "read") + " at " +
                 DescribeAddress(address) + " by " + Where(*b, b->running));
    siglongjmp(b->fault, 1);
  }
  Chain(previous_segv, sig, info, context);
}

void OnTrap(int sig, siginfo_t* info, void* context) {
  if constexpr (kTrapShared) {
    if (stepping) {
      stepping = false;
      static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_EFL] &= ~0x100;
      Protect(true);
      return;
    }
  }
  Chain(previous_trap, sig, info, context);
}

void InstallHandlers() {
  static const bool installed = [] {
    struct sigaction action{};
    action.sa_sigaction = OnSegv;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &previous_segv);
    action.sa_sigaction = OnTrap;
    sigaction(SIGTRAP, &action, &previous_trap);
    return true;
  }();
  (void)installed;
}

// ---- warp operations ----

// Resolves the warp operation `t` waits in if every lane its mask names waits in one too.
bool ResolveWarp(Block& b, Thread& t) {
  const int base = t.id / kWarp * kWarp;
  for (int lane = 0; lane < kWarp; ++lane) {
    if (!((t.mask >> lane) & 1u)) continue;
    if (base + lane >= static_cast<int>(b.threads.size())) {
      Fail(b, std::string(t.op) + " mask names lane " + std::to_string(lane) +
                  ", which the block does not have, at " + Where(b, t.id));
      return false;
    }
    const Thread& other = b.threads[base + lane];
    if (other.state == State::kDone) {
      Fail(b, std::string(t.op) + " mask names lane " + std::to_string(lane) +
                  ", which has exited, at " + Where(b, t.id));
      return false;
    }
    if (other.state != State::kWarp) return false;  // not there yet
    if (other.mask != t.mask || std::strcmp(other.op, t.op) != 0) {
      Fail(b, std::string("lanes of one warp meet in different warp operations: ") + t.op + " at " +
                  Where(b, t.id) + ", " + other.op + " at " + Where(b, other.id));
      return false;
    }
  }
  uint32_t ballot = 0;
  for (int lane = 0; lane < kWarp; ++lane) {
    if ((t.mask >> lane) & 1u) ballot |= (b.threads[base + lane].value != 0 ? 1u : 0u) << lane;
  }
  for (int lane = 0; lane < kWarp; ++lane) {
    if (!((t.mask >> lane) & 1u)) continue;
    Thread& member = b.threads[base + lane];
    if (std::strcmp(member.op, "__ballot_sync") == 0) {
      member.result = ballot;
    } else {
      // a source past the warp's end gives the lane its own value; one inside the warp that
      // the mask does not name is undefined on the hardware
      const int src = lane + static_cast<int>(member.delta);
      if (src < kWarp && !((t.mask >> src) & 1u)) {
        Fail(b, std::string(t.op) + " at " + Where(b, member.id) + " reads lane " +
                    std::to_string(src) + ", which its mask does not name (undefined on a GPU)");
        return false;
      }
      member.result = src < kWarp ? b.threads[base + src].value : member.value;
    }
    member.state = State::kReady;
  }
  return true;
}

uint64_t WarpOp(const char* op, uint32_t mask, uint64_t value, unsigned delta) {
  Thread& t = Running();
  Block& b = *current_block;
  if (!((mask >> (t.id % kWarp)) & 1u)) {
    Fail(b, std::string(op) + " by a lane its mask does not name, at " + Where(b, t.id));
  }
  t.op = op;
  t.mask = mask;
  t.value = value;
  t.delta = delta;
  t.state = State::kWarp;
  Yield();
  return Running().result;
}

// Runs one block to its end; false on a checked failure (b.message).
void RunBlock(Block& b, std::mt19937& rng) {
  std::vector<int> order(b.threads.size());
  std::iota(order.begin(), order.end(), 0);
  b.shared.clear();
  while (!b.failed) {
    bool progress = false;
    std::shuffle(order.begin(), order.end(), rng);
    for (int i : order) {
      if (b.threads[i].state != State::kReady || b.failed) continue;
      Resume(b, i);
      progress = true;
    }
    for (Thread& t : b.threads) {
      if (!b.failed && t.state == State::kWarp) progress |= ResolveWarp(b, t);
    }
    if (b.failed || progress) continue;
    int done = 0, waiting = 0, warp = -1;
    for (const Thread& t : b.threads) {
      done += t.state == State::kDone;
      waiting += t.state == State::kBarrier;
      if (t.state == State::kWarp && warp < 0) warp = t.id;
    }
    if (done == static_cast<int>(b.threads.size())) return;
    if (warp >= 0) {
      Fail(b, std::string(b.threads[warp].op) + " at " + Where(b, warp) +
                  " waits for lanes that never reach it (they wait at a barrier)");
    } else if (done > 0) {
      const int exited =
          static_cast<int>(std::find_if(b.threads.begin(), b.threads.end(),
                                        [](const Thread& t) { return t.state == State::kDone; }) -
                           b.threads.begin());
      Fail(b, "__syncthreads reached by " + std::to_string(waiting) + " of " +
                  std::to_string(b.threads.size()) + " threads (" + Where(b, exited) +
                  " exited without it)");
    } else {
      for (Thread& t : b.threads) t.state = State::kReady;  // every thread is at the barrier
      b.shared.clear();
    }
  }
}

}  // namespace

thread_local const Here* here = &kOutside;

void SyncThreads() {
  Running().state = State::kBarrier;
  Yield();
}

uint64_t WarpShuffleDown(uint32_t mask, uint64_t value, unsigned delta) {
  return WarpOp("__shfl_down_sync", mask, value, delta);
}

uint32_t WarpBallot(uint32_t mask, bool predicate) {
  return static_cast<uint32_t>(WarpOp("__ballot_sync", mask, predicate ? 1 : 0, 0));
}

void CheckAligned(const void* address, size_t bytes) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  if (at % bytes == 0) return;
  Block* b = current_block;
  Fail(*b, "misaligned " + std::to_string(bytes) + "-byte access at " + DescribeAddress(at) +
               " by " + Where(*b, b->running) + " (a GPU faults)");
  siglongjmp(b->fault, 1);
}

std::mutex loaded_mutex;
std::set<std::pair<int, const void*>> loaded;  // (device, kernel)
std::atomic<int> device_count{1}, launch_device{-1};
thread_local int current_device = 0;

bool RunGrid(const void* function, const char* kernel, dim3 grid, dim3 block,
             const std::function<void()>& body) {
  InstallHandlers();
  {
    const int device = launch_device >= 0 ? launch_device.load() : current_device;
    std::lock_guard<std::mutex> lock(loaded_mutex);
    if (loaded.count({device, function}) == 0) {
      SetError(3, std::string(kernel) + ": launched before its code was loaded into device " +
                      std::to_string(device) +
                      "'s context (cudaFuncGetAttributes for every device in the handler's "
                      "instantiate stage): under lazy loading the first launch loads it, which "
                      "fails inside a CUDA graph capture");
      return false;
    }
  }
  {
    std::lock_guard<std::mutex> lock(launch_log_mutex);
    launch_log.emplace_back(kernel, std::tuple{grid.x, grid.y, grid.z},
                            std::tuple{block.x, block.y, block.z});
  }
  getcontext(&fresh);
  const unsigned blocks = grid.count(), threads = block.count();
  if (blocks == 0 || threads == 0 || threads > 1024 || grid.x > 0x7fffffffu || grid.y > 65535 ||
      grid.z > 65535) {
    SetError(9, std::string(kernel) + ": invalid launch configuration (grid " +
                    std::to_string(grid.x) + "x" + std::to_string(grid.y) + "x" +
                    std::to_string(grid.z) + ", block " + std::to_string(threads) + " threads)");
    return false;
  }
  static std::atomic<unsigned> launches{0};  // every launch runs in an order of its own
  std::mt19937 rng(launches++ * 7919u + blocks);
  std::vector<unsigned> order(blocks);
  std::iota(order.begin(), order.end(), 0u);
  std::shuffle(order.begin(), order.end(), rng);
  Block b;
  unsigned watched = 0;  // blocks run with the race check on
  b.kernel = kernel;
  b.body = &body;
  current_block = &b;
  for (unsigned linear : order) {
    b.threads.assign(threads, Thread{});
    for (unsigned i = 0; i < threads; ++i) {
      Thread& t = b.threads[i];
      t.id = static_cast<int>(i);
      t.here.thread = {i % block.x, i / block.x % block.y, i / (block.x * block.y)};
      t.here.block = {linear % grid.x, linear / grid.x % grid.y, linear / (grid.x * grid.y)};
      t.here.block_dim = block;
      t.here.grid_dim = grid;
    }
    // shared memory holds garbage when a block starts; the scheduler never touches it
    std::memset(__start_jgsess_simt_shared, 0xff, SharedEnd() - SharedBegin());
    const bool watch = kTrapShared && watched++ < kWatchedBlocks;
    if (watch) Protect(true);
    if (sigsetjmp(b.fault, 1) == 0) {
      RunBlock(b, rng);
    } else {
      b.running = -1;
      here = &kOutside;
    }
    if (watch) Protect(false);
    if (b.failed) break;
  }
  current_block = nullptr;
  if (b.failed) SetError(700, std::string(kernel) + ": " + b.message);
  return !b.failed;
}

std::vector<std::tuple<std::string, std::tuple<unsigned, unsigned, unsigned>,
                       std::tuple<unsigned, unsigned, unsigned>>>
Launches() {
  std::lock_guard<std::mutex> lock(launch_log_mutex);
  return std::exchange(launch_log, {});
}

void MarkLoaded(const void* kernel) {
  std::lock_guard<std::mutex> lock(loaded_mutex);
  loaded.insert({current_device, kernel});
}

size_t LoadedOn(int device) {
  std::lock_guard<std::mutex> lock(loaded_mutex);
  size_t count = 0;
  for (const auto& each : loaded) count += each.first == device;
  return count;
}

int DeviceCount() { return device_count; }

int CurrentDevice() { return current_device; }

bool SetCurrentDevice(int device) {
  if (device < 0 || device >= device_count) return false;
  current_device = device;
  return true;
}

void SetDevices(int count, int device) {
  std::lock_guard<std::mutex> lock(loaded_mutex);
  device_count = count;
  launch_device = device;
  loaded.clear();
  CudaDevicesInUse().store(~uint64_t{0});
}

const std::string& LastMessage() { return last_message; }

int TakeLastError() {
  const int error = last_error;
  last_error = 0;
  return error;
}

void SetError(int code, const std::string& message) {
  last_error = code;
  last_message = message;
}

}  // namespace jgsess::simt
