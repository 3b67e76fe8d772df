// Multi-tensor SGD with momentum on CUDA: kParts blocks per 64K-element chunk; CUDA-graph safe.
#include "common/ffi.h"
#include "common/multi_tensor_cuda.cuh"
#include "kernels/momentum/momentum.h"

namespace jgsess {
namespace {

using MomentumTable = TensorTable<5>;  // p, g, acc, p', acc'

// An instance per type tuple: parameters and gradients of one type P with an accumulator of type
// S. Other tuples read their types per element.
template <typename P, typename S>
using MomentumLoop = PartLoop<Types<P, P, S>, Types<P, S>>;

template <int64_t kFlags>
__global__ void __launch_bounds__(kCudaBlock)
    MomentumKernel(const __grid_constant__ MomentumTable table, HyperPtrs<MomentumHyper> hyper) {
  const Part part = BlockPart(table);
  if (part.count == 0) return;
  const MomentumHyper h = LoadHyper(hyper);
  const auto update = [&](auto q) {  // the element math, each operation rounded by q
    return [&h, q](const float (&in)[3], float (&out)[2]) {
      MomentumElement<kFlags>(h, in[0], in[1], in[2], &out[0], &out[1], q);
    };
  };
  const int t = part.tensor;
  if constexpr (Has(kFlags, MomentumFlag::kNarrowMath)) {
    if (table.type[0][t] == Elem::kBF16) {
      MomentumLoop<BF16, BF16>::Run(table, part, update(InBf16{}));
    } else {
      MomentumLoop<F16, F16>::Run(table, part, update(InF16{}));
    }
  } else if (HasTypes(table, t, 0, Types<F32, F32, F32, F32, F32>{})) {
    MomentumLoop<F32, F32>::Run(table, part, update(InF32{}));
  } else if (HasTypes(table, t, 0, Types<BF16, BF16, F32, BF16, F32>{})) {
    MomentumLoop<BF16, F32>::Run(table, part, update(InF32{}));
  } else {
    AnyTypesPartLoop<3, 2>(table, part, update(InF32{}));
  }
}

ffi::Error MomentumCudaImpl(cudaStream_t stream, Args args, Rets rets, int64_t flags) {
  return DispatchOptimizer<MomentumFamily>(
      args, rets, flags, [&]<int64_t kFlags>(const auto& member, const auto& part) {
        return LaunchTables<MomentumFamily>(part, [&](const MomentumTable& table, int blocks) {
          JGSESS_LAUNCH(MomentumKernel<kFlags>, blocks * kParts, kCudaBlock, 0, stream)(table,
                                                                                        member);
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
