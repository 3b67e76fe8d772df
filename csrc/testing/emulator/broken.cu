// Deliberately broken kernels, one per check of the SIMT emulator (see broken.h). The correct
// one computes, for each i < n in blocks of kThreads:
//   y[i] = x[i] + x[block's next, cyclically] + x[i + 1 within the warp, else x[i]]
//          + (1 if the warp's first element is positive)
// through shared memory, a barrier, a shuffle and a ballot; each broken one differs from it in
// a line or two.
#include "common/ffi.h"
#include "common/multi_tensor_cuda.cuh"
#include "testing/emulator/broken.h"

namespace jgsess {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kAll = 0xffffffffu;

enum class Break {
  kUnloaded,
  kNone,
  kReadPastEnd,
  kWriteBeforeStart,
  kSharedRace,
  kBarrier,
  kShuffle,
  kShuffleOutsideMask,
  kMisaligned,
  kBallot,
  kUnwritten,
  kOperandWritten
};

// One kernel, the break a runtime argument: GCC drops the section attribute that places
// __shared__ variables for the race check from static locals of function templates.
__global__ void Neighbors(const float* x, float* y, int64_t n, Break kind) {
  __shared__ float tile[kThreads];
  const int t = threadIdx.x;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + t;
  if (kind == Break::kBarrier && i >= n) return;  // lanes past the end skip the barrier
  float v = i < n ? x[i] : 0.0f;
  if (kind == Break::kReadPastEnd && i < n) v = x[i + 1] * 0.0f + v;
  tile[t] = v;
  if (kind != Break::kSharedRace) __syncthreads();
  const float next = tile[(t + 1) % kThreads];
  if (kind == Break::kShuffle && i >= n) return;  // lanes past the end skip the shuffle
  float down;
  if (kind == Break::kShuffleOutsideMask && t % 32 < 16) {
    down = __shfl_down_sync(0xffffu, v, 1);  // lane 15 reads lane 16, which the mask leaves out
  } else if (kind == Break::kShuffleOutsideMask) {
    down = __shfl_down_sync(0xffff0000u, v, 1);
  } else {
    down = __shfl_down_sync(kAll, v, 1);
  }
  if (kind == Break::kMisaligned && i == 0) {  // a vector load 4 bytes past a 16-byte boundary
    float vector[kVec];
    LoadVec(x + 1, vector);
    v = v + 0.0f * vector[0];
  }
  if (kind == Break::kBallot && i >= n) return;  // or the ballot
  const unsigned bits = __ballot_sync(kAll, v > 0.0f);
  if (i >= n) return;
  if (kind == Break::kUnwritten && i % 2 == 1) return;
  if (kind == Break::kWriteBeforeStart && i == 0) y[-1] = 0.0f;
  if (kind == Break::kOperandWritten) const_cast<float*>(x)[i] = 0.0f;
  y[i] = v + next + down + static_cast<float>(bits & 1u);
}

// A copy of the correct kernel that no instantiate stage loads.
__global__ void Unloaded(const float* x, float* y, int64_t n, Break kind) {
  Neighbors(x, y, n, kind);
}

template <Break kBreak>
ffi::Error Run(cudaStream_t stream, ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (n > 0 && kBreak == Break::kUnloaded) {
    JGSESS_LAUNCH(Unloaded, (n + kThreads - 1) / kThreads, kThreads, 0, stream)(
        x.typed_data(), y->typed_data(), n, kBreak);
  } else if (n > 0) {
    JGSESS_LAUNCH(Neighbors, (n + kThreads - 1) / kThreads, kThreads, 0, stream)(
        x.typed_data(), y->typed_data(), n, kBreak);
  }
  return CudaStatus("neighbors");
}

template <Break kBreak>
constexpr auto Binding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<cudaStream_t>>()
      .Arg<ffi::Buffer<ffi::F32>>()
      .Ret<ffi::Buffer<ffi::F32>>();
}

ffi::Error LoadNeighbors() { return CudaStatus("neighbors", LoadKernels(Neighbors)); }

ffi::Error LoadNeighborsOnTheCurrentDevice() {
  cudaFuncAttributes attributes;
  return CudaStatus("neighbors",
                    cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(Neighbors)));
}

}  // namespace
}  // namespace jgsess

XLA_FFI_DEFINE_HANDLER_SYMBOL(BrokenLoad, jgsess::Load<jgsess::LoadNeighbors>,
                              jgsess::LoadBinding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(BrokenLoadCurrentDevice,
                              jgsess::Load<jgsess::LoadNeighborsOnTheCurrentDevice>,
                              jgsess::LoadBinding());

#define JGSESS_BROKEN(name, kind) \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, jgsess::Run<kind>, jgsess::Binding<kind>())

JGSESS_BROKEN(BrokenNone, jgsess::Break::kNone);
JGSESS_BROKEN(BrokenReadPastEnd, jgsess::Break::kReadPastEnd);
JGSESS_BROKEN(BrokenWriteBeforeStart, jgsess::Break::kWriteBeforeStart);
JGSESS_BROKEN(BrokenSharedRace, jgsess::Break::kSharedRace);
JGSESS_BROKEN(BrokenBarrier, jgsess::Break::kBarrier);
JGSESS_BROKEN(BrokenShuffle, jgsess::Break::kShuffle);
JGSESS_BROKEN(BrokenShuffleOutsideMask, jgsess::Break::kShuffleOutsideMask);
JGSESS_BROKEN(BrokenMisaligned, jgsess::Break::kMisaligned);
JGSESS_BROKEN(BrokenBallot, jgsess::Break::kBallot);
JGSESS_BROKEN(BrokenUnwritten, jgsess::Break::kUnwritten);
JGSESS_BROKEN(BrokenOperandWritten, jgsess::Break::kOperandWritten);
JGSESS_BROKEN(BrokenUnloaded, jgsess::Break::kUnloaded);
