// Multi-tensor Adam / AdamW on CUDA: one block per 64K-element chunk, hyper-parameters read
// from device memory inside the kernel (no host synchronization; CUDA-graph safe).
#include "common/ffi.h"
#include "common/multi_tensor_cuda.cuh"
#include "kernels/adamw/adamw.h"

namespace jgsess {
namespace {

using AdamwTable = TensorTable<7>;  // p, g, m, v, p', m', v'

// Elements [begin, end) of tensor t, each operation rounded by q.
template <int64_t kFlags, typename Q>
__device__ void AdamwChunk(const AdamwTable& table, const AdamwHyper& h, const AdamwReciprocals& r,
                           int t, int64_t begin, int64_t end, Q q) {
  const Elem p_type = table.type[0][t], g_type = table.type[1][t], out_type = table.type[4][t];
  const Elem m_type = table.type[2][t], v_type = table.type[3][t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float p_new, m_new, v_new;
    AdamwElement<kFlags>(h, r, LoadF32(table.ptr[0][t], p_type, i),
                         LoadF32(table.ptr[1][t], g_type, i), LoadF32(table.ptr[2][t], m_type, i),
                         LoadF32(table.ptr[3][t], v_type, i), &p_new, &m_new, &v_new, q);
    StoreF32(table.ptr[4][t], out_type, i, p_new);
    StoreF32(table.ptr[5][t], table.type[5][t], i, m_new);
    StoreF32(table.ptr[6][t], table.type[6][t], i, v_new);
  }
}

// The table (up to ~9 KB) stays in the kernel's parameter space: read in place, never copied
// into each thread's local memory (tests/test_cuda_build.py reads ptxas' resource usage).
template <int64_t kFlags>
__global__ void __launch_bounds__(kCudaBlock)
    AdamwKernel(const __grid_constant__ AdamwTable table, HyperPtrs<AdamwHyper> hyper) {
  const AdamwHyper h = LoadHyper(hyper);
  const AdamwReciprocals r = Reciprocals(h);
  const int t = table.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(table.block_chunk[blockIdx.x]) * kChunk;
  const int64_t end = min(table.size[t], begin + kChunk);
  WithRounding<Has(kFlags, AdamwFlag::kNarrowMath) || Has(kFlags, AdamwFlag::kMixed)>(
      table.type[0][t], [&](auto q) { AdamwChunk<kFlags>(table, h, r, t, begin, end, q); });
}

ffi::Error AdamwCudaImpl(cudaStream_t stream, Args args, Rets rets, int64_t flags) {
  return DispatchOptimizer<AdamwFamily>(
      args, rets, flags, [&]<int64_t kFlags>(const auto& member, const auto& part) {
        return LaunchTables<AdamwFamily>(part, [&](const AdamwTable& table, int blocks) {
          JGSESS_LAUNCH(AdamwKernel<kFlags>, blocks, kCudaBlock, 0, stream)(table, member);
        });
      });
}

ffi::Error AdamwCudaLoadImpl() {
  cudaError_t err = cudaSuccess;
  ForEachFlags<AdamwFamily::kForms, AdamwFamily::Valid>([&]<int64_t kFlags>() {
    if (err == cudaSuccess) err = LoadKernels(AdamwKernel<kFlags>);
  });
  return CudaStatus("adamw", err);
}

}  // namespace
}  // namespace jgsess

XLA_FFI_DEFINE_HANDLER_SYMBOL(AdamwCudaLoad, jgsess::Load<jgsess::AdamwCudaLoadImpl>,
                              jgsess::LoadBinding());

XLA_FFI_DEFINE_HANDLER_SYMBOL(AdamwCuda, jgsess::AdamwCudaImpl,
                              jgsess::MultiTensorBinding<xla::ffi::PlatformStream<cudaStream_t>>(),
                              jgsess::kGraphSafe);
