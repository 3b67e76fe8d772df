// Turning a runtime `flags` attribute into a compile-time constant, so each combination of a
// kernel's options gets its own branch-free inner loop.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "common/ffi.h"

namespace jgsess {

// Calls f.template operator()<flags>() for flags in [0, kCount) that kValid accepts (a kernel's
// combinations that exist: only those are compiled); an error otherwise.
template <int64_t kCount, bool (*kValid)(int64_t), typename F>
ffi::Error DispatchFlags(int64_t flags, const char* kernel, F&& f) {
  return [&]<int64_t... kFlags>(std::integer_sequence<int64_t, kFlags...>) {
    ffi::Error result = ffi::Error::Success();
    auto one = [&]<int64_t kOne>() {
      if constexpr (kValid(kOne)) {
        if (flags == kOne) {
          result = f.template operator()<kOne>();
          return true;
        }
      }
      return false;
    };
    if (!(one.template operator()<kFlags>() || ...)) {  // the error's text only for an error
      return ffi::Error(ffi::ErrorCode::kInvalidArgument, std::string(kernel) + ": unknown flags");
    }
    return result;
  }(std::make_integer_sequence<int64_t, kCount>{});
}

// Calls f.template operator()<flags>() for every flags value in [0, kCount) that kValid accepts.
template <int64_t kCount, bool (*kValid)(int64_t), typename F>
void ForEachFlags(F&& f) {
  [&]<int64_t... kFlags>(std::integer_sequence<int64_t, kFlags...>) {
    auto one = [&]<int64_t kOne>() {
      if constexpr (kValid(kOne)) f.template operator()<kOne>();
    };
    (one.template operator()<kFlags>(), ...);
  }(std::make_integer_sequence<int64_t, kCount>{});
}

}  // namespace jgsess
