// Multi-tensor cast on CUDA: one block per 64K-element chunk, one launch for many tensors.
#include "common/ffi.h"
#include "common/multi_tensor_cuda.cuh"
#include "kernels/cast_all/cast_all.h"

namespace jgsess {
namespace {

using CastTable = TensorTable<2>;  // x, y

__global__ void __launch_bounds__(kCudaBlock)
    CastAllKernel(const __grid_constant__ CastTable table) {
  const int t = table.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(table.block_chunk[blockIdx.x]) * kChunk;
  const int64_t end = min(table.size[t], begin + kChunk);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    StoreF32(table.ptr[1][t], table.type[1][t], i, LoadF32(table.ptr[0][t], table.type[0][t], i));
  }
}

ffi::Error CastAllCudaImpl(cudaStream_t stream, Args args, Rets rets) {
  auto tensors = ParseTensors<1, 1>("cast_all", args, 0, &rets);
  if (tensors.has_error()) return tensors.error();
  cudaError_t err = MultiTensorApply<1, 1>(*tensors, [&](const CastTable& t, int blocks) {
    JGSESS_LAUNCH(CastAllKernel, blocks, kCudaBlock, 0, stream)(t);
  });
  return CudaStatus("cast_all", err);
}

ffi::Error CastAllCudaLoadImpl() { return CudaStatus("cast_all", LoadKernels(CastAllKernel)); }

}  // namespace
}  // namespace jgsess

XLA_FFI_DEFINE_HANDLER_SYMBOL(CastAllCudaLoad, jgsess::Load<jgsess::CastAllCudaLoadImpl>,
                              jgsess::LoadBinding());

XLA_FFI_DEFINE_HANDLER_SYMBOL(CastAllCuda, jgsess::CastAllCudaImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .RemainingArgs()   // x per tensor
                                  .RemainingRets(),  // y per tensor
                              jgsess::kGraphSafe);
