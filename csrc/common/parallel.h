// CPU work sharing for multi-tensor kernels.
//
// A group of tensors is cut into chunks of a fixed number of elements. Chunks run across tensor
// boundaries, so the work splits by bytes, not by tensor: 200 small tensors and one large one
// give every thread the same share. Threads come from XLA's intra-op pool; the calling thread
// works too and only waits for chunks that another thread is already running, so a busy pool
// can slow a call down but never deadlock it. Concurrent calls (one per device of a CPU mesh)
// share their chunks, oldest call first, so they finish in the order they started.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/chunk.h"
#include "common/ffi.h"

namespace jgsess {

// How often a call whose chunks are all claimed yields while the last ones run before it sleeps.
constexpr int kYieldsBeforeSleep = 64;

// Prefix sums of tensor sizes: tensor t covers [offsets[t], offsets[t+1]) of the group.
class TensorGroup {
 public:
  explicit TensorGroup(const std::vector<int64_t>& sizes) : offsets_(sizes.size() + 1, 0) {
    for (size_t t = 0; t < sizes.size(); ++t) offsets_[t + 1] = offsets_[t] + sizes[t];
  }
  int64_t total() const { return offsets_.back(); }
  int64_t num_chunks() const { return (total() + kChunk - 1) / kChunk; }

  // Calls f(tensor, begin, end) for the pieces of every tensor that chunk c covers.
  template <typename F>
  void ForChunk(int64_t c, F&& f) const {
    int64_t lo = c * kChunk, hi = std::min(total(), lo + kChunk);
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

// A ParallelFor call's chunks, which any thread may claim and run.
class Job {
 public:
  Job(int64_t n, std::function<void(int64_t)> body) : n_(n), body_(std::move(body)) {}

  // Claims the next chunk and runs it; false when every chunk is claimed.
  bool RunOne() {
    const int64_t c = next_.fetch_add(1, std::memory_order_relaxed);
    if (c >= n_) return false;
    body_(c);
    if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      std::lock_guard<std::mutex> lock(mutex_);
      finished_.notify_all();
    }
    return true;
  }
  // Blocks until every chunk has run.
  void Wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [this] { return finished(); });
  }
  bool claimable() const { return next_.load(std::memory_order_relaxed) < n_; }
  bool finished() const { return done_.load(std::memory_order_acquire) >= n_; }

 private:
  const int64_t n_;
  // captures the caller's locals by reference: it runs only while the caller waits in
  // ParallelFor (every claimed chunk finishes before the call returns; later claims fail)
  const std::function<void(int64_t)> body_;
  std::atomic<int64_t> next_{0};
  std::atomic<int64_t> done_{0};
  std::mutex mutex_;
  std::condition_variable finished_;
};

// The ParallelFor calls in progress in this process, oldest first. With several devices on one
// host (a mesh of CPU devices) each device's program calls its own kernel at the same time, on
// its own thread (one of PjRt's, which it holds until the program ends). Every thread runs the
// oldest call's chunks first: no call finishes alone on one core while the others idle, and the
// calls end one after another rather than all at the end, so the threads of the devices done
// first are free to launch the next step while the others' chunks still run.
class Jobs {
 public:
  static Jobs& Get() {
    static Jobs jobs;
    return jobs;
  }

  // Registers a call; returns how many are in progress, this one included.
  int Add(std::shared_ptr<Job> job) {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back(std::move(job));
    return static_cast<int>(jobs_.size());
  }
  void Remove(const Job* job) {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.erase(std::find_if(jobs_.begin(), jobs_.end(),
                             [job](const std::shared_ptr<Job>& j) { return j.get() == job; }));
  }
  // How many times a call's thread has slept waiting for its chunks on other threads.
  int64_t parked() const { return parked_.load(std::memory_order_relaxed); }
  void Park(Job& job) {
    parked_.fetch_add(1, std::memory_order_relaxed);
    job.Wait();
  }

  // The oldest call in progress with chunks left to claim, or null.
  std::shared_ptr<Job> Claimable() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& job : jobs_) {
      if (job->claimable()) return job;
    }
    return nullptr;
  }

 private:
  std::mutex mutex_;
  std::vector<std::shared_ptr<Job>> jobs_;
  std::atomic<int64_t> parked_{0};
};

// A helper on the pool: runs the oldest call's chunks until no call has any left.
inline void Help() {
  while (auto job = Jobs::Get().Claimable()) {
    while (job->RunOne()) {
    }
  }
}

// Runs body(c) for c in [0, n) on the pool and the calling thread; returns when all are done.
// Pool: XLA's ffi::ThreadPool, or anything with its num_threads() and Schedule(task).
template <typename Pool, typename F>
void ParallelFor(Pool& pool, int64_t n, F body) {
  if (n <= 0) return;
  auto job = std::make_shared<Job>(n, body);
  // the caller is one of the workers, and so is every other call in progress: more helpers
  // than the cores they leave would only compete with them (one thread already draws most of
  // the memory bandwidth)
  const int busy = Jobs::Get().Add(job);
  static const int cores = std::max(1u, std::thread::hardware_concurrency());
  const int64_t threads = std::min<int64_t>(pool.num_threads(), cores);
  const int64_t helpers = std::clamp<int64_t>(threads - busy, 0, n - 1);
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([] { Help(); });
  // this thread runs the oldest call's chunks (its own once the older ones are claimed; a call
  // stays the oldest with chunks until they are all claimed, since newer calls queue behind it);
  // when its own last chunks run on other threads and no call has chunks left, it yields a while
  // (a chunk is tens of microseconds), then sleeps: on a mesh of CPU devices more threads than
  // cores wait so, and a spinning one takes a core from those working
  for (int idle = 0; !job->finished();) {
    if (auto oldest = Jobs::Get().Claimable()) {
      while (oldest->RunOne()) {
      }
      idle = 0;
    } else if (++idle < kYieldsBeforeSleep) {
      std::this_thread::yield();
    } else {
      Jobs::Get().Park(*job);
    }
  }
  Jobs::Get().Remove(job.get());
  // this thread's core is free while other calls still have chunks: a helper takes it
  if (Jobs::Get().Claimable() != nullptr) pool.Schedule([] { Help(); });
}

}  // namespace jgsess
