// Turning a runtime `flags` attribute into a compile-time constant, so each combination of a
// kernel's options gets its own branch-free inner loop.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "common/ffi.h"

namespace jgsess {

// Calls f.template operator()<flags>() for flags in [0, kCount); an error otherwise.
template <int64_t kCount, typename F>
ffi::Error DispatchFlags(int64_t flags, const char* kernel, F&& f) {
  return [&]<int64_t... kFlags>(std::integer_sequence<int64_t, kFlags...>) {
    ffi::Error result(ffi::ErrorCode::kInvalidArgument, std::string(kernel) + ": unknown flags");
    ((flags == kFlags ? (result = f.template operator()<kFlags>(), true) : false) || ...);
    return result;
  }(std::make_integer_sequence<int64_t, kCount>{});
}

}  // namespace jgsess
