// CPU work sharing for multi-tensor kernels.
//
// A group of tensors is cut into chunks of a fixed number of elements. Chunks run across tensor
// boundaries, so the work splits by bytes, not by tensor: 200 small tensors and one large one
// give every thread the same share. Threads come from XLA's intra-op pool; the calling thread
// works too and only waits for chunks that another thread is already running, so a busy pool
// can slow a call down but never deadlock it.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "common/ffi.h"

namespace jgsess {

// Elements per chunk: 256 KiB of f32 per stream, so a thread streams long runs (the hardware
// prefetchers like that) while two to a few dozen threads still balance.
constexpr int64_t kCpuChunk = 65536;

// Prefix sums of tensor sizes: tensor t covers [offsets[t], offsets[t+1]) of the group.
class TensorGroup {
 public:
  explicit TensorGroup(const std::vector<int64_t>& sizes) : offsets_(sizes.size() + 1, 0) {
    for (size_t t = 0; t < sizes.size(); ++t) offsets_[t + 1] = offsets_[t] + sizes[t];
  }
  int64_t total() const { return offsets_.back(); }
  int64_t num_chunks() const { return (total() + kCpuChunk - 1) / kCpuChunk; }

  // Calls f(tensor, begin, end) for the pieces of every tensor that chunk c covers.
  template <typename F>
  void ForChunk(int64_t c, F&& f) const {
    int64_t lo = c * kCpuChunk, hi = std::min(total(), lo + kCpuChunk);
    size_t t = std::upper_bound(offsets_.begin(), offsets_.end(), lo) - offsets_.begin() - 1;
    for (; t + 1 < offsets_.size() && offsets_[t] < hi; ++t) {
      int64_t begin = std::max(lo, offsets_[t]) - offsets_[t];
      int64_t end = std::min(hi, offsets_[t + 1]) - offsets_[t];
      if (begin < end) f(t, begin, end);
    }
  }

 private:
  std::vector<int64_t> offsets_;
};

// ParallelFor calls in progress in this process. With several devices on one host (a mesh of
// CPU devices) each device's program calls its own kernel at the same time, and each of those
// callers already keeps a core busy.
inline std::atomic<int>& CallsInProgress() {
  static std::atomic<int> calls{0};
  return calls;
}

// Runs body(c) for c in [0, n) on the pool and the calling thread; returns when all are done.
template <typename F>
void ParallelFor(ffi::ThreadPool& pool, int64_t n, F body) {
  if (n <= 0) return;
  struct Shared {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto shared = std::make_shared<Shared>();
  auto work = [shared, n, body]() {
    for (int64_t c; (c = shared->next.fetch_add(1, std::memory_order_relaxed)) < n;) {
      body(c);
      shared->done.fetch_add(1, std::memory_order_release);
    }
  };
  // the caller is one of the workers, and so is every other call in progress: more helpers
  // than the cores they leave would only compete with them (one thread already draws most of
  // the memory bandwidth)
  const int busy = CallsInProgress().fetch_add(1, std::memory_order_relaxed) + 1;
  static const int cores = std::max(1u, std::thread::hardware_concurrency());
  const int64_t threads = std::min<int64_t>(pool.num_threads(), cores);
  const int64_t helpers = std::clamp<int64_t>(threads - busy, 0, n - 1);
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([work] { work(); });
  work();
  while (shared->done.load(std::memory_order_acquire) < n) std::this_thread::yield();
  CallsInProgress().fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace jgsess
