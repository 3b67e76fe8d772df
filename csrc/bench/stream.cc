// Bandwidth probes on the CPU with every hardware thread and the kernels' vectors (SimdFor),
// measured in the benchmarks' own process: the in-place stream with an optimizer's exact traffic
// (their ceiling) and the STREAM triad (a = b + s*c, a second reference that pays write-allocate
// traffic for `a`).
#include "bench/stream.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "common/simd.h"

namespace jgsess {
namespace {

template <typename F>
void OnEveryThread(int threads, int64_t n, F body) {
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    const int64_t begin = n * t / threads, end = n * (t + 1) / threads;
    pool.emplace_back([=] { body(begin, end); });
  }
  for (auto& thread : pool) thread.join();
}

template <typename F>
double BestSeconds(int repeats, F run) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    run();
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count());
  }
  return best;
}

int HardwareThreads() { return std::max(1u, std::thread::hardware_concurrency()); }

// Widening / narrowing of the parameter type: f32 as is, bf16 bit patterns by a shift (the
// probe measures memory traffic, so the narrowing truncates instead of rounding).
inline float Widen(float x) { return x; }
inline float Widen(uint16_t x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
template <typename Param>
inline Param Narrow(float x) {
  if constexpr (sizeof(Param) == sizeof(float)) {
    return x;
  } else {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    return static_cast<Param>(bits >> 16);
  }
}

// p, g (Param: f32 or bf16 bits) and up to three f32 state arrays; a_k += b*c-like work per
// element, each written array in place.
template <typename Param>
double InplaceSeconds(int64_t n, int reads, int writes, int repeats) {
  const int threads = HardwareThreads();
  std::unique_ptr<Param[]> p(new Param[n]), g(new Param[n]);
  std::vector<std::unique_ptr<float[]>> state;
  for (int k = 2; k < reads; ++k) state.emplace_back(new float[n]);
  Param *pp = p.get(), *pg = g.get();
  float* ps[3] = {nullptr, nullptr, nullptr};
  for (int k = 2; k < reads; ++k) ps[k - 2] = state[k - 2].get();
  const int nstate = reads - 2, wstate = writes - 1;
  OnEveryThread(threads, n, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      pp[i] = Narrow<Param>(1.0f), pg[i] = Narrow<Param>(2.0f);
      for (int k = 0; k < nstate; ++k) ps[k][i] = 0.5f;
    }
  });
  auto run = [&] {
    OnEveryThread(threads, n, [=](int64_t begin, int64_t end) {
      float* s0 = ps[0];
      float* s1 = nstate > 1 ? ps[1] : ps[0];
      Param *p = pp + begin, *g = pg + begin;
      float *a = s0 + begin, *b = s1 + begin;
      if (nstate == 2 && wstate == 2) {  // AdamW: p, m, v written
        SimdFor(end - begin, [&](int64_t i) {
          const float gi = Widen(g[i]);
          a[i] = a[i] * 0.5f + gi;
          b[i] = b[i] * 0.5f + gi;
          p[i] = Narrow<Param>(Widen(p[i]) - a[i] * b[i]);
        });
      } else {  // momentum: p, acc written
        SimdFor(end - begin, [&](int64_t i) {
          a[i] = a[i] * 0.5f + Widen(g[i]);
          p[i] = Narrow<Param>(Widen(p[i]) - a[i]);
        });
      }
    });
  };
  return BestSeconds(repeats, run);
}

}  // namespace

double StreamInplaceGbps(int64_t n, int reads, int writes, int param_bytes, int repeats) {
  const bool adamw = reads == 4 && writes == 3, momentum = reads == 3 && writes == 2;
  if (!(adamw || momentum) || !(param_bytes == 4 || param_bytes == 2) || n <= 0) return 0.0;
  const double seconds = param_bytes == 4 ? InplaceSeconds<float>(n, reads, writes, repeats)
                                          : InplaceSeconds<uint16_t>(n, reads, writes, repeats);
  const double bytes = (2.0 * param_bytes + 4.0 * (reads - 2)) + (param_bytes + 4.0 * (writes - 1));
  return bytes * static_cast<double>(n) / seconds / 1e9;
}

double StreamTriadGbps(int64_t n, int repeats) {
  const int threads = HardwareThreads();
  // uninitialized storage, first touched by the thread that later streams through it
  std::unique_ptr<float[]> a(new float[n]), b(new float[n]), c(new float[n]);
  float *pa = a.get(), *pb = b.get(), *pc = c.get();
  OnEveryThread(threads, n, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) pa[i] = 0.0f, pb[i] = 1.0f, pc[i] = 2.0f;
  });
  const double best = BestSeconds(repeats, [&] {
    OnEveryThread(threads, n, [=](int64_t begin, int64_t end) {
      float *a = pa + begin, *b = pb + begin, *c = pc + begin;
      SimdFor(end - begin, [&](int64_t i) { a[i] = b[i] + 3.0f * c[i]; });
    });
  });
  return 3.0 * sizeof(float) * static_cast<double>(n) / best / 1e9;
}

}  // namespace jgsess
