// FFI targets exported to Python.
#pragma once

#include <pybind11/pybind11.h>

namespace jgsess {

// target name -> {platform: capsule}, for jax.ffi.register_ffi_target.
pybind11::dict Registrations();

// Whether the CUDA handlers were compiled in.
bool HasCuda();

}  // namespace jgsess
