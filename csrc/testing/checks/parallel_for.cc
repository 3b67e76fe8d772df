// A std::thread pool with XLA's ThreadPool interface, and concurrent ParallelFor calls on it.
#include "testing/checks/parallel_for.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "common/parallel.h"

namespace jgsess {
namespace {

class TestPool {
 public:
  explicit TestPool(int threads) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
  }
  ~TestPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    ready_.notify_all();
    for (auto& worker : workers_) worker.join();
  }
  int64_t num_threads() const { return static_cast<int64_t>(workers_.size()); }
  void Schedule(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks_.push_back(std::move(task));
    }
    ready_.notify_one();
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;  // stopping, nothing left
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// Yields until all `chunks` chunks but the one running this have run (`others_done` of them),
// or 10 s pass: the held chunk keeps its thread, so other threads must run the rest.
void HoldUntilOthersRan(const std::atomic<int64_t>& others_done, int64_t chunks) {
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (others_done.load() + 1 < chunks && std::chrono::steady_clock::now() < limit) {
    std::this_thread::yield();
  }
}

}  // namespace

ChunkRuns SharedChunkRuns(const std::vector<int64_t>& chunks, int pool_threads, bool hold,
                          int64_t spin) {
  const size_t calls = chunks.size();
  ChunkRuns out;
  out.foreign.assign(calls, 0);
  std::vector<std::vector<std::atomic<int>>> runs(calls);
  for (size_t k = 0; k < calls; ++k) runs[k] = std::vector<std::atomic<int>>(chunks[k]);
  std::vector<std::atomic<int64_t>> foreign(calls);
  std::atomic<bool> started{false};
  std::atomic<int64_t> first_done{0};  // call 0's chunks that have run
  {
    TestPool pool(pool_threads);
    auto call = [&](size_t k) {
      const std::thread::id own = std::this_thread::get_id();
      ParallelFor(pool, chunks[k], [&, k, own](int64_t c) {
        if (k == 0 && c == 0) {
          started = true;
          if (hold) HoldUntilOthersRan(first_done, chunks[0]);
        }
        volatile int64_t sink = 0;
        for (int64_t i = 0; i < spin; ++i) sink = sink + i;
        runs[k][c].fetch_add(1);
        if (std::this_thread::get_id() != own) foreign[k].fetch_add(1);
        if (k == 0) first_done.fetch_add(1);
      });
    };
    std::vector<std::thread> threads;
    threads.emplace_back(call, 0);
    while (!started) std::this_thread::yield();
    for (size_t k = 1; k < calls; ++k) threads.emplace_back(call, k);
    for (auto& thread : threads) thread.join();
  }
  for (size_t k = 0; k < calls; ++k) {
    out.runs.emplace_back(runs[k].begin(), runs[k].end());
    out.foreign[k] = foreign[k].load();
  }
  return out;
}

std::vector<int> SecondThreadOrder(int64_t first_chunks, int64_t second_chunks) {
  TestPool pool(0);
  std::vector<int> order;
  std::atomic<bool> started{false};
  std::atomic<int64_t> first_done{0};
  std::thread first([&] {
    ParallelFor(pool, first_chunks, [&](int64_t c) {
      if (c == 0) {
        started = true;
        HoldUntilOthersRan(first_done, first_chunks);
      } else {
        order.push_back(0);  // only the second thread runs these while the first holds chunk 0
        first_done.fetch_add(1);
      }
    });
  });
  while (!started) std::this_thread::yield();
  std::thread second(
      [&] { ParallelFor(pool, second_chunks, [&](int64_t) { order.push_back(1); }); });
  second.join();
  first.join();
  return order;
}

int64_t ParksWaitingForHeldChunk(int64_t chunks, int pool_threads, double hold_seconds) {
  TestPool pool(pool_threads);
  const std::thread::id own = std::this_thread::get_id();
  std::atomic<bool> held{false};
  const int64_t parked = Jobs::Get().parked();
  ParallelFor(pool, chunks, [&](int64_t) {
    if (std::this_thread::get_id() == own) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the helper starts meanwhile
    } else if (!held.exchange(true)) {
      std::this_thread::sleep_for(std::chrono::duration<double>(hold_seconds));
    }
  });
  return Jobs::Get().parked() - parked;
}

}  // namespace jgsess
