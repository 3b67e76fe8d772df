// Host-side machinery the tests exercise directly, outside XLA.
#pragma once

#include <cstdint>
#include <vector>

namespace jgsess {

// What SharedChunkRuns observed of each call: how many times each of its chunks ran, and how
// many of its chunks ran on a thread other than the call's own.
struct ChunkRuns {
  std::vector<std::vector<int>> runs;
  std::vector<int64_t> foreign;
};

// Runs one ParallelFor call per entry of `chunks` (that many chunks each), every call on its own
// thread, all sharing a pool of `pool_threads` workers, as the devices of a CPU mesh call their
// kernels at the same time; the others start once call 0 runs its first chunk. Under `hold`
// that first chunk waits (at most 10 s) until every other chunk of call 0 has run, so other
// threads must run them; each chunk spins `spin` iterations.
ChunkRuns SharedChunkRuns(const std::vector<int64_t>& chunks, int pool_threads, bool hold,
                          int64_t spin);

// Two ParallelFor calls and no pool: call 0 (`first_chunks` chunks) holds its first chunk on its
// own thread (at most 10 s) until its other chunks have run elsewhere; call 1 (`second_chunks`)
// starts meanwhile on a second thread. The call of each chunk the second thread ran, in order.
std::vector<int> SecondThreadOrder(int64_t first_chunks, int64_t second_chunks);

// One ParallelFor call of `chunks` chunks on a pool of `pool_threads`; the first chunk a pool
// thread runs sleeps `hold_seconds`, while the calling thread runs the rest (sleeping 1 ms in
// each). How many times the calling thread slept waiting for the held chunk (parked, counted by
// the pool) rather than spinning on it.
int64_t ParksWaitingForHeldChunk(int64_t chunks, int pool_threads, double hold_seconds);

}  // namespace jgsess
