// Global norm on CUDA: each block (kParts per chunk) writes its partial sum into the workspace,
// launched by the shared multi-tensor launcher; one more block adds them up in a fixed order.
// No host synchronization; the result does not depend on scheduling.
#include "common/ffi.h"
#include "common/multi_tensor_cuda.cuh"
#include "kernels/global_norm/global_norm.h"

namespace jgsess {
namespace {

using NormTable = TensorTable<1>;  // x

// The sum of the squares of this thread's elements of the block's part (an instance per type).
template <typename X>
__device__ float SumOfSquares(const NormTable& table, const Part& part) {
  float sum = 0.0f;
  PartLoop<Types<X>, Types<>>::Run(
      table, part, [&sum](const float (&x)[1], float (&)[1]) { sum += x[0] * x[0]; });
  return sum;
}

// workspace: one partial sum per block; `base` is the number of table entries (chunks) earlier
// launches covered
__global__ void __launch_bounds__(kCudaBlock)
    PartialSums(const __grid_constant__ NormTable table, float* partial, int64_t base) {
  __shared__ float warp_sums[kCudaBlock / 32];
  const Part part = BlockPart(table);
  float sum;
  switch (table.type[0][part.tensor]) {
    case Elem::kBF16: sum = SumOfSquares<BF16>(table, part); break;
    case Elem::kF16: sum = SumOfSquares<F16>(table, part); break;
    default: sum = SumOfSquares<F32>(table, part);
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float block = 0.0f;
    for (int w = 0; w < kCudaBlock / 32; ++w) block += warp_sums[w];
    partial[base * kParts + blockIdx.x] = block;
  }
}

constexpr int kFinishThreads = 512;

// The `count` partials added in a fixed order: thread k those at k, k + kFinishThreads, ...
// (independent loads, a few dependent adds each), then the threads' sums in a tree.
__global__ void __launch_bounds__(kFinishThreads)
    Finish(const float* partial, int64_t count, float* norm) {
  __shared__ float sums[kFinishThreads];
  float total = 0.0f;
  for (int64_t i = threadIdx.x; i < count; i += kFinishThreads) total = total + partial[i];
  sums[threadIdx.x] = total;
  __syncthreads();
  for (int half = kFinishThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) sums[threadIdx.x] = sums[threadIdx.x] + sums[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) *norm = sqrtf(sums[0]);
}

ffi::Error GlobalNormCudaImpl(cudaStream_t stream, Buffer arena, Args args,
                              ffi::Result<ffi::BufferR0<ffi::F32>> norm,
                              ffi::Result<Buffer> arena_out, int64_t workspace_offset) {
  auto call = ParseNorm(arena, args, *arena_out, workspace_offset, kParts * sizeof(float));
  if (call.has_error()) return call.error();
  // arena and arena_out are one buffer when aliased (always, in a planned program)
  if (arena.untyped_data() != arena_out->untyped_data()) {
    cudaError_t err = cudaMemcpyAsync(arena_out->untyped_data(), arena.untyped_data(),
                                      arena.size_bytes(), cudaMemcpyDeviceToDevice, stream);
    if (err != cudaSuccess) return CudaStatus("global_norm", err);
  }
  float* partial = reinterpret_cast<float*>(call->workspace);
  int64_t base = 0;
  cudaError_t err = MultiTensorApply<1, 0>(call->tensors, [&](const NormTable& table, int blocks) {
    JGSESS_LAUNCH(PartialSums, blocks * kParts, kCudaBlock, 0, stream)(table, partial, base);
    base += blocks;
  });
  if (err != cudaSuccess) return CudaStatus("global_norm", err);
  JGSESS_LAUNCH(Finish, 1, kFinishThreads, 0, stream)(partial, call->items * kParts,
                                                      norm->typed_data());
  return CudaStatus("global_norm");
}

ffi::Error GlobalNormCudaLoadImpl() {
  return CudaStatus("global_norm", LoadKernels(PartialSums, Finish));
}

}  // namespace
}  // namespace jgsess

XLA_FFI_DEFINE_HANDLER_SYMBOL(GlobalNormCudaLoad, jgsess::Load<jgsess::GlobalNormCudaLoadImpl>,
                              jgsess::LoadBinding());

XLA_FFI_DEFINE_HANDLER_SYMBOL(GlobalNormCuda, jgsess::GlobalNormCudaImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<jgsess::Buffer>()                     // arena
                                  .RemainingArgs()                           // x per tensor
                                  .Ret<xla::ffi::BufferR0<xla::ffi::F32>>()  // the norm
                                  .Ret<jgsess::Buffer>()                     // arena (aliased)
                                  .Attr<int64_t>("workspace_offset"),
                              jgsess::kGraphSafe);
