// The jgsess._C extension module.
#include <pybind11/pybind11.h>

#include "registrations.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "jgsess kernels as XLA FFI handlers";
  m.def("registrations", &jgsess::Registrations,
        "target name -> {platform: PyCapsule} for jax.ffi.register_ffi_target");
  m.def("has_cuda", &jgsess::HasCuda, "whether the CUDA kernels were built in");
}
