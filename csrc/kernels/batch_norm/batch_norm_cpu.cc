// Training-mode BatchNorm + (add +) ReLU on the CPU: all cores, the CPU's widest vectors
// (common/simd.h) over the contiguous axis (channels for NHWC, the spatial run for NCHW).
// Per-task partial sums (f32 within blocks of rows, f64 across) live in the workspace arena and
// are added in a fixed order, so results do not depend on the thread count.
#include <algorithm>
#include <numeric>
#include <vector>

#include "common/ffi.h"
#include "common/multi_tensor_cpu.h"
#include "common/parallel.h"
#include "common/relu_bits.h"
#include "common/simd.h"
#include "common/tensor_list.h"
#include "kernels/batch_norm/batch_norm.h"

namespace jgsess {
namespace {

using F32Buffer = ffi::Buffer<ffi::F32>;
using MaskBuffer = ffi::Buffer<ffi::U32>;

// Rows of `outer` per task: BnSplits(s) tasks at most, and every task's first element a multiple
// of 32, so each task owns whole mask words.
struct Tasks {
  int64_t rows, count;
  explicit Tasks(const BnShape& s) {
    const int64_t row = s.channels * s.inner;
    const int64_t align = 32 / std::gcd<int64_t>(std::max<int64_t>(row, 1), 32);
    rows = (s.outer + BnSplits(s) - 1) / BnSplits(s);
    rows = std::max<int64_t>(align, (rows + align - 1) / align * align);
    count = (s.outer + rows - 1) / rows;
  }
  int64_t begin(int64_t t) const { return t * rows; }
  int64_t end(int64_t t, const BnShape& s) const { return std::min(s.outer, begin(t) + rows); }
};

// f32 view of `n` elements at `offset`: the buffer itself for f32, else a widened copy.
const float* Row(DataType type, const void* data, int64_t offset, int64_t n,
                 std::vector<float>& scratch) {
  if (type == DataType::F32) return static_cast<const float*>(data) + offset;
  scratch.resize(static_cast<size_t>(n));
  LoadF32(type, data, offset, n, scratch.data());
  return scratch.data();
}

// Rounds v[0, n) to `type`'s precision in place (the values XLA holds after a convert).
void RoundRow(DataType type, float* v, int64_t n) {
  if (type == DataType::F32) return;
  thread_local std::vector<uint16_t> narrow;
  narrow.resize(static_cast<size_t>(n));
  StoreF32(type, v, narrow.data(), 0, n);
  LoadF32(type, narrow.data(), 0, n, v);
}

// Rows are summed in f32 in blocks of kBlockRows (values already shifted or centred, so a
// block's f32 sum loses nothing that matters), and the blocks' sums in f64.
constexpr int64_t kBlockRows = 16;

// Adds per-channel sums of (p(k, c), q(k, c)) over rows [r0, r1) into sum[C], sq[C] (f64).
// row(r) gives the f32 values of row r, p and q the terms of its element k of channel c.
template <typename RowFn, typename P, typename Q>
void SumRows(const BnShape& s, int64_t r0, int64_t r1, double* sum, double* sq, RowFn row, P p,
             Q q) {
  const int64_t C = s.channels, inner = s.inner;
  thread_local std::vector<float> fs, fq;
  fs.resize(static_cast<size_t>(C));
  fq.resize(static_cast<size_t>(C));
  for (int64_t b = r0; b < r1; b += kBlockRows) {
    std::fill(fs.begin(), fs.end(), 0.0f);
    std::fill(fq.begin(), fq.end(), 0.0f);
    float* a = fs.data();
    float* a2 = fq.data();
    for (int64_t r = b; r < std::min(r1, b + kBlockRows); ++r) {
      const auto v = row(r);
      if (inner == 1) {
        SimdFor(C, [&](int64_t c) {
          a[c] += p(v, c, c);
          a2[c] += q(v, c, c);
        });
        continue;
      }
      for (int64_t c = 0; c < C; ++c) {
        float x = 0.0f, y = 0.0f;
#pragma omp simd reduction(+ : x, y)
        for (int64_t i = 0; i < inner; ++i) {
          x += p(v, c * inner + i, c);
          y += q(v, c * inner + i, c);
        }
        a[c] += x;
        a2[c] += y;
      }
    }
    for (int64_t c = 0; c < C; ++c) {
      sum[c] += a[c];
      sq[c] += a2[c];
    }
  }
}

// Adds the tasks' partial sums in order: total[0][C], total[1][C].
void Total(const double* partial, int64_t tasks, int64_t C, std::vector<double>& total) {
  total.assign(static_cast<size_t>(2 * C), 0.0);
  for (int64_t t = 0; t < tasks; ++t) {
    for (int64_t k = 0; k < 2 * C; ++k) total[k] += partial[t * 2 * C + k];
  }
}

// Pass 1 of the forward: per task, each channel's sums of x - shift and of its square (the
// shift, each channel's first element, keeps them stable) into work[t * 2C, (t + 1) * 2C).
void ForwardSums(ffi::ThreadPool& pool, const BnShape& s, const Tasks& tasks, DataType xt,
                 const void* xd, const float* shift, double* work) {
  const int64_t C = s.channels, row = C * s.inner;
  ParallelFor(pool, tasks.count, [&](int64_t t) {
    thread_local std::vector<float> xs;
    double* sum = work + t * 2 * C;
    std::fill(sum, sum + 2 * C, 0.0);
    SumRows(
        s, tasks.begin(t), tasks.end(t, s), sum, sum + C,
        [&](int64_t r) { return Row(xt, xd, r * row, row, xs); },
        [shift](const float* v, int64_t i, int64_t c) { return v[i] - shift[c]; },
        [shift](const float* v, int64_t i, int64_t c) {
          return (v[i] - shift[c]) * (v[i] - shift[c]);
        });
  });
}

// Pass 2 of the forward: y = relu((x - mean) * a + beta (+ z)), each step rounded to y's dtype
// as XLA's code rounds it, and the mask of y > 0.
template <bool kAdd>
void NormalizeRows(ffi::ThreadPool& pool, const BnShape& s, const Tasks& tasks, DataType xt,
                   const void* xd, DataType yt, const void* zd, const float* mu, const float* a,
                   const float* beta, uint32_t* words, void* yd) {
  const int64_t C = s.channels, inner = s.inner, row = C * inner;
  ParallelFor(pool, tasks.count, [&](int64_t t) {
    thread_local std::vector<float> xs, zs, out;
    out.resize(static_cast<size_t>(row));
    const int64_t r0 = tasks.begin(t), r1 = tasks.end(t, s);
    std::fill(words + r0 * row / 32, words + (r1 * row + 31) / 32, 0u);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t start = r * row;
      const float* v = Row(xt, xd, start, row, xs);
      float* o = out.data();
      if (inner == 1) {
        SimdFor(C, [&](int64_t c) { o[c] = (v[c] - mu[c]) * a[c] + beta[c]; });
      } else {
        for (int64_t c = 0; c < C; ++c) {
          const float m = mu[c], ac = a[c], bc = beta[c];
          const float* in = v + c * inner;
          float* oc = o + c * inner;
          SimdFor(inner, [&](int64_t i) { oc[i] = (in[i] - m) * ac + bc; });
        }
      }
      RoundRow(yt, o, row);
      if constexpr (kAdd) {
        const float* w = Row(yt, zd, start, row, zs);
        SimdFor(row, [&](int64_t k) { o[k] = o[k] + w[k]; });
        RoundRow(yt, o, row);
      }
      PackPositive(o, start, row, words);
      SimdFor(row, [&](int64_t k) { o[k] = (o[k] > 0.0f || o[k] != o[k]) ? o[k] : 0.0f; });
      StoreF32(yt, o, yd, start, row);
    }
  });
}

template <bool kAdd>
ffi::Error ForwardImpl(ffi::ThreadPool& pool, Buffer& arena, Buffer& x, F32Buffer& scale,
                       F32Buffer& bias, const Buffer* z, float eps, int64_t axis,
                       int64_t workspace_offset, Buffer& y, F32Buffer& mean, F32Buffer& var,
                       MaskBuffer& mask) {
  auto shape = BnForwardShape(x, scale, bias, z, axis, y, mean, var, mask);
  if (shape.has_error()) return shape.error();
  const BnShape s = *shape;
  const int64_t C = s.channels;
  auto workspace = BnWorkspace(arena, workspace_offset, s);
  if (workspace.has_error()) return workspace.error();
  double* const work = reinterpret_cast<double*>(*workspace);
  const Tasks tasks(s);
  const DataType xt = x.element_type();
  const void* xd = x.untyped_data();
  // an empty batch has no shift, and its statistics are 0 / 0
  std::vector<float> shift(C), scratch;
  if (s.count() > 0) {
    const float* first = Row(xt, xd, 0, C * s.inner, scratch);
    for (int64_t c = 0; c < C; ++c) shift[c] = first[c * s.inner];
  }
  ForwardSums(pool, s, tasks, xt, xd, shift.data(), work);
  std::vector<double> total;
  Total(work, tasks.count, C, total);
  float* mu = mean.typed_data();
  std::vector<float> a(C);
  for (int64_t c = 0; c < C; ++c) {
    const double m = static_cast<double>(s.count()), d = total[c] / m;
    mu[c] = static_cast<float>(shift[c] + d);
    var.typed_data()[c] = BnVariance(total[C + c] / m, d);
    a[c] = BnInvStd(var.typed_data()[c], eps) * scale.typed_data()[c];
  }
  NormalizeRows<kAdd>(pool, s, tasks, xt, xd, y.element_type(),
                      z != nullptr ? z->untyped_data() : nullptr, mu, a.data(), bias.typed_data(),
                      mask.typed_data(), y.untyped_data());
  return ffi::Error::Success();
}

// Pass 1 of the backward: per task, each channel's sums of g and of g * (x - mean), g being
// dy gated by the mask, into work[t * 2C, (t + 1) * 2C); and dz = g.
template <bool kAdd>
void BackwardSums(ffi::ThreadPool& pool, const BnShape& s, const Tasks& tasks, DataType xt,
                  const void* xd, DataType gt, const void* gd, const uint32_t* words,
                  const float* mu, void* dzd, double* work) {
  const int64_t C = s.channels, row = C * s.inner;
  ParallelFor(pool, tasks.count, [&](int64_t t) {
    thread_local std::vector<float> xs, gs, g;
    g.resize(static_cast<size_t>(row));
    double* sum = work + t * 2 * C;
    std::fill(sum, sum + 2 * C, 0.0);
    const float* v = nullptr;
    auto load = [&](int64_t r) {
      const int64_t start = r * row;
      v = Row(xt, xd, start, row, xs);
      GateByMask(words, start, row, Row(gt, gd, start, row, gs), g.data());
      if constexpr (kAdd) StoreF32(gt, g.data(), dzd, start, row);
      return g.data();
    };
    SumRows(
        s, tasks.begin(t), tasks.end(t, s), sum, sum + C, load,
        [](const float* gv, int64_t i, int64_t) { return gv[i]; },
        [&](const float* gv, int64_t i, int64_t c) { return gv[i] * (v[i] - mu[c]); });
  });
}

// Pass 2 of the backward: dx = a * (g - b - (x - mean) * c), per channel's coefficients.
void GradRows(ffi::ThreadPool& pool, const BnShape& s, const Tasks& tasks, DataType xt,
              const void* xd, DataType gt, const void* gd, const uint32_t* words, const float* mu,
              const BnGradCoef* coef, void* dxd) {
  const int64_t C = s.channels, inner = s.inner, row = C * inner;
  ParallelFor(pool, tasks.count, [&](int64_t t) {
    thread_local std::vector<float> xs, gs, out;
    out.resize(static_cast<size_t>(row));
    for (int64_t r = tasks.begin(t); r < tasks.end(t, s); ++r) {
      const int64_t start = r * row;
      const float* v = Row(xt, xd, start, row, xs);
      float* o = out.data();
      GateByMask(words, start, row, Row(gt, gd, start, row, gs), o);
      if (inner == 1) {
        SimdFor(C, [&](int64_t c) {
          o[c] = coef[c].a * (o[c] - coef[c].b - (v[c] - mu[c]) * coef[c].c);
        });
      } else {
        for (int64_t c = 0; c < C; ++c) {
          const BnGradCoef k = coef[c];
          const float m = mu[c];
          float* oc = o + c * inner;
          const float* in = v + c * inner;
          SimdFor(inner, [&](int64_t i) { oc[i] = k.a * (oc[i] - k.b - (in[i] - m) * k.c); });
        }
      }
      StoreF32(xt, o, dxd, start, row);
    }
  });
}

template <bool kAdd>
ffi::Error BackwardImpl(ffi::ThreadPool& pool, Buffer& arena, Buffer& dy, Buffer& x,
                        F32Buffer& scale, F32Buffer& mean, F32Buffer& var, MaskBuffer& mask,
                        float eps, int64_t axis, int64_t workspace_offset, Buffer& dx,
                        F32Buffer& dscale, F32Buffer& dbias, Buffer* dz) {
  auto shape = BnBackwardShape(dy, x, scale, mean, var, mask, axis, dx, dscale, dbias, dz);
  if (shape.has_error()) return shape.error();
  const BnShape s = *shape;
  const int64_t C = s.channels;
  auto workspace = BnWorkspace(arena, workspace_offset, s);
  if (workspace.has_error()) return workspace.error();
  double* const work = reinterpret_cast<double*>(*workspace);
  const Tasks tasks(s);
  const DataType xt = x.element_type(), gt = dy.element_type();
  const float* mu = mean.typed_data();
  BackwardSums<kAdd>(pool, s, tasks, xt, x.untyped_data(), gt, dy.untyped_data(), mask.typed_data(),
                     mu, dz != nullptr ? dz->untyped_data() : nullptr, work);
  std::vector<double> total;
  Total(work, tasks.count, C, total);
  std::vector<BnGradCoef> coef(C);
  for (int64_t c = 0; c < C; ++c) {
    const float sigma2 = var.typed_data()[c];
    dbias.typed_data()[c] = static_cast<float>(total[c]);
    dscale.typed_data()[c] = BnInvStd(sigma2, eps) * static_cast<float>(total[C + c]);
    coef[c] = BnGradCoefOf(scale.typed_data()[c], sigma2, eps, total[c], total[C + c], s.count());
  }
  GradRows(pool, s, tasks, xt, x.untyped_data(), gt, dy.untyped_data(), mask.typed_data(), mu,
           coef.data(), dx.untyped_data());
  return ffi::Error::Success();
}

ffi::Error BatchNormReluCpuImpl(ffi::ThreadPool pool, Buffer arena, Buffer x, F32Buffer scale,
                                F32Buffer bias, ffi::Result<Buffer> y, ffi::Result<F32Buffer> mean,
                                ffi::Result<F32Buffer> var, ffi::Result<MaskBuffer> mask,
                                ffi::Result<Buffer>, float eps, int64_t axis,
                                int64_t workspace_offset) {
  return ForwardImpl<false>(pool, arena, x, scale, bias, nullptr, eps, axis, workspace_offset, *y,
                            *mean, *var, *mask);
}

ffi::Error BatchNormAddReluCpuImpl(ffi::ThreadPool pool, Buffer arena, Buffer x, F32Buffer scale,
                                   F32Buffer bias, Buffer z, ffi::Result<Buffer> y,
                                   ffi::Result<F32Buffer> mean, ffi::Result<F32Buffer> var,
                                   ffi::Result<MaskBuffer> mask, ffi::Result<Buffer>, float eps,
                                   int64_t axis, int64_t workspace_offset) {
  return ForwardImpl<true>(pool, arena, x, scale, bias, &z, eps, axis, workspace_offset, *y, *mean,
                           *var, *mask);
}

ffi::Error BatchNormReluGradCpuImpl(ffi::ThreadPool pool, Buffer arena, Buffer dy, Buffer x,
                                    F32Buffer scale, F32Buffer mean, F32Buffer var, MaskBuffer mask,
                                    ffi::Result<Buffer> dx, ffi::Result<F32Buffer> dscale,
                                    ffi::Result<F32Buffer> dbias, ffi::Result<Buffer>, float eps,
                                    int64_t axis, int64_t workspace_offset) {
  return BackwardImpl<false>(pool, arena, dy, x, scale, mean, var, mask, eps, axis,
                             workspace_offset, *dx, *dscale, *dbias, nullptr);
}

ffi::Error BatchNormAddReluGradCpuImpl(ffi::ThreadPool pool, Buffer arena, Buffer dy, Buffer x,
                                       F32Buffer scale, F32Buffer mean, F32Buffer var,
                                       MaskBuffer mask, ffi::Result<Buffer> dx,
                                       ffi::Result<F32Buffer> dscale, ffi::Result<F32Buffer> dbias,
                                       ffi::Result<Buffer> dz, ffi::Result<Buffer>, float eps,
                                       int64_t axis, int64_t workspace_offset) {
  return BackwardImpl<true>(pool, arena, dy, x, scale, mean, var, mask, eps, axis, workspace_offset,
                            *dx, *dscale, *dbias, &(*dz));
}

}  // namespace
}  // namespace jgsess

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchNormReluCpu, jgsess::BatchNormReluCpuImpl,
                              (jgsess::BnForwardBinding<xla::ffi::ThreadPool, false>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchNormAddReluCpu, jgsess::BatchNormAddReluCpuImpl,
                              (jgsess::BnForwardBinding<xla::ffi::ThreadPool, true>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchNormReluGradCpu, jgsess::BatchNormReluGradCpuImpl,
                              (jgsess::BnBackwardBinding<xla::ffi::ThreadPool, false>()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(BatchNormAddReluGradCpu, jgsess::BatchNormAddReluGradCpuImpl,
                              (jgsess::BnBackwardBinding<xla::ffi::ThreadPool, true>()));
