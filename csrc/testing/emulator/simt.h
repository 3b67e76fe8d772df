// A SIMT emulator for jgsess's CUDA sources, for tests on machines without a GPU.
//
// The .cu files compile unchanged as C++ against this header (force-included, with the shims in
// csrc/testing/emulator/cuda/ standing in for <cuda_runtime.h>, <cuda_bf16.h> and <cuda_fp16.h>);
// their launches go through JGSESS_LAUNCH (common/launch.cuh), which here runs the grid on the
// host:
//
//   grid    blocks one after another, in a shuffled order (a kernel may not depend on it)
//   block   one fiber per thread (ucontext), interleaved at every barrier and warp operation;
//           between two of them, threads run in a shuffled order
//   warp    32 consecutive threads; __shfl_down_sync and __ballot_sync wait for every lane their
//           mask names, then exchange values
//
// What it checks, as compute-sanitizer would (each failure is the launch's error, which
// cudaGetLastError returns, with a message naming the kernel, block and thread):
//
//   global memory   reads and writes outside every buffer: the FFI wrapper (guard.cc) gives the
//                   handler guarded copies, followed by an inaccessible page (the fault is caught)
//                   and surrounded by canary bytes (checked after the call)
//   shared memory   a location written by one thread and read or written by another between
//                   the same two barriers (every access traps: the shared section is protected
//                   and each access single-stepped; x86-64 Linux) in the first 16 blocks a
//                   launch runs (its order is shuffled). Shared memory starts poisoned.
//                   GCC drops the section attribute __shared__ expands to from static locals of
//                   function templates: a kernel with __shared__ variables must not be a template
//   barriers        a __syncthreads that not every thread of the block reaches
//   warp ops        a mask naming a lane that has exited, lanes of a mask that never meet, or
//                   a shuffle reading a lane of the warp its mask does not name
//   alignment       a 16-byte vector access at an address that is not a multiple of 16
//                   (JGSESS_CHECK_ALIGNED, common/launch.cuh)
//   loading         a kernel launched before its handler's instantiate stage loaded its code
//                   (its first launch might be inside a CUDA graph capture, where loading fails)
//   results         result bytes the handler never wrote (guard.cc poisons results before the
//                   call; operands it may not write are compared after it)
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace jgsess::simt {

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  constexpr unsigned count() const { return x * y * z; }
};

struct Stream {};

// The indices of the running thread (valid inside a kernel).
struct Here {
  uint3 thread, block;
  dim3 block_dim, grid_dim;
};
extern thread_local const Here* here;  // set by the scheduler before it resumes a thread
inline const Here& Current() { return *here; }

// Barriers and warp operations: the running thread yields until its partners arrive.
void SyncThreads();
// (the value of lane `lane + delta` of the warp, or this lane's own past the warp's end)
uint64_t WarpShuffleDown(uint32_t mask, uint64_t value, unsigned delta);
uint32_t WarpBallot(uint32_t mask, bool predicate);
// A vector access of `bytes` at `address`: on a GPU it faults unless the address is a multiple
// of `bytes` (x86 forgives it); the launch fails, naming the address and the thread.
void CheckAligned(const void* address, size_t bytes);

// Runs body() on every thread of the grid of `kernel` (its function, which must have been
// loaded: MarkLoaded); false (and LastMessage()) on a checked failure.
bool RunGrid(const void* kernel, const char* name, dim3 grid, dim3 block,
             const std::function<void()>& body);
// cudaFuncGetAttributes loaded `kernel`'s code into the current device's context
// (csrc/common/multi_tensor_cuda.cuh: LoadKernels); a launch checks it was, on its device.
void MarkLoaded(const void* kernel);
size_t LoadedOn(int device);  // kernels loaded into `device`'s context
// The emulated devices, each with a context of its own: their count (1 unless a test sets
// more), the calling thread's current device (cudaSetDevice), and the device launches run on:
// the current one, or the one a test names (XLA runs a program's thunks on threads of its own,
// whichever device they serve). SetDevices(count, launch_device -1) also forgets what was loaded.
int DeviceCount();
int CurrentDevice();
bool SetCurrentDevice(int device);
void SetDevices(int count, int launch_device);
const std::string& LastMessage();
// What a faulting address is, for the message (guard.cc: "4 bytes past the end of operand 0").
std::string DescribeAddress(uintptr_t address);
int TakeLastError();  // 0 or the failed launch's code (cleared)
// (kernel, grid, block) of every launch since the last call (for tests of launch shapes).
std::vector<std::tuple<std::string, std::tuple<unsigned, unsigned, unsigned>,
                       std::tuple<unsigned, unsigned, unsigned>>>
Launches();
void SetError(int code, const std::string& message);

// The emulated launch: JGSESS_LAUNCH(kernel, grid, block, shared, stream)(args...).
template <typename... P>
struct Launch {
  void (*kernel)(P...);
  const char* name;
  dim3 grid, block;
  template <typename... A>
  void operator()(A&&... args) const {
    std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
    const auto fn = kernel;
    RunGrid(reinterpret_cast<const void*>(fn), name, grid, block, [&] { std::apply(fn, params); });
  }
};

template <typename... P>
Launch<P...> MakeLaunch(void (*kernel)(P...), const char* name, dim3 grid, dim3 block, size_t,
                        Stream*) {
  return Launch<P...>{kernel, name, grid, block};
}

// Shuffle of any 4- or 8-byte value, as the hardware moves bits.
template <typename T>
T ShuffleDown(uint32_t mask, T value, unsigned delta) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>);
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = WarpShuffleDown(mask, bits, delta);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

}  // namespace jgsess::simt

// ---- the CUDA names the sources use ----

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __grid_constant__
#define __launch_bounds__(...)
#define __shared__ __attribute__((section("jgsess_simt_shared"), aligned(64))) static

using jgsess::simt::dim3;
using jgsess::simt::uint3;

#define threadIdx (::jgsess::simt::Current().thread)
#define blockIdx (::jgsess::simt::Current().block)
#define blockDim (::jgsess::simt::Current().block_dim)
#define gridDim (::jgsess::simt::Current().grid_dim)

inline void __syncthreads() { ::jgsess::simt::SyncThreads(); }

template <typename T>
inline T __shfl_down_sync(unsigned mask, T value, unsigned delta) {
  return ::jgsess::simt::ShuffleDown(mask, value, delta);
}

inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return ::jgsess::simt::WarpBallot(mask, predicate != 0);
}

// CUDA's device overloads of min and max for integer and float operands.
template <typename T>
inline T min(T a, T b) {
  return b < a ? b : a;
}
template <typename T>
inline T max(T a, T b) {
  return a < b ? b : a;
}

struct uint4 {
  unsigned x, y, z, w;
};

struct double2 {
  double x, y;
};
