// jgsess's test-only extension `_testing` (tests/native/build.py; never in the wheel): the SIMT
// emulator of the CUDA kernels (csrc/testing/emulator/), the host machinery's test hooks
// (csrc/testing/checks/) and the benchmarks' bandwidth probes (csrc/testing/bench/).
#include "testing/emulator/module.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "testing/bench/stream.h"
#include "testing/checks/parallel_for.h"

PYBIND11_MODULE(_testing, m) {
  m.doc() = "jgsess's test-only hooks: the SIMT emulator, host checks, bandwidth probes";
  jgsess::simt::Bind(m);
  m.def("stream_triad_gbps", &jgsess::StreamTriadGbps, pybind11::arg("n"), pybind11::arg("repeats"),
        "best STREAM triad bandwidth (GB/s) over f32 arrays of n elements, all CPU threads");
  m.def("stream_inplace_gbps", &jgsess::StreamInplaceGbps, pybind11::arg("n"),
        pybind11::arg("reads"), pybind11::arg("writes"), pybind11::arg("param_bytes"),
        pybind11::arg("state_bytes"), pybind11::arg("repeats"), pybind11::arg("rest_bytes") = 4,
        "best in-place stream bandwidth (GB/s) with an optimizer's traffic: `reads` arrays of n "
        "elements read, the first `writes` written back in place (AdamW 4, 3; momentum 3, 2); "
        "the parameter and gradient of `param_bytes` bytes, the first state array of "
        "`state_bytes`, any other (v) of `rest_bytes` (4: f32, 2: bf16); all CPU threads");
  m.def(
      "shared_chunk_runs",
      [](const std::vector<int64_t>& chunks, int pool_threads, bool hold, int64_t spin) {
        auto runs = jgsess::SharedChunkRuns(chunks, pool_threads, hold, spin);
        return pybind11::make_tuple(runs.runs, runs.foreign);
      },
      pybind11::arg("chunks"), pybind11::arg("pool_threads"), pybind11::arg("hold"),
      pybind11::arg("spin"),
      "(times each chunk ran, chunks run off the call's own thread) per call, for concurrent "
      "ParallelFor calls (one per entry of `chunks`) sharing a pool of `pool_threads` (tests)");
  m.def("second_thread_order", &jgsess::SecondThreadOrder, pybind11::arg("first_chunks"),
        pybind11::arg("second_chunks"),
        "the call (0 or 1) of each chunk a second call's thread ran, in order, while the first "
        "call's thread held its first chunk (tests)");
  m.def("parks_waiting_for_held_chunk", &jgsess::ParksWaitingForHeldChunk, pybind11::arg("chunks"),
        pybind11::arg("pool_threads"), pybind11::arg("hold_seconds"),
        "how many times a ParallelFor call's thread slept (rather than spun) waiting for a chunk "
        "a pool thread held for `hold_seconds` (tests)");
}
