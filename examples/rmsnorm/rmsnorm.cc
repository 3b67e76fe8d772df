// A fused RMSNorm for the CPU, forward and backward, as XLA FFI handlers: the example of
// registering your own kernel with jgsess (examples/rmsnorm/README.md). Built against jax's
// FFI headers alone (jax.ffi.include_dir()); nothing of jgsess.
//
//   RmsNorm     y  = x * (r * scale),                 r = rsqrt(mean(x * x) + eps) per row
//   RmsNormDx   dx = r * g - x * (r^3 * mean(g * x)),  g = dy * scale
//
// x, y, dy, dx: f32[..., D] (rows of D, row-major); scale: f32[D]. Rows are split in chunks
// over XLA's intra-op thread pool and the calling thread; each row's loops are vectorized.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kChunkElements = 1 << 15;  // ~128 KB of a row block: tens of microseconds

// Runs rows(first, last) over [0, rows) in chunks on the pool and this thread. The caller takes
// chunks too, so a busy pool never stalls the call: it only waits for chunks already running.
template <typename F>
void ForRows(ffi::ThreadPool& pool, int64_t rows, int64_t width, F body) {
  const int64_t per_chunk = std::max<int64_t>(1, kChunkElements / std::max<int64_t>(width, 1));
  const int64_t chunks = (rows + per_chunk - 1) / per_chunk;
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto state = std::make_shared<State>();
  auto work = [state, chunks, per_chunk, rows, body] {
    for (int64_t c; (c = state->next.fetch_add(1)) < chunks;) {
      body(c * per_chunk, std::min(rows, (c + 1) * per_chunk));
      state->done.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t cores = std::max(1u, std::thread::hardware_concurrency());
  const int64_t helpers = std::min<int64_t>({pool.num_threads(), cores, chunks}) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule(decltype(work)(work));
  work();
  while (state->done.load(std::memory_order_acquire) < chunks) std::this_thread::yield();
}

float Rsqrt(const float* x, int64_t d, float eps) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < d; ++i) sum += x[i] * x[i];
  return 1.0f / std::sqrt(sum / static_cast<float>(d) + eps);
}

ffi::Error Check(const ffi::Buffer<ffi::F32>& x, const ffi::Buffer<ffi::F32>& scale) {
  auto dims = x.dimensions();
  if (dims.size() < 1 || scale.dimensions().size() != 1 ||
      scale.dimensions()[0] != dims[dims.size() - 1]) {
    return ffi::Error::InvalidArgument("rms_norm: x is [..., D] and scale [D]");
  }
  return ffi::Error::Success();
}

ffi::Error RmsNormImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> scale,
                       ffi::ResultBuffer<ffi::F32> y, float eps) {
  if (auto error = Check(x, scale); error.failure()) return error;
  const int64_t d = scale.element_count();
  const int64_t rows = d == 0 ? 0 : x.element_count() / d;
  const float* xs = x.typed_data();
  const float* s = scale.typed_data();
  float* ys = y->typed_data();
  ForRows(pool, rows, d, [=](int64_t first, int64_t last) {
    for (int64_t row = first; row < last; ++row) {
      const float* xr = xs + row * d;
      float* yr = ys + row * d;
      const float r = Rsqrt(xr, d, eps);
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] * (r * s[i]);
    }
  });
  return ffi::Error::Success();
}

ffi::Error RmsNormDxImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> scale,
                         ffi::Buffer<ffi::F32> dy, ffi::ResultBuffer<ffi::F32> dx, float eps) {
  if (auto error = Check(x, scale); error.failure()) return error;
  if (dy.element_count() != x.element_count()) {
    return ffi::Error::InvalidArgument("rms_norm_dx: dy is x's shape");
  }
  const int64_t d = scale.element_count();
  const int64_t rows = d == 0 ? 0 : x.element_count() / d;
  const float* xs = x.typed_data();
  const float* s = scale.typed_data();
  const float* dys = dy.typed_data();
  float* out = dx->typed_data();
  ForRows(pool, rows, d, [=](int64_t first, int64_t last) {
    for (int64_t row = first; row < last; ++row) {
      const float* xr = xs + row * d;
      const float* dyr = dys + row * d;
      float* dxr = out + row * d;
      const float r = Rsqrt(xr, d, eps);
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < d; ++i) dot += dyr[i] * s[i] * xr[i];
      const float c = r * r * r * (dot / static_cast<float>(d));
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) dxr[i] = r * (dyr[i] * s[i]) - xr[i] * c;
    }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RmsNorm, RmsNormImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x
                                  .Arg<ffi::Buffer<ffi::F32>>()  // scale
                                  .Ret<ffi::Buffer<ffi::F32>>()  // y
                                  .Attr<float>("eps"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(RmsNormDx, RmsNormDxImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x
                                  .Arg<ffi::Buffer<ffi::F32>>()  // scale
                                  .Arg<ffi::Buffer<ffi::F32>>()  // dy
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dx
                                  .Attr<float>("eps"));
