// Global norm on CUDA: one block per chunk writes its partial sum (and whether it starts a
// tensor) into the workspace, launched by the shared multi-tensor launcher; one more block adds
// them up: each thread the tensors starting in its share of the chunks (a tensor's partials in
// chunk order, the tensors in order), then the threads' sums in a fixed tree. No host
// synchronization; the result does not depend on scheduling.
#include "common/ffi.h"
#include "common/multi_tensor_cuda.cuh"
#include "kernels/global_norm/global_norm.h"

namespace jgsess {
namespace {

using NormTable = TensorTable<1>;  // x

// workspace: partial[items], then starts[items] (1.0 where a chunk is its tensor's first);
// `base` is the number of chunks earlier launches covered
__global__ void __launch_bounds__(kCudaBlock)
    PartialSums(const __grid_constant__ NormTable table, float* partial, float* starts,
                int64_t base) {
  __shared__ float warp_sums[kCudaBlock / 32];
  const int t = table.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(table.block_chunk[blockIdx.x]) * kChunk;
  const int64_t end = min(table.size[t], begin + kChunk);
  float sum = 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float x = LoadF32(table.ptr[0][t], table.type[0][t], i);
    sum += x * x;
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float block = 0.0f;
    for (int w = 0; w < kCudaBlock / 32; ++w) block += warp_sums[w];
    partial[base + blockIdx.x] = block;
    starts[base + blockIdx.x] = table.block_chunk[blockIdx.x] == 0 ? 1.0f : 0.0f;
  }
}

constexpr int kFinishThreads = 256;

__global__ void __launch_bounds__(kFinishThreads)
    Finish(const float* partial, const float* starts, int64_t items, float* norm) {
  __shared__ float sums[kFinishThreads];
  const int64_t per = (items + kFinishThreads - 1) / kFinishThreads;
  const int64_t first = threadIdx.x * per, last = min(items, first + per);
  float total = 0.0f;
  for (int64_t i = first; i < last; ++i) {
    if (i > 0 && starts[i] == 0.0f) continue;  // its tensor started in an earlier share
    float sum = partial[i];
    for (int64_t j = i + 1; j < items && starts[j] == 0.0f; ++j) sum = sum + partial[j];
    total = total + sum;
  }
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
  auto call = ParseNorm(arena, args, *arena_out, workspace_offset, 2 * sizeof(float));
  if (call.has_error()) return call.error();
  // arena and arena_out are one buffer when aliased (always, in a planned program)
  if (arena.untyped_data() != arena_out->untyped_data()) {
    cudaError_t err = cudaMemcpyAsync(arena_out->untyped_data(), arena.untyped_data(),
                                      arena.size_bytes(), cudaMemcpyDeviceToDevice, stream);
    if (err != cudaSuccess) return CudaStatus("global_norm", err);
  }
  float* partial = reinterpret_cast<float*>(call->workspace);
  float* starts = partial + call->items;
  int64_t base = 0;
  cudaError_t err = MultiTensorApply<1, 0>(call->tensors, [&](const NormTable& table, int blocks) {
    JGSESS_LAUNCH(PartialSums, blocks, kCudaBlock, 0, stream)(table, partial, starts, base);
    base += blocks;
  });
  if (err != cudaSuccess) return CudaStatus("global_norm", err);
  JGSESS_LAUNCH(Finish, 1, kFinishThreads, 0, stream)(partial, starts, call->items,
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
