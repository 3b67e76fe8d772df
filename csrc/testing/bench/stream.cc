// Bandwidth probes on the CPU with every hardware thread and the kernels' vectors (SimdFor),
// measured in the benchmarks' own process: the in-place stream with an optimizer's exact traffic
// (their ceiling) and the STREAM triad (a = b + s*c, a second reference that pays write-allocate
// traffic for `a`).
#include "testing/bench/stream.h"

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

// Widening / narrowing of the parameter or state type: f32 as is, bf16 bit patterns by a shift
// (the probe measures memory traffic, so the narrowing truncates instead of rounding).
inline float Widen(float x) { return x; }
inline float Widen(uint16_t x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}
template <typename T>
inline T Narrow(float x) {
  if constexpr (sizeof(T) == sizeof(float)) {
    return x;
  } else {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    return static_cast<T>(bits >> 16);
  }
}

// p, g (Param: f32 or bf16 bits), the first state array (First: f32 or bf16 bits, as optax's
// mu_dtype / accumulator_dtype) and for AdamW a second one (Rest: v, f32 or bf16 bits); a +=
// b*c-like work per element, each written array in place.
template <typename Param, typename First, typename Rest>
double InplaceSeconds(int64_t n, int reads, int writes, int repeats) {
  const int threads = HardwareThreads();
  std::unique_ptr<Param[]> p(new Param[n]), g(new Param[n]);
  std::unique_ptr<First[]> first(new First[n]);
  std::unique_ptr<Rest[]> second(reads > 3 ? new Rest[n] : nullptr);
  Param *pp = p.get(), *pg = g.get();
  First* pa = first.get();
  Rest* pb = second.get();
  const bool adamw = reads == 4 && writes == 3;  // else momentum: p, acc written
  OnEveryThread(threads, n, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      pp[i] = Narrow<Param>(1.0f), pg[i] = Narrow<Param>(2.0f), pa[i] = Narrow<First>(0.5f);
      if (adamw) pb[i] = Narrow<Rest>(0.5f);
    }
  });
  auto run = [&] {
    OnEveryThread(threads, n, [=](int64_t begin, int64_t end) {
      Param *p = pp + begin, *g = pg + begin;
      First* a = pa + begin;
      Rest* b = pb + (adamw ? begin : 0);
      if (adamw) {  // p, m, v written
        SimdFor(end - begin, [&](int64_t i) {
          const float gi = Widen(g[i]);
          const float ai = Widen(a[i]) * 0.5f + gi;
          const float bi = Widen(b[i]) * 0.5f + gi;
          a[i] = Narrow<First>(ai);
          b[i] = Narrow<Rest>(bi);
          p[i] = Narrow<Param>(Widen(p[i]) - ai * bi);
        });
      } else {
        SimdFor(end - begin, [&](int64_t i) {
          const float ai = Widen(a[i]) * 0.5f + Widen(g[i]);
          a[i] = Narrow<First>(ai);
          p[i] = Narrow<Param>(Widen(p[i]) - ai);
        });
      }
    });
  };
  return BestSeconds(repeats, run);
}

// InplaceSeconds with each array's element type (p and g, m, v) from its bytes: 4 f32, 2 bf16.
template <typename... Chosen>
double InplaceSecondsOf(int64_t n, int reads, int writes, int repeats, const int* bytes) {
  if constexpr (sizeof...(Chosen) == 3) {
    return InplaceSeconds<Chosen...>(n, reads, writes, repeats);
  } else if (*bytes == 4) {
    return InplaceSecondsOf<Chosen..., float>(n, reads, writes, repeats, bytes + 1);
  } else {
    return InplaceSecondsOf<Chosen..., uint16_t>(n, reads, writes, repeats, bytes + 1);
  }
}

}  // namespace

double StreamInplaceGbps(int64_t n, int reads, int writes, int param_bytes, int state_bytes,
                         int repeats, int rest_bytes) {
  const bool adamw = reads == 4 && writes == 3, momentum = reads == 3 && writes == 2;
  auto known = [](int bytes) { return bytes == 4 || bytes == 2; };
  if (!(adamw || momentum) || !known(param_bytes) || !known(state_bytes) || !known(rest_bytes) ||
      n <= 0) {
    return 0.0;
  }
  const int bytes[3] = {param_bytes, state_bytes, rest_bytes};
  const double seconds = InplaceSecondsOf<>(n, reads, writes, repeats, bytes);
  // p and g, the first state array, the others (v); read, and all but g written back
  const double per_array = 2.0 * param_bytes + state_bytes + rest_bytes * (reads - 3.0);
  const double bytes_moved = per_array + (param_bytes + state_bytes + rest_bytes * (writes - 2.0));
  return bytes_moved * static_cast<double>(n) / seconds / 1e9;
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
