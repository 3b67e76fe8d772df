// Multi-tensor Adam / AdamW on CUDA: one block per 64K-element chunk, hyper-parameters read
// from device memory inside the kernel (no host synchronization; CUDA-graph safe).
#include "common/ffi.h"
#include "common/multi_tensor_cuda.cuh"
#include "kernels/adamw/adamw.h"

namespace jgsess {
namespace {

using AdamwTable = TensorTable<7, 96, 320>;  // p, g, m, v, p', m', v'

struct AdamwScalarPtrs {
  const float* ptr[kAdamwScalars];
};

template <int64_t kFlags>
__global__ void AdamwKernel(AdamwTable table, AdamwScalarPtrs s) {
  const AdamwHyper h{*s.ptr[0], *s.ptr[1], *s.ptr[2],  *s.ptr[3],  *s.ptr[4],
                     *s.ptr[5], *s.ptr[6], *s.ptr[7],  *s.ptr[8],  *s.ptr[9],
                     *s.ptr[10], *s.ptr[11], *s.ptr[12]};
  const int t = table.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(table.block_chunk[blockIdx.x]) * kCudaChunk;
  const int64_t end = min(table.size[t], begin + kCudaChunk);
  const Elem p_type = table.type[0][t], g_type = table.type[1][t], out_type = table.type[4][t];
  const float* m = static_cast<const float*>(table.ptr[2][t]);
  const float* v = static_cast<const float*>(table.ptr[3][t]);
  float* m_out = static_cast<float*>(table.ptr[5][t]);
  float* v_out = static_cast<float*>(table.ptr[6][t]);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float p_new;
    AdamwElement<kFlags>(h, LoadF32(table.ptr[0][t], p_type, i), LoadF32(table.ptr[1][t], g_type, i),
                         m[i], v[i], &p_new, &m_out[i], &v_out[i]);
    StoreF32(table.ptr[4][t], out_type, i, p_new);
  }
}

ffi::Error AdamwCudaImpl(cudaStream_t stream, Scalar b1, Scalar omb1, Scalar b2, Scalar omb2,
                         Scalar bc1, Scalar bc2, Scalar eps, Scalar eps_root, Scalar wd,
                         Scalar lr, Scalar keep, Scalar norm, Scalar clip, Args args, Rets rets,
                         int64_t flags) {
  auto tensors = ParseTensors<4, 3>("adamw", args, rets, 0b1100, 0b110);
  if (tensors.has_error()) return tensors.error();
  const AdamwScalarPtrs scalars{{b1.typed_data(), omb1.typed_data(), b2.typed_data(),
                                 omb2.typed_data(), bc1.typed_data(), bc2.typed_data(),
                                 eps.typed_data(), eps_root.typed_data(), wd.typed_data(),
                                 lr.typed_data(), keep.typed_data(), norm.typed_data(),
                                 clip.typed_data()}};
  cudaError_t err = cudaSuccess;
  ffi::Error status = DispatchAdamwFlags(flags, [&]<int64_t kFlags>() {
    err = MultiTensorApply<4, 3, 96, 320>(*tensors, [&](const AdamwTable& table, int blocks) {
      AdamwKernel<kFlags><<<blocks, kCudaBlock, 0, stream>>>(table, scalars);
    });
    return ffi::Error::Success();
  });
  if (status.failure()) return status;
  return CudaStatus("adamw", err);
}

}  // namespace
}  // namespace jgsess

XLA_FFI_DEFINE_HANDLER_SYMBOL(AdamwCuda, jgsess::AdamwCudaImpl,
                              jgsess::AdamwBinding<xla::ffi::PlatformStream<cudaStream_t>>(),
                              jgsess::kGraphSafe);
