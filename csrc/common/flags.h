// A kernel's `flags` attribute: bits of a scoped enum (AdamwFlag, MomentumFlag), one per part of
// its formula; each combination is compiled as its own branch-free form (common/dispatch.h).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/host_device.h"

namespace jgsess {

// Whether `flags` has `flag` set.
template <typename Flag>
JGSESS_HOST_DEVICE constexpr bool Has(int64_t flags, Flag flag) {
  static_assert(std::is_enum_v<Flag>, "a kernel's scoped flag enum");
  return (flags & static_cast<int64_t>(flag)) != 0;
}

// The bits of `flags` together.
template <typename... Flag>
JGSESS_HOST_DEVICE constexpr int64_t Bits(Flag... flags) {
  return (int64_t{0} | ... | static_cast<int64_t>(flags));
}

// A flag's name as Python spells it (jgsess/kernels/<kernel>.py: Flag), and its bit; _C's
// kernel_flags() reports each kernel's, and a test checks Python's against them.
struct FlagName {
  const char* name;
  int64_t bit;
};

}  // namespace jgsess
