// The jgsess._C extension module.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bench/stream.h"
#include "checks/parallel_for.h"
#include "common/simd.h"
#include "kernels/adamw/adamw.h"
#include "kernels/momentum/momentum.h"
#include "registrations.h"

namespace {

template <size_t kCount>
pybind11::dict FlagDict(const jgsess::FlagName (&names)[kCount]) {
  pybind11::dict flags;
  for (const auto& flag : names) flags[flag.name] = flag.bit;
  return flags;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "jgsess kernels as XLA FFI handlers";
  m.def("registrations", &jgsess::Registrations,
        "target name -> {platform: PyCapsule} for jax.ffi.register_ffi_target");
  m.def("has_cuda", &jgsess::HasCuda, "whether the CUDA kernels were built in");
  m.def("cuda_build", &jgsess::CudaBuild,
        "the GPU code of the CUDA kernels: {'sm': [compute capabilities x10], 'ptx': the PTX's}");
  m.def("cuda_driver_version", &jgsess::CudaDriverVersion,
        "the CUDA driver's version (12010 is 12.1); 0 without a driver or the CUDA kernels");
  m.def(
      "kernel_flags",
      [] {
        pybind11::dict kernels;
        kernels["adamw"] = FlagDict(jgsess::kAdamwFlagNames);
        kernels["momentum"] = FlagDict(jgsess::kMomentumFlagNames);
        return kernels;
      },
      "kernel name -> {flag name: bit} of its `flags` attribute (Python's Flag enums match it)");
  m.def(
      "simd_isa", [] { return jgsess::IsaName(jgsess::HostIsa()); },
      "the instruction set the CPU kernels' vector loops run with: avx512, avx2 or baseline");
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
