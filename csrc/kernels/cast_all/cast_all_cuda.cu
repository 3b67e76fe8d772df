// Multi-tensor cast on CUDA: kParts blocks per 64K-element chunk, one launch for many tensors.
#include "common/ffi.h"
#include "common/multi_tensor_cuda.cuh"
#include "kernels/cast_all/cast_all.h"

namespace jgsess {
namespace {

using CastTable = TensorTable<2>;  // x, y

template <typename X>
__device__ void CastFrom(const CastTable& table, const Part& part) {
  const auto copy = [](const float (&x)[1], float (&y)[1]) { y[0] = x[0]; };
  switch (table.type[1][part.tensor]) {
    case Elem::kBF16: PartLoop<Types<X>, Types<BF16>>::Run(table, part, copy); break;
    case Elem::kF16: PartLoop<Types<X>, Types<F16>>::Run(table, part, copy); break;
    default: PartLoop<Types<X>, Types<F32>>::Run(table, part, copy);
  }
}

// An instance per pair of types (f32, bf16, f16), chosen once per block.
__global__ void __launch_bounds__(kCudaBlock)
    CastAllKernel(const __grid_constant__ CastTable table) {
  const Part part = BlockPart(table);
  if (part.count == 0) return;
  switch (table.type[0][part.tensor]) {
    case Elem::kBF16: CastFrom<BF16>(table, part); break;
    case Elem::kF16: CastFrom<F16>(table, part); break;
    default: CastFrom<F32>(table, part);
  }
}

ffi::Error CastAllCudaImpl(cudaStream_t stream, Args args, Rets rets) {
  auto tensors = ParseTensors<1, 1>("cast_all", args, 0, &rets);
  if (tensors.has_error()) return tensors.error();
  cudaError_t err = MultiTensorApply<1, 1>(*tensors, [&](const CastTable& t, int blocks) {
    JGSESS_LAUNCH(CastAllKernel, blocks * kParts, kCudaBlock, 0, stream)(t);
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
