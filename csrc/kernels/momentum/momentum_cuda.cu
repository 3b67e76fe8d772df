// Multi-tensor SGD with momentum on CUDA: one block per 64K-element chunk; CUDA-graph safe.
#include "common/ffi.h"
#include "common/multi_tensor_cuda.cuh"
#include "kernels/momentum/momentum.h"

namespace jgsess {
namespace {

using MomentumTable = TensorTable<5>;  // p, g, acc, p', acc'

// Elements [begin, end) of tensor t, each operation rounded by q.
template <int64_t kFlags, typename Q>
__device__ void MomentumChunk(const MomentumTable& table, const MomentumHyper& h, int t,
                              int64_t begin, int64_t end, Q q) {
  const Elem p_type = table.type[0][t], g_type = table.type[1][t], out_type = table.type[3][t];
  const Elem acc_type = table.type[2][t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float p_new, acc_new;
    MomentumElement<kFlags>(h, LoadF32(table.ptr[0][t], p_type, i),
                            LoadF32(table.ptr[1][t], g_type, i),
                            LoadF32(table.ptr[2][t], acc_type, i), &p_new, &acc_new, q);
    StoreF32(table.ptr[3][t], out_type, i, p_new);
    StoreF32(table.ptr[4][t], table.type[4][t], i, acc_new);
  }
}

template <int64_t kFlags>
__global__ void __launch_bounds__(kCudaBlock)
    MomentumKernel(const __grid_constant__ MomentumTable table, HyperPtrs<MomentumHyper> hyper) {
  const MomentumHyper h = LoadHyper(hyper);
  const int t = table.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(table.block_chunk[blockIdx.x]) * kChunk;
  const int64_t end = min(table.size[t], begin + kChunk);
  WithRounding<Has(kFlags, MomentumFlag::kNarrowMath)>(
      table.type[0][t], [&](auto q) { MomentumChunk<kFlags>(table, h, t, begin, end, q); });
}

ffi::Error MomentumCudaImpl(cudaStream_t stream, Args args, Rets rets, int64_t flags) {
  return DispatchOptimizer<MomentumFamily>(
      args, rets, flags, [&]<int64_t kFlags>(const auto& member, const auto& part) {
        return LaunchTables<MomentumFamily>(part, [&](const MomentumTable& table, int blocks) {
          JGSESS_LAUNCH(MomentumKernel<kFlags>, blocks, kCudaBlock, 0, stream)(table, member);
        });
      });
}

ffi::Error MomentumCudaLoadImpl() {
  cudaError_t err = cudaSuccess;
  ForEachFlags<MomentumFamily::kForms, MomentumFamily::Valid>([&]<int64_t kFlags>() {
    if (err == cudaSuccess) err = LoadKernels(MomentumKernel<kFlags>);
  });
  return CudaStatus("momentum", err);
}

}  // namespace
}  // namespace jgsess

XLA_FFI_DEFINE_HANDLER_SYMBOL(MomentumCudaLoad, jgsess::Load<jgsess::MomentumCudaLoadImpl>,
                              jgsess::LoadBinding());

XLA_FFI_DEFINE_HANDLER_SYMBOL(MomentumCuda, jgsess::MomentumCudaImpl,
                              jgsess::MultiTensorBinding<xla::ffi::PlatformStream<cudaStream_t>>(),
                              jgsess::kGraphSafe);
