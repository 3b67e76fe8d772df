// The SIMT emulator's functions in the test-only extension (csrc/testing/module.cc).
#pragma once

#include <pybind11/pybind11.h>

namespace jgsess::simt {

// Adds handlers(), broken(), gpu_conversions() and launches() to `m`.
void Bind(pybind11::module_& m);

}  // namespace jgsess::simt
