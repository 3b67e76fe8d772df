// Training-mode BatchNorm fused with ReLU (and a residual add) [BatchNormWithActivation,
// BatchNormWithAddAndActivation, BatchNormGradWithActivation, BatchNormGradWithAddAndActivation].
//
// x is viewed as [outer, C, inner] (C is the feature axis: NHWC has inner = 1, NCHW outer = N).
// Per channel, over M = outer * inner elements:
//
// Forward (two passes over x):
//   mean = sum(x) / M, var = sum((x - mean)^2) / M     (shifted sums in f64: stable)
//   a = rsqrt(var + eps) * scale
//   t = out((x - mean) * a + bias)                     (out(): rounding to y's dtype)
//   s = out(t + z)  (with a residual z)                y = max(s, 0); mask bit = s > 0
//
// Backward (two passes over dy, x and the mask), g = bit ? dy : 0:
//   dbias = sum(g), dscale = rsqrt(var + eps) * sum(g * (x - mean))
//   dx = scale * inv * (g - dbias / M - (x - mean) * inv^2 * sum(g * (x - mean)) / M)
//   dz = g  (with a residual)
//
// The products keep the order of flax's and the reference's formula (-ffp-contract=off).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "common/ffi.h"
#include "common/host_device.h"
#include "common/tensor_list.h"

namespace jgsess {

// x's shape around the feature axis.
struct BnShape {
  int64_t outer = 1, channels = 1, inner = 1;
  JGSESS_HOST_DEVICE int64_t count() const { return outer * inner; }  // elements per channel
  JGSESS_HOST_DEVICE int64_t size() const { return outer * channels * inner; }
};

inline ffi::ErrorOr<BnShape> BnShapeOf(const Buffer& x, int64_t axis) {
  const auto dims = x.dimensions();
  const int64_t rank = static_cast<int64_t>(dims.size());
  if (axis < 0 || axis >= rank) {
    return Invalid("batch_norm",
                   "axis " + std::to_string(axis) + " is outside x (" + Describe(x) + ")");
  }
  BnShape shape;
  for (int64_t d = 0; d < rank; ++d) {
    if (d < axis) shape.outer *= dims[d];
    if (d == axis) shape.channels = dims[d];
    if (d > axis) shape.inner *= dims[d];
  }
  return shape;
}

// Partial sums: the rows (elements, on CUDA) of each channel are split into this many parts,
// each with its own f64 (sum, sum of squares) pair in the workspace, added in order at the end:
// one part per 16K elements, at most 256 and at most 1 MB of pairs, so that the CUDA statistics
// launch enough blocks to fill a GPU (ResNet-50's first NHWC BatchNorm: 2 x 256, was 2 x 64).
// jgsess/kernels/batch_norm.py: _splits mirrors it.
inline int64_t BnSplits(const BnShape& s) {
  const int64_t by_size = (s.size() + 16383) / 16384;
  const int64_t by_bytes = (int64_t{1} << 20) / (16 * std::max<int64_t>(1, s.channels));
  return std::max<int64_t>(1, std::min({by_size, by_bytes, int64_t{256}}));
}

// Workspace layout (bytes from the arena's offset): partial[splits][2][C] f64, then 4 f32 per
// channel (the backward's coefficients).
inline int64_t BnWorkspaceBytes(const BnShape& s) {
  return BnSplits(s) * 2 * s.channels * 8 + 16 * s.channels;
}

inline bool BnSized(size_t count, int64_t want) { return static_cast<int64_t>(count) == want; }

// What a BatchNorm call's buffers must be, from x's shape: per element as x, per channel, and
// the ReLU's mask; each check names the buffer and what it should have been.
struct BnExpected {
  const BnShape& s;
  FirstProblem problems;

  static constexpr const char* kFloat = "float32, bfloat16 or float16";
  std::string Elements() const { return std::to_string(s.size()) + " elements (as x)"; }

