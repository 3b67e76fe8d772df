// ReLU with a bit mask on CUDA: one thread per element, one warp per mask word (ballot).
#include "common/ffi.h"
#include "common/multi_tensor_cuda.cuh"
#include "kernels/relu_mask/relu_mask.h"

namespace jgsess {
namespace {

constexpr int kThreads = 256;  // a multiple of 32: lane = i % 32 inside a warp

__global__ void __launch_bounds__(kThreads)
    ReluMaskKernel(const void* a, const void* b, Elem type, int64_t n, void* y, uint32_t* mask) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float s = 0.0f;
  if (i < n) {
    s = LoadF32(a, type, i);
    if (b != nullptr) s = s + LoadF32(b, type, i);
    StoreF32(y, type, i, ReluValue(s));
  }
  const unsigned bits = __ballot_sync(0xffffffffu, i < n && s > 0.0f);
  if (threadIdx.x % 32 == 0 && i < n) mask[i / 32] = bits;
}

__global__ void __launch_bounds__(kThreads)
    ReluMaskGradKernel(const uint32_t* mask, const void* a, const void* b, Elem type, int64_t n,
                       void* dx) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g = LoadF32(a, type, i);
  if (b != nullptr) g = g + LoadF32(b, type, i);
  StoreF32(dx, type, i, (mask[i / 32] >> (i % 32)) & 1u ? g : 0.0f);
}

ffi::Error ReluMaskCudaImpl(cudaStream_t stream, Args args, ffi::Result<Buffer> y,
                            ffi::Result<ffi::Buffer<ffi::U32>> mask) {
  auto ops = ParseRelu("relu_mask", args, 0, *y, static_cast<int64_t>(mask->element_count()));
  if (ops.has_error()) return ops.error();
  const int64_t n = ops->size;
  if (n > 0) {
    const int64_t blocks = (n + kThreads - 1) / kThreads;
    JGSESS_LAUNCH(ReluMaskKernel, blocks, kThreads, 0, stream)(
        ops->data[0], ops->data[1], ElemOf(ops->type), n, y->untyped_data(), mask->typed_data());
  }
  return CudaStatus("relu_mask");
}

ffi::Error ReluMaskGradCudaImpl(cudaStream_t stream, ffi::Buffer<ffi::U32> mask, Args args,
                                ffi::Result<Buffer> dx) {
  auto ops = ParseRelu("relu_mask_grad", args, 0, *dx, static_cast<int64_t>(mask.element_count()));
  if (ops.has_error()) return ops.error();
  const int64_t n = ops->size;
  if (n > 0) {
    const int64_t blocks = (n + kThreads - 1) / kThreads;
    JGSESS_LAUNCH(ReluMaskGradKernel, blocks, kThreads, 0, stream)(
        mask.typed_data(), ops->data[0], ops->data[1], ElemOf(ops->type), n, dx->untyped_data());
  }
  return CudaStatus("relu_mask_grad");
}

ffi::Error ReluMaskCudaLoadImpl() {
  return CudaStatus("relu_mask", LoadKernels(ReluMaskKernel, ReluMaskGradKernel));
}

}  // namespace
}  // namespace jgsess

XLA_FFI_DEFINE_HANDLER_SYMBOL(ReluMaskCudaLoad, jgsess::Load<jgsess::ReluMaskCudaLoadImpl>,
                              jgsess::LoadBinding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(ReluMaskGradCudaLoad, jgsess::Load<jgsess::ReluMaskCudaLoadImpl>,
                              jgsess::LoadBinding());

XLA_FFI_DEFINE_HANDLER_SYMBOL(ReluMaskCuda, jgsess::ReluMaskCudaImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .RemainingArgs()                          // x, or a and b
                                  .Ret<jgsess::Buffer>()                    // y
                                  .Ret<xla::ffi::Buffer<xla::ffi::U32>>(),  // mask
                              jgsess::kGraphSafe);

XLA_FFI_DEFINE_HANDLER_SYMBOL(ReluMaskGradCuda, jgsess::ReluMaskGradCudaImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::U32>>()  // mask
                                  .RemainingArgs()                         // dy, or dy1 and dy2
                                  .Ret<jgsess::Buffer>(),                  // dx
                              jgsess::kGraphSafe);
