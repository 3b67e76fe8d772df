// Training-mode BatchNorm + (add +) ReLU on CUDA. Each direction is two passes over the data:
// per-channel partial sums (f64, one pair per (split, channel) in the workspace, no atomics: the
// result does not depend on scheduling), a one-thread-per-channel finish that adds the splits
// in order, and one elementwise pass (one thread per element, a warp ballot per mask word).
#include "common/ffi.h"
#include "common/multi_tensor_cuda.cuh"
#include "kernels/batch_norm/batch_norm.h"

namespace jgsess {
namespace {

using F32Buffer = ffi::Buffer<ffi::F32>;
using MaskBuffer = ffi::Buffer<ffi::U32>;

constexpr int kThreads = 256;                       // a multiple of 32: lane = i % 32 inside a warp
constexpr int kLanes = 8;                           // channels-last: 32 channels x 8 rows per block
constexpr int64_t kNarrowIndex = int64_t{1} << 32;  // tensors this small index in 32 bits

__device__ __forceinline__ float RoundTo(Elem type, float v) {
  switch (type) {
    case Elem::kBF16: return __bfloat162float(ToBf16(v));
    case Elem::kF16: return __half2float(ToF16(v));
    default: return v;
  }
}

__device__ __forceinline__ bool Bit(const uint32_t* mask, int64_t i) {
  return (mask[i >> 5] >> (i & 31)) & 1u;
}

// What the per-channel sums add up: forward (x - shift, its square); backward (g, g * (x - mean)).
struct SumOperands {
  const void* x;
  Elem x_type;
  const float* center;  // shift (forward: x at row 0) or mean (backward), per channel; null: shift
  const void* dy;       // backward only
  Elem dy_type;
  const uint32_t* mask;
  void* dz;  // backward with a residual: dz = g
};

__device__ __forceinline__ void Terms(const SumOperands& op, int64_t i, float center, double& p,
                                      double& q) {
  const float x = LoadF32(op.x, op.x_type, i);
  if (op.dy == nullptr) {
    const double d = static_cast<double>(x) - center;
    p += d;
    q += d * d;
    return;
  }
  const float g = Bit(op.mask, i) ? LoadF32(op.dy, op.dy_type, i) : 0.0f;
  if (op.dz != nullptr) StoreF32(op.dz, op.dy_type, i, g);
  p += g;
  q += static_cast<double>(g * (x - center));
}

__device__ __forceinline__ float Center(const SumOperands& op, int64_t c, int64_t inner) {
  return op.center != nullptr ? op.center[c] : LoadF32(op.x, op.x_type, c * inner);
}

// Channels-last: block (32 channels, kLanes rows); grid (channel tiles, splits).
__global__ void __launch_bounds__(32 * kLanes)
    SumsLast(SumOperands op, BnShape s, int64_t splits, double* partial) {
  __shared__ double sp[kLanes][32], sq[kLanes][32];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t per = (s.outer + splits - 1) / splits;
  const int64_t r0 = blockIdx.y * per, r1 = min(s.outer, r0 + per);
  double p = 0.0, q = 0.0;
  if (c < s.channels) {
    const float center = Center(op, c, 1);
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kLanes)
      Terms(op, r * s.channels + c, center, p, q);
  }
  sp[threadIdx.y][threadIdx.x] = p;
  sq[threadIdx.y][threadIdx.x] = q;
  __syncthreads();
  if (threadIdx.y == 0 && c < s.channels) {
    for (int l = 1; l < kLanes; ++l) {
      p += sp[l][threadIdx.x];
      q += sq[l][threadIdx.x];
    }
    partial[blockIdx.y * 2 * s.channels + c] = p;
    partial[blockIdx.y * 2 * s.channels + s.channels + c] = q;
  }
}

// Channels-first (inner > 1): block per (channel, split), threads along the contiguous run.
__global__ void __launch_bounds__(kThreads)
    SumsFirst(SumOperands op, BnShape s, int64_t splits, double* partial) {
  __shared__ double sp[kThreads / 32], sq[kThreads / 32];
  const int64_t c = blockIdx.x, m = s.count();
  const int64_t per = (m + splits - 1) / splits;
  const int64_t j0 = blockIdx.y * per, j1 = min(m, j0 + per);
  const float center = Center(op, c, s.inner);
  double p = 0.0, q = 0.0;
  // element j of the channel is (row, offset) = (j / inner, j % inner): divided once per
  // thread, then stepped (a 64-bit division per element is a long instruction sequence)
  const int64_t inner = s.inner, first = j0 + threadIdx.x;
  const unsigned threads = blockDim.x;
  const int64_t step_rows = inner > threads ? 0 : threads / static_cast<unsigned>(inner);
  const int64_t step_offset = inner > threads ? threads : threads % static_cast<unsigned>(inner);
  int64_t row = first / inner, offset = first - row * inner;
  for (int64_t j = first; j < j1; j += blockDim.x) {
    Terms(op, (row * s.channels + c) * inner + offset, center, p, q);
    row += step_rows;
    offset += step_offset;
    if (offset >= inner) {
      offset -= inner;
      ++row;
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    p += __shfl_down_sync(0xffffffffu, p, offset);
    q += __shfl_down_sync(0xffffffffu, q, offset);
  }
  if (threadIdx.x % 32 == 0) {
    sp[threadIdx.x / 32] = p;
    sq[threadIdx.x / 32] = q;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) {
      p += sp[w];
      q += sq[w];
    }
    partial[blockIdx.y * 2 * s.channels + c] = p;
    partial[blockIdx.y * 2 * s.channels + s.channels + c] = q;
  }
}

void LaunchSums(cudaStream_t stream, const SumOperands& op, const BnShape& s, double* partial) {
  const int64_t splits = BnSplits(s);
  if (s.inner == 1) {
    const dim3 grid((s.channels + 31) / 32, splits), block(32, kLanes);
    JGSESS_LAUNCH(SumsLast, grid, block, 0, stream)(op, s, splits, partial);
  } else {
    const dim3 grid(s.channels, splits);
    JGSESS_LAUNCH(SumsFirst, grid, kThreads, 0, stream)(op, s, splits, partial);
  }
}

// Channel c's two sums: its partial sums over the splits, added in split order.
__device__ double2 ChannelSums(const double* partial, const BnShape& s, int64_t splits, int64_t c) {
  double2 sums = {0.0, 0.0};
  for (int64_t p = 0; p < splits; ++p) {
    sums.x += partial[p * 2 * s.channels + c];
    sums.y += partial[p * 2 * s.channels + s.channels + c];
  }
  return sums;
}

// coef[4 * c]: forward a = rsqrt(var + eps) * scale; backward (a, b, c) of dx's formula.
__global__ void __launch_bounds__(kThreads)
    FinishForward(const double* partial, const void* x, Elem x_type, BnShape s, int64_t splits,
                  const float* scale, float eps, float* mean, float* var, float* coef) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= s.channels) return;
  const bool empty = s.count() == 0;  // no sums, no shift: statistics 0 / 0
  const auto [a, b] = empty ? double2{0.0, 0.0} : ChannelSums(partial, s, splits, c);
  const double m = static_cast<double>(s.count()), d = a / m;
  mean[c] = static_cast<float>((empty ? 0.0f : LoadF32(x, x_type, c * s.inner)) + d);
  var[c] = BnVariance(b / m, d);
  coef[4 * c] = BnInvStd(var[c], eps) * scale[c];
}