  // each check's expected text is made only where the check fails
  void Floats(const char* name, const Buffer& b) {
    problems.Check(IsKernelFloat(b.element_type()) && BnSized(b.element_count(), s.size()), name, b,
                   [&] { return std::string(kFloat) + " of " + Elements(); });
  }
  void Like(const char* name, const Buffer& b, const char* other, DataType type) {
    problems.Check(b.element_type() == type && BnSized(b.element_count(), s.size()), name, b,
                   [&] { return TypeName(type) + " (" + other + "'s dtype) of " + Elements(); });
  }
  template <typename B>
  void Channels(const char* name, const B& b) {
    problems.Check(BnSized(b.element_count(), s.channels), name, b, DataType::F32, [&] {
      return "float32 of " + std::to_string(s.channels) + " elements (x's channels)";
    });
  }
  template <typename B>
  void Mask(const B& b) {
    const int64_t words = (s.size() + 31) / 32;
    problems.Check(BnSized(b.element_count(), words), "the mask", b, DataType::U32, [&] {
      return "uint32 of " + std::to_string(words) + " words (a bit per element)";
    });
  }
};

// x's shape, once the forward's operands and results are checked against it.
inline ffi::ErrorOr<BnShape> BnForwardShape(const Buffer& x, const ffi::Buffer<ffi::F32>& scale,
                                            const ffi::Buffer<ffi::F32>& bias, const Buffer* z,
                                            int64_t axis, const Buffer& y,
                                            const ffi::Buffer<ffi::F32>& mean,
                                            const ffi::Buffer<ffi::F32>& var,
                                            const ffi::Buffer<ffi::U32>& mask) {
  auto shape = BnShapeOf(x, axis);
  if (shape.has_error()) return shape;
  const BnShape s = *shape;
  BnExpected want{s, {}};
  want.Floats("x", x);
  want.Floats("y", y);
  want.Mask(mask);
  want.Channels("scale", scale);
  want.Channels("bias", bias);
  want.Channels("mean", mean);
  want.Channels("var", var);
  if (z != nullptr) want.Like("z", *z, "y", y.element_type());
  if (want.problems.found()) return Invalid("batch_norm_relu", want.problems.text());
  return s;
}

// x's shape, once the backward's operands and results are checked against it.
inline ffi::ErrorOr<BnShape> BnBackwardShape(const Buffer& dy, const Buffer& x,
                                             const ffi::Buffer<ffi::F32>& scale,
                                             const ffi::Buffer<ffi::F32>& mean,
                                             const ffi::Buffer<ffi::F32>& var,
                                             const ffi::Buffer<ffi::U32>& mask, int64_t axis,
                                             const Buffer& dx, const ffi::Buffer<ffi::F32>& dscale,
                                             const ffi::Buffer<ffi::F32>& dbias, const Buffer* dz) {
  auto shape = BnShapeOf(x, axis);
  if (shape.has_error()) return shape;
  const BnShape s = *shape;
  BnExpected want{s, {}};
  want.Floats("x", x);
  want.Floats("dy", dy);
  want.Like("dx", dx, "x", x.element_type());
  want.Mask(mask);
  want.Channels("scale", scale);
  want.Channels("mean", mean);
  want.Channels("var", var);
  want.Channels("dscale", dscale);
  want.Channels("dbias", dbias);
  if (dz != nullptr) want.Like("dz", *dz, "dy", dy.element_type());
  if (want.problems.found()) return Invalid("batch_norm_relu_grad", want.problems.text());
  return s;
}

// The kernel's workspace: `BnWorkspaceBytes(s)` at `offset` in the arena, 8-byte aligned (its
// partial sums are f64; the planner aligns every workspace to 64 bytes).
inline ffi::ErrorOr<char*> BnWorkspace(Buffer& arena, int64_t offset, const BnShape& s) {
  const int64_t bytes = BnWorkspaceBytes(s), arena_bytes = static_cast<int64_t>(arena.size_bytes());
  if (offset < 0 || offset > arena_bytes || bytes > arena_bytes - offset) {
    return Invalid("batch_norm", "the workspace (" + std::to_string(bytes) + " bytes at offset " +
                                     std::to_string(offset) + ") does not fit the arena (" +
                                     std::to_string(arena_bytes) + " bytes)");
  }
  if (offset % 8 != 0) {
    return Invalid("batch_norm",
                   "the workspace offset " + std::to_string(offset) + " is not 8-byte aligned");
  }
  return static_cast<char*>(arena.untyped_data()) + offset;
}

JGSESS_HOST_DEVICE float BnInvStd(float var, float eps) { return 1.0f / sqrtf(var + eps); }

// The variance from the mean square and mean of the shifted values, clipped at 0 as flax does;
// NaN for an empty batch (0 / 0, as the reference's mean).
JGSESS_HOST_DEVICE float BnVariance(double mean_square, double mean) {
  const double v = mean_square - mean * mean;
  return static_cast<float>(v != v ? v : (v > 0.0 ? v : 0.0));
}

// Per-channel coefficients of the backward's second pass: dx = a * (g - b - (x - mean) * c).
struct BnGradCoef {
  float a, b, c;
};

JGSESS_HOST_DEVICE BnGradCoef BnGradCoefOf(float scale, float var, float eps, double sum_g,
                                           double sum_gxc, int64_t count) {
  const float inv = BnInvStd(var, eps);
  const float mean_g = static_cast<float>(sum_g / static_cast<double>(count));
  const float mean_gxc = static_cast<float>(sum_gxc / static_cast<double>(count));
  return {scale * inv, mean_g, inv * inv * mean_gxc};
}

// The handlers' signatures, shared by the CPU (Context = ThreadPool) and CUDA (the stream)
// handlers; kAdd adds the residual z (forward) or its gradient dz (backward). Bindings only
// move as temporaries, so each part is a function of the one before.
template <typename Context>
auto BnForwardOperands() {
  return ffi::Ffi::Bind()
      .Ctx<Context>()
      .template Arg<Buffer>()                  // arena
      .template Arg<Buffer>()                  // x
      .template Arg<ffi::Buffer<ffi::F32>>()   // scale
      .template Arg<ffi::Buffer<ffi::F32>>();  // bias
}

template <typename Operands>
auto BnForwardResults(Operands&& operands) {
  return std::move(operands)
      .template Ret<Buffer>()                 // y
      .template Ret<ffi::Buffer<ffi::F32>>()  // mean
      .template Ret<ffi::Buffer<ffi::F32>>()  // var (biased)
      .template Ret<ffi::Buffer<ffi::U32>>()  // mask
      .template Ret<Buffer>()                 // arena (aliased)
      .template Attr<float>("eps")
      .template Attr<int64_t>("axis")
      .template Attr<int64_t>("workspace_offset");
}

template <typename Context, bool kAdd>
auto BnForwardBinding() {
  if constexpr (kAdd) {
    return BnForwardResults(BnForwardOperands<Context>().template Arg<Buffer>());  // z
  } else {
    return BnForwardResults(BnForwardOperands<Context>());
  }
}

template <typename Context>
auto BnBackwardGrads() {
  return ffi::Ffi::Bind()
      .Ctx<Context>()
      .template Arg<Buffer>()                  // arena
      .template Arg<Buffer>()                  // dy
      .template Arg<Buffer>()                  // x
      .template Arg<ffi::Buffer<ffi::F32>>()   // scale
      .template Arg<ffi::Buffer<ffi::F32>>()   // mean
      .template Arg<ffi::Buffer<ffi::F32>>()   // var
      .template Arg<ffi::Buffer<ffi::U32>>()   // mask
      .template Ret<Buffer>()                  // dx
      .template Ret<ffi::Buffer<ffi::F32>>()   // dscale
      .template Ret<ffi::Buffer<ffi::F32>>();  // dbias
}

template <typename Grads>
auto BnBackwardRest(Grads&& grads) {
  return std::move(grads)
      .template Ret<Buffer>()  // arena (aliased)
      .template Attr<float>("eps")
      .template Attr<int64_t>("axis")
      .template Attr<int64_t>("workspace_offset");
}

template <typename Context, bool kAdd>
auto BnBackwardBinding() {
  if constexpr (kAdd) {
    return BnBackwardRest(BnBackwardGrads<Context>().template Ret<Buffer>());  // dz
  } else {
    return BnBackwardRest(BnBackwardGrads<Context>());
  }
}

}  // namespace jgsess

JGSESS_DECLARE_HANDLERS(BatchNormRelu);
JGSESS_DECLARE_HANDLERS(BatchNormAddRelu);
JGSESS_DECLARE_HANDLERS(BatchNormReluGrad);
JGSESS_DECLARE_HANDLERS(BatchNormAddReluGrad);
