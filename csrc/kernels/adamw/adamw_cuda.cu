// Multi-tensor Adam / AdamW on CUDA: kParts blocks per 64K-element chunk, hyper-parameters read
// from device memory inside the kernel (no host synchronization; CUDA-graph safe).
#include "common/ffi.h"
#include "common/multi_tensor_cuda.cuh"
#include "kernels/adamw/adamw.h"

namespace jgsess {
namespace {

using AdamwTable = TensorTable<7>;  // p, g, m, v, p', m', v'

// An instance per type tuple: parameters and gradients of one type P with moments of type S;
// under mixed math its one tuple (adamw.h: CheckMixed). Other tuples read their types per element.
template <typename P, typename S, typename PNew = P>
using AdamwLoop = PartLoop<Types<P, P, S, S>, Types<PNew, S, S>>;

// The table (up to ~9 KB) stays in the kernel's parameter space: read in place, never copied
// into each thread's local memory (tests/test_cuda_build.py reads ptxas' resource usage).
template <int64_t kFlags>
__global__ void __launch_bounds__(kCudaBlock)
    AdamwKernel(const __grid_constant__ AdamwTable table, HyperPtrs<AdamwHyper> hyper) {
  const Part part = BlockPart(table);
  if (part.count == 0) return;
  const AdamwHyper h = LoadHyper(hyper);
  const AdamwReciprocals r = Reciprocals(h);
  const auto update = [&](auto q) {  // the element math, each operation rounded by q
    return [&h, &r, q](const float (&in)[4], float (&out)[3]) {
      AdamwElement<kFlags>(h, r, in[0], in[1], in[2], in[3], &out[0], &out[1], &out[2], q);
    };
  };
  const int t = part.tensor;
  if constexpr (Has(kFlags, AdamwFlag::kNarrowMath)) {
    if (table.type[0][t] == Elem::kBF16) {
      AdamwLoop<BF16, BF16>::Run(table, part, update(InBf16{}));
    } else {
      AdamwLoop<F16, F16>::Run(table, part, update(InF16{}));
    }
  } else if constexpr (Has(kFlags, AdamwFlag::kMixed)) {
    using PNew = std::conditional_t<Has(kFlags, AdamwFlag::kUpdate), F32, BF16>;
    PartLoop<Types<BF16, BF16, F32, BF16>, Types<PNew, F32, BF16>>::Run(table, part,
                                                                        update(InBf16{}));
  } else if (HasTypes(table, t, 0, Types<F32, F32, F32, F32, F32, F32, F32>{})) {
    AdamwLoop<F32, F32>::Run(table, part, update(InF32{}));
  } else if (HasTypes(table, t, 0, Types<BF16, BF16, F32, F32, BF16, F32, F32>{})) {
    AdamwLoop<BF16, F32>::Run(table, part, update(InF32{}));
  } else {
    AnyTypesPartLoop<4, 3>(table, part, update(InF32{}));
  }
}

ffi::Error AdamwCudaImpl(cudaStream_t stream, Args args, Rets rets, int64_t flags) {
  return DispatchOptimizer<AdamwFamily>(
      args, rets, flags, [&]<int64_t kFlags>(const auto& member, const auto& part) {
        return LaunchTables<AdamwFamily>(part, [&](const AdamwTable& table, int blocks) {
          JGSESS_LAUNCH(AdamwKernel<kFlags>, blocks * kParts, kCudaBlock, 0, stream)(table, member);
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