__global__ void __launch_bounds__(kThreads)
    FinishBackward(const double* partial, BnShape s, int64_t splits, const float* scale,
                   const float* var, float eps, float* dscale, float* dbias, float* coef) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= s.channels) return;
  const auto [a, b] = s.count() == 0 ? double2{0.0, 0.0} : ChannelSums(partial, s, splits, c);
  dbias[c] = static_cast<float>(a);
  dscale[c] = BnInvStd(var[c], eps) * static_cast<float>(b);
  const BnGradCoef k = BnGradCoefOf(scale[c], var[c], eps, a, b, s.count());
  coef[4 * c] = k.a;
  coef[4 * c + 1] = k.b;
  coef[4 * c + 2] = k.c;
}

// The channel of element i, in `Index` arithmetic: uint32_t for tensors of fewer than 2^32
// elements (the launches pick it), whose division is a few instructions where int64_t's is a
// long sequence.
template <typename Index>
__device__ __forceinline__ int64_t ChannelOf(int64_t i, const BnShape& s) {
  return static_cast<int64_t>(static_cast<Index>(i) / static_cast<Index>(s.inner) %
                              static_cast<Index>(s.channels));
}

template <typename Index>
__global__ void __launch_bounds__(kThreads)
    Normalize(const void* x, Elem x_type, const void* z, BnShape s, const float* mean,
              const float* coef, const float* bias, void* y, Elem y_type, uint32_t* mask) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n = s.size();
  float v = 0.0f;
  if (i < n) {
    const int64_t c = ChannelOf<Index>(i, s);
    v = RoundTo(y_type, (LoadF32(x, x_type, i) - mean[c]) * coef[4 * c] + bias[c]);
    if (z != nullptr) v = RoundTo(y_type, v + LoadF32(z, y_type, i));
    StoreF32(y, y_type, i, (v > 0.0f || v != v) ? v : 0.0f);
  }
  const unsigned bits = __ballot_sync(0xffffffffu, i < n && v > 0.0f);
  if (threadIdx.x % 32 == 0 && i < n) mask[i / 32] = bits;
}

