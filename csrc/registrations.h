// FFI targets exported to Python.
#pragma once

#include <pybind11/pybind11.h>

namespace jgsess {

// target name -> {platform: capsule}, for jax.ffi.register_ffi_target.
pybind11::dict Registrations();

// Whether the CUDA handlers were compiled in.
bool HasCuda();

// The GPU code the CUDA handlers carry: {"sm": [80, 90], "ptx": 90} (empty without them).
pybind11::dict CudaBuild();

// The CUDA driver's version (12010 is 12.1), 0 where there is none or no CUDA handlers.
int CudaDriverVersion();

}  // namespace jgsess
