"""The CPU kernels' work sharing (csrc/common/parallel.h) under concurrent calls, as the devices
of a CPU mesh make them: every chunk of every call runs exactly once, the oldest call's chunks
first, and a call's chunks that are left when the other calls finish run on the threads those
calls freed; a call waiting for another thread's chunk sleeps rather than spins."""

import os

import numpy as np
import pytest

from tests.native import module


def test_concurrent_calls_run_every_chunk_once():
    rng = np.random.default_rng(0)
    for pool_threads in (0, 1, 2, 4):
        chunks = [int(n) for n in rng.integers(1, 300, size=5)] + [0]
        runs, foreign = module().shared_chunk_runs(chunks, pool_threads, hold=False, spin=2000)
        assert [len(r) for r in runs] == chunks
        for call in runs:
            assert all(count == 1 for count in call), call
        assert all(0 <= f <= n for f, n in zip(foreign, chunks))


def test_freed_threads_run_a_late_call():
    # call 0 keeps its own thread on its first chunk until the rest of its chunks have run
    # elsewhere: the three short calls return, and their threads' cores go to call 0 (a helper
    # on the pool each time one returns)
    runs, foreign = module().shared_chunk_runs([40, 1, 1, 1], 1, hold=True, spin=1000)
    assert all(count == 1 for call in runs for count in call)
    assert foreign[0] == 39, foreign


def test_a_later_call_runs_the_older_calls_chunks_first():
    # the oldest call's chunks go first, so calls end in the order they started (a device done
    # first frees its launch thread for the next step); call 0's own thread is held, so its
    # other chunks can only run on call 1's thread, and must run there before call 1's own
    assert module().second_thread_order(first_chunks=6, second_chunks=4) == [0] * 5 + [1] * 4


def test_no_pool_threads_means_no_help():
    # the near miss: a call that returns hands its core to a helper on the pool; with no pool
    # thread there is none, and call 0's chunks all run on its own thread
    runs, foreign = module().shared_chunk_runs([3, 1], 0, hold=False, spin=1000)
    assert all(count == 1 for call in runs for count in call)
    assert foreign == [0, 0]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="a helper needs a second core")
def test_a_call_waiting_for_another_threads_chunk_sleeps():
    # a pool thread holds one chunk for 0.3 s; the calling thread runs the others and then waits:
    # it yields a few times and then sleeps (parks), so it takes no core from the threads
    # working (a mesh of CPU devices runs more waiting calls than there are cores)
    assert module().parks_waiting_for_held_chunk(chunks=64, pool_threads=2, hold_seconds=0.3) == 1
    # the near miss: with no pool thread the calling thread runs every chunk and never waits
    assert module().parks_waiting_for_held_chunk(chunks=64, pool_threads=0, hold_seconds=0.3) == 0
