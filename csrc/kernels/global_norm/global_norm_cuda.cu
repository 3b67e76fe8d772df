// Global norm on CUDA: one block per chunk writes its partial sum (and whether it starts a
// tensor) into the workspace; one more block adds them up in order. No host synchronization.
#include <vector>

#include "common/ffi.h"
#include "common/multi_tensor_cuda.cuh"
#include "kernels/global_norm/global_norm.h"

namespace jgsess {
namespace {

constexpr int kMaxTensors = 256, kMaxBlocks = 320;

struct NormTable {
  const void* ptr[kMaxTensors];
  Elem type[kMaxTensors];
  int64_t size[kMaxTensors];
  int block_tensor[kMaxBlocks];
  int block_chunk[kMaxBlocks];
};

// workspace: partial[items], then starts[items] (1.0 where a chunk is its tensor's first)
__global__ void PartialSums(NormTable table, float* partial, float* starts, int64_t base) {
  __shared__ float warp_sums[kCudaBlock / 32];
  const int t = table.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(table.block_chunk[blockIdx.x]) * kNormChunk;
  const int64_t end = min(table.size[t], begin + kNormChunk);
  float sum = 0.0f;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float x = LoadF32(table.ptr[t], table.type[t], i);
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

__global__ void Finish(const float* partial, const float* starts, int64_t items, float* norm) {
  float total = 0.0f, sum = 0.0f;
  for (int64_t i = 0; i < items; ++i) {
    if (starts[i] != 0.0f && i > 0) {
      total = total + sum;
      sum = 0.0f;
    }
    sum = sum + partial[i];
  }
  *norm = sqrtf(items > 0 ? total + sum : 0.0f);
}

ffi::Error GlobalNormCudaImpl(cudaStream_t stream, Buffer arena, Args args,
                              ffi::Result<ffi::BufferR0<ffi::F32>> norm,
                              ffi::Result<Buffer> arena_out, int64_t workspace_offset) {
  int64_t items = 0;
  for (size_t t = 0; t < args.size(); ++t) {
    auto x = args.get<Buffer>(t);
    if (x.has_error()) return x.error();
    if (!IsKernelFloat(x->element_type())) return InvalidArgument("global_norm: unsupported dtype");
    items += NormItems(static_cast<int64_t>(x->element_count()));
  }
  if (workspace_offset + 2 * sizeof(float) * items > arena.size_bytes()) {
    return InvalidArgument("global_norm: the workspace does not fit the arena");
  }
  float* partial = reinterpret_cast<float*>(static_cast<char*>(arena_out->untyped_data()) +
                                            workspace_offset);
  float* starts = partial + items;
  NormTable table;
  int count = 0, blocks = 0;
  int64_t base = 0;
  auto launch = [&] {
    PartialSums<<<blocks, kCudaBlock, 0, stream>>>(table, partial, starts, base);
    base += blocks;
    blocks = 0;
  };
  for (size_t t = 0; t < args.size(); ++t) {
    auto x = args.get<Buffer>(t);
    const auto size = static_cast<int64_t>(x->element_count());
    if (size == 0) continue;
    if (count == kMaxTensors) {
      if (blocks > 0) launch();
      count = 0;
    }
    table.ptr[count] = x->untyped_data();
    table.type[count] = ElemOf(x->element_type());
    table.size[count] = size;
    for (int64_t c = 0; c < NormItems(size); ++c) {
      if (blocks == kMaxBlocks) {
        launch();
        // the tensor continues in the next launch, in slot 0
        table.ptr[0] = table.ptr[count];
        table.type[0] = table.type[count];
        table.size[0] = size;
        count = 0;
      }
      table.block_tensor[blocks] = count;
      table.block_chunk[blocks] = static_cast<int>(c);
      ++blocks;
    }
    ++count;
  }
  if (blocks > 0) launch();
  Finish<<<1, 1, 0, stream>>>(partial, starts, items, norm->typed_data());
  return CudaStatus("global_norm");
}

}  // namespace
}  // namespace jgsess

XLA_FFI_DEFINE_HANDLER_SYMBOL(GlobalNormCuda, jgsess::GlobalNormCudaImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<jgsess::Buffer>()                        // arena
                                  .RemainingArgs()                              // x per tensor
                                  .Ret<xla::ffi::BufferR0<xla::ffi::F32>>()  // the norm
                                  .Ret<jgsess::Buffer>()                        // arena (aliased)
                                  .Attr<int64_t>("workspace_offset"),
                              jgsess::kGraphSafe);
