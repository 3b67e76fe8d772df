// Multi-tensor Adam / AdamW on CUDA: one block per 64K-element chunk, hyper-parameters read
// from device memory inside the kernel (no host synchronization; CUDA-graph safe).
#include <vector>

#include "common/ffi.h"
#include "common/multi_tensor_cuda.cuh"
#include "kernels/adamw/adamw.h"

namespace jgsess {
namespace {

constexpr int kLists = 7;  // p, g, m, v, p', m', v'
using AdamwTable = TensorTable<kLists, 96, 320>;

struct AdamwScalarPtrs {
  const float* ptr[kAdamwScalars];
};

template <int64_t kFlags>
__global__ void AdamwKernel(AdamwTable table, AdamwScalarPtrs scalars) {
  const AdamwHyper h{*scalars.ptr[0], *scalars.ptr[1], *scalars.ptr[2], *scalars.ptr[3],
                     *scalars.ptr[4], *scalars.ptr[5], *scalars.ptr[6], *scalars.ptr[7],
                     *scalars.ptr[8], *scalars.ptr[9]};
  const int t = table.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(table.block_chunk[blockIdx.x]) * kCudaChunk;
  const int64_t end = min(table.size[t], begin + kCudaChunk);
  const float* p = static_cast<const float*>(table.ptr[0][t]);
  const float* g = static_cast<const float*>(table.ptr[1][t]);
  const float* m = static_cast<const float*>(table.ptr[2][t]);
  const float* v = static_cast<const float*>(table.ptr[3][t]);
  float* p_out = static_cast<float*>(table.ptr[4][t]);
  float* m_out = static_cast<float*>(table.ptr[5][t]);
  float* v_out = static_cast<float*>(table.ptr[6][t]);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    AdamwElement<kFlags>(h, p[i], g[i], m[i], v[i], &p_out[i], &m_out[i], &v_out[i]);
  }
}

ffi::Error AdamwCudaImpl(cudaStream_t stream, Scalar b1, Scalar omb1, Scalar b2, Scalar omb2,
                         Scalar bc1, Scalar bc2, Scalar eps, Scalar eps_root, Scalar wd,
                         Scalar lr, Args args, Rets rets, int64_t flags) {
  if (args.size() % 4 != 0 || rets.size() * 4 != args.size() * 3) {
    return InvalidArgument("adamw: expected (p, g, m, v) per tensor and (p', m', v') results");
  }
  const AdamwScalarPtrs scalars{{b1.typed_data(), omb1.typed_data(), b2.typed_data(),
                                 omb2.typed_data(), bc1.typed_data(), bc2.typed_data(),
                                 eps.typed_data(), eps_root.typed_data(), wd.typed_data(),
                                 lr.typed_data()}};
  const size_t n = args.size() / 4;
  std::vector<void*> ptrs[kLists];
  std::vector<int64_t> sizes(n);
  for (size_t t = 0; t < n; ++t) {
    for (size_t k = 0; k < 4; ++k) {
      auto arg = args.get<Buffer>(4 * t + k);
      if (arg.has_error()) return arg.error();
      if (arg->element_type() != DataType::F32) return InvalidArgument("adamw: f32 only");
      ptrs[k].push_back(arg->untyped_data());
      sizes[t] = arg->element_count();
    }
    for (size_t k = 0; k < 3; ++k) {
      auto ret = rets.get<Buffer>(3 * t + k);
      if (ret.has_error()) return ret.error();
      ptrs[4 + k].push_back((*ret)->untyped_data());
    }
  }
  cudaError_t err = cudaSuccess;
  ffi::Error status = DispatchAdamwFlags(flags, [&]<int64_t kFlags>() {
    err = MultiTensorApply<kLists, 96, 320>(ptrs, sizes, [&](const AdamwTable& table, int blocks) {
      AdamwKernel<kFlags><<<blocks, kCudaBlock, 0, stream>>>(table, scalars);
    });
    return ffi::Error::Success();
  });
  if (status.failure()) return status;
  if (err != cudaSuccess) return Internal(std::string("adamw: ") + cudaGetErrorString(err));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jgsess

XLA_FFI_DEFINE_HANDLER_SYMBOL(AdamwCuda, jgsess::AdamwCudaImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<jgsess::Scalar>()  // b1
                                  .Arg<jgsess::Scalar>()  // omb1 = 1 - b1
                                  .Arg<jgsess::Scalar>()  // b2
                                  .Arg<jgsess::Scalar>()  // omb2 = 1 - b2
                                  .Arg<jgsess::Scalar>()  // bc1 = 1 - b1^t
                                  .Arg<jgsess::Scalar>()  // bc2 = 1 - b2^t
                                  .Arg<jgsess::Scalar>()  // eps
                                  .Arg<jgsess::Scalar>()  // eps_root
                                  .Arg<jgsess::Scalar>()  // weight decay
                                  .Arg<jgsess::Scalar>()  // learning rate
                                  .RemainingArgs()        // (p, g, m, v) per tensor
                                  .RemainingRets()        // (p', m', v') per tensor
                                  .Attr<int64_t>("flags"),
                              jgsess::kGraphSafe);
