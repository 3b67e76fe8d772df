// STREAM triad (a = b + s*c) on the CPU with every hardware thread: the memory-bandwidth
// ceiling the optimizer benchmarks compare their kernels with, measured in the same process.
#include "bench/stream.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

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

}  // namespace

double StreamTriadGbps(int64_t n, int repeats) {
  const int threads = std::max(1u, std::thread::hardware_concurrency());
  // uninitialized storage, first touched by the thread that later streams through it
  std::unique_ptr<float[]> a(new float[n]), b(new float[n]), c(new float[n]);
  float *pa = a.get(), *pb = b.get(), *pc = c.get();
  OnEveryThread(threads, n, [=](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) pa[i] = 0.0f, pb[i] = 1.0f, pc[i] = 2.0f;
  });
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    OnEveryThread(threads, n, [=](int64_t begin, int64_t end) {
#pragma omp simd
      for (int64_t i = begin; i < end; ++i) pa[i] = pb[i] + 3.0f * pc[i];
    });
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    best = std::min(best, took.count());
  }
  return 3.0 * sizeof(float) * static_cast<double>(n) / best / 1e9;
}

}  // namespace jgsess