template <typename Index>
__global__ void __launch_bounds__(kThreads)
    InputGrad(const void* dy, Elem dy_type, const void* x, Elem x_type, const uint32_t* mask,
              BnShape s, const float* mean, const float* coef, void* dx) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= s.size()) return;
  const int64_t c = ChannelOf<Index>(i, s);
  const float g = Bit(mask, i) ? LoadF32(dy, dy_type, i) : 0.0f;
  const float a = coef[4 * c], b = coef[4 * c + 1], k = coef[4 * c + 2];
  StoreF32(dx, x_type, i, a * (g - b - (LoadF32(x, x_type, i) - mean[c]) * k));
}

// A call's checked shape and its workspace: the per-split partial sums, then each channel's
// coefficients.
struct Work {
  BnShape s;
  double* partial;
  float* coef;
};

// The Work of a call whose operands `shape` checked, with the workspace at `offset` in the arena;
// or the first error.
ffi::ErrorOr<Work> WorkOf(const ffi::ErrorOr<BnShape>& shape, Buffer& arena, int64_t offset) {
  if (shape.has_error()) return ffi::Unexpected(shape.error());
  const BnShape s = *shape;
  auto base = BnWorkspace(arena, offset, s);
  if (base.has_error()) return ffi::Unexpected(base.error());
  double* partial = reinterpret_cast<double*>(*base);
  return Work{s, partial, reinterpret_cast<float*>(partial + BnSplits(s) * 2 * s.channels)};
}

int64_t Blocks(int64_t n, int64_t threads) { return (n + threads - 1) / threads; }

ffi::Error Forward(cudaStream_t stream, Buffer& arena, Buffer& x, F32Buffer& scale, F32Buffer& bias,
                   const Buffer* z, float eps, int64_t axis, int64_t offset, Buffer& y,
                   F32Buffer& mean, F32Buffer& var, MaskBuffer& mask) {
  auto work = WorkOf(BnForwardShape(x, scale, bias, z, axis, y, mean, var, mask), arena, offset);
  if (work.has_error()) return work.error();
  const BnShape s = work->s;
  if (s.channels == 0) return ffi::Error::Success();
  const Elem xt = ElemOf(x.element_type()), yt = ElemOf(y.element_type());
  const SumOperands op{x.untyped_data(), xt, nullptr, nullptr, xt, nullptr, nullptr};
  if (s.size() > 0) LaunchSums(stream, op, s, work->partial);
  JGSESS_LAUNCH(FinishForward, Blocks(s.channels, kThreads), kThreads, 0, stream)(
      work->partial, x.untyped_data(), xt, s, BnSplits(s), scale.typed_data(), eps,
      mean.typed_data(), var.typed_data(), work->coef);
  const auto normalize = s.size() < kNarrowIndex ? Normalize<uint32_t> : Normalize<int64_t>;
  if (s.size() > 0) {
    JGSESS_LAUNCH(normalize, Blocks(s.size(), kThreads), kThreads, 0, stream)(
        x.untyped_data(), xt, z != nullptr ? z->untyped_data() : nullptr, s, mean.typed_data(),
        work->coef, bias.typed_data(), y.untyped_data(), yt, mask.typed_data());
  }
  return CudaStatus("batch_norm_relu");
}

ffi::Error Backward(cudaStream_t stream, Buffer& arena, Buffer& dy, Buffer& x, F32Buffer& scale,
                    F32Buffer& mean, F32Buffer& var, MaskBuffer& mask, float eps, int64_t axis,
                    int64_t offset, Buffer& dx, F32Buffer& dscale, F32Buffer& dbias, Buffer* dz) {
  auto work = WorkOf(BnBackwardShape(dy, x, scale, mean, var, mask, axis, dx, dscale, dbias, dz),
                     arena, offset);
  if (work.has_error()) return work.error();
  const BnShape s = work->s;
  if (s.channels == 0) return ffi::Error::Success();
  const Elem xt = ElemOf(x.element_type()), gt = ElemOf(dy.element_type());
  const SumOperands op{x.untyped_data(),
                       xt,
                       mean.typed_data(),
                       dy.untyped_data(),
                       gt,
                       mask.typed_data(),
                       dz != nullptr ? dz->untyped_data() : nullptr};
  if (s.size() > 0) LaunchSums(stream, op, s, work->partial);
  JGSESS_LAUNCH(FinishBackward, Blocks(s.channels, kThreads), kThreads, 0, stream)(
      work->partial, s, BnSplits(s), scale.typed_data(), var.typed_data(), eps, dscale.typed_data(),
      dbias.typed_data(), work->coef);
  const auto input_grad = s.size() < kNarrowIndex ? InputGrad<uint32_t> : InputGrad<int64_t>;
  if (s.size() > 0) {
    JGSESS_LAUNCH(input_grad, Blocks(s.size(), kThreads), kThreads, 0, stream)(
        dy.untyped_data(), gt, x.untyped_data(), xt, mask.typed_data(), s, mean.typed_data(),
        work->coef, dx.untyped_data());
  }
  return CudaStatus("batch_norm_relu_grad");
}

