// The XLA FFI vocabulary jgsess's handlers share: type aliases, dtype names, error helpers.
#pragma once

#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace jgsess {

namespace ffi = xla::ffi;

using Buffer = ffi::AnyBuffer;
using Scalar = ffi::BufferR0<ffi::F32>;
using Args = ffi::RemainingArgs;
using Rets = ffi::RemainingRets;
using DataType = ffi::DataType;

// Handlers that may be captured into CUDA graphs / XLA command buffers.
constexpr auto kGraphSafe = {ffi::Traits::kCmdBufferCompatible};

inline ffi::Error InvalidArgument(const std::string& message) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, message);
}

inline ffi::Error Internal(const std::string& message) {
  return ffi::Error(ffi::ErrorCode::kInternal, message);
}

}  // namespace jgsess
