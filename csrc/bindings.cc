// The jgsess._C extension module.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "common/chunk.h"
#include "common/cuda_devices.h"
#include "common/simd.h"
#include "kernels/kernels.h"
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
  m.attr("CHUNK") = jgsess::kChunk;  // elements per chunk of multi-tensor work
  m.def("registrations", &jgsess::Registrations,
        "target name -> {platform: PyCapsule} for jax.ffi.register_ffi_target");
  m.def("has_cuda", &jgsess::HasCuda, "whether the CUDA kernels were built in");
  m.def("cuda_build", &jgsess::CudaBuild,
        "the GPU code of the CUDA kernels: {'sm': [compute capabilities x10], 'ptx': the PTX's}");
  m.def("use_cuda_devices", &jgsess::UseCudaDevices, pybind11::arg("ordinals"),
        "the CUDA devices (runtime ordinals) whose contexts the CUDA handlers load their "
        "kernels into: those of this process's jax client (default: every device)");
  m.def("cuda_driver_version", &jgsess::CudaDriverVersion,
        "the CUDA driver's version (12010 is 12.1); 0 without a driver or the CUDA kernels");
  m.def(
      "kernel_flags",
      [] {
        pybind11::dict kernels;
#define JGSESS_FLAGS(kernel, names) kernels[#kernel] = FlagDict(jgsess::names);
        JGSESS_FLAG_FAMILIES(JGSESS_FLAGS)
#undef JGSESS_FLAGS
        return kernels;
      },
      "kernel name -> {flag name: bit} of its `flags` attribute (Python's Flag enums match it)");
  m.def("cap_simd", &jgsess::CapSimd,
        "caps the CPU kernels' vector loops at an instruction set: baseline or avx2 (any other "
        "name: no cap)");
  m.def(
      "simd_isa", [] { return jgsess::IsaName(jgsess::HostIsa()); },
      "the instruction set the CPU kernels' vector loops run with: avx512, avx2 or baseline");
}