ffi::Error BatchNormReluCudaImpl(cudaStream_t stream, Buffer arena, Buffer x, F32Buffer scale,
                                 F32Buffer bias, ffi::Result<Buffer> y, ffi::Result<F32Buffer> mean,
                                 ffi::Result<F32Buffer> var, ffi::Result<MaskBuffer> mask,
                                 ffi::Result<Buffer>, float eps, int64_t axis,
                                 int64_t workspace_offset) {
  return Forward(stream, arena, x, scale, bias, nullptr, eps, axis, workspace_offset, *y, *mean,
                 *var, *mask);
}

ffi::Error BatchNormAddReluCudaImpl(cudaStream_t stream, Buffer arena, Buffer x, F32Buffer scale,
                                    F32Buffer bias, Buffer z, ffi::Result<Buffer> y,
                                    ffi::Result<F32Buffer> mean, ffi::Result<F32Buffer> var,
                                    ffi::Result<MaskBuffer> mask, ffi::Result<Buffer>, float eps,
                                    int64_t axis, int64_t workspace_offset) {
  return Forward(stream, arena, x, scale, bias, &z, eps, axis, workspace_offset, *y, *mean, *var,
                 *mask);
}

ffi::Error BatchNormReluGradCudaImpl(cudaStream_t stream, Buffer arena, Buffer dy, Buffer x,
                                     F32Buffer scale, F32Buffer mean, F32Buffer var,
                                     MaskBuffer mask, ffi::Result<Buffer> dx,
                                     ffi::Result<F32Buffer> dscale, ffi::Result<F32Buffer> dbias,
                                     ffi::Result<Buffer>, float eps, int64_t axis,
                                     int64_t workspace_offset) {
  return Backward(stream, arena, dy, x, scale, mean, var, mask, eps, axis, workspace_offset, *dx,
                  *dscale, *dbias, nullptr);
}

ffi::Error BatchNormAddReluGradCudaImpl(cudaStream_t stream, Buffer arena, Buffer dy, Buffer x,
                                        F32Buffer scale, F32Buffer mean, F32Buffer var,
                                        MaskBuffer mask, ffi::Result<Buffer> dx,
                                        ffi::Result<F32Buffer> dscale, ffi::Result<F32Buffer> dbias,
                                        ffi::Result<Buffer> dz, ffi::Result<Buffer>, float eps,
                                        int64_t axis, int64_t workspace_offset) {
  return Backward(stream, arena, dy, x, scale, mean, var, mask, eps, axis, workspace_offset, *dx,
                  *dscale, *dbias, &(*dz));
}

ffi::Error BatchNormCudaLoadImpl() {
  return CudaStatus(
      "batch_norm_relu",
      LoadKernels(SumsLast, SumsFirst, FinishForward, FinishBackward, Normalize<uint32_t>,
                  Normalize<int64_t>, InputGrad<uint32_t>, InputGrad<int64_t>));
}

}  // namespace
}  // namespace jgsess

#define JGSESS_BN_LOAD(name)                                                       \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, jgsess::Load<jgsess::BatchNormCudaLoadImpl>, \
                                jgsess::LoadBinding())
JGSESS_BN_LOAD(BatchNormReluCudaLoad);
JGSESS_BN_LOAD(BatchNormAddReluCudaLoad);
JGSESS_BN_LOAD(BatchNormReluGradCudaLoad);
JGSESS_BN_LOAD(BatchNormAddReluGradCudaLoad);

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    BatchNormReluCuda, jgsess::BatchNormReluCudaImpl,
    (jgsess::BnForwardBinding<xla::ffi::PlatformStream<cudaStream_t>, false>()),
    jgsess::kGraphSafe);

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    BatchNormAddReluCuda, jgsess::BatchNormAddReluCudaImpl,
    (jgsess::BnForwardBinding<xla::ffi::PlatformStream<cudaStream_t>, true>()), jgsess::kGraphSafe);

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    BatchNormReluGradCuda, jgsess::BatchNormReluGradCudaImpl,
    (jgsess::BnBackwardBinding<xla::ffi::PlatformStream<cudaStream_t>, false>()),
    jgsess::kGraphSafe);

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    BatchNormAddReluGradCuda, jgsess::BatchNormAddReluGradCudaImpl,
    (jgsess::BnBackwardBinding<xla::ffi::PlatformStream<cudaStream_t>, true>()),
    jgsess::kGraphSafe);
