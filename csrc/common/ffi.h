// The XLA FFI vocabulary jgsess's handlers share: type aliases, dtype names, error helpers.
#pragma once

#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace jgsess {

namespace ffi = xla::ffi;

using Buffer = ffi::AnyBuffer;
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

inline ffi::Unexpected<ffi::Error> Invalid(const char* kernel, const std::string& message) {
  return ffi::Unexpected(InvalidArgument(std::string(kernel) + ": " + message));
}

}  // namespace jgsess

// Declares a kernel's handlers <name>Cpu, <name>Cuda and <name>CudaLoad (in its header; the
// last is the CUDA handler's instantiate stage, which loads its kernels' code). Without the CUDA
// kernels, the CUDA ones are null stand-ins, so registrations.cc reads the same either way.
#if defined(JGSESS_WITH_CUDA)
#define JGSESS_DECLARE_HANDLERS(name)         \
  XLA_FFI_DECLARE_HANDLER_SYMBOL(name##Cpu);  \
  XLA_FFI_DECLARE_HANDLER_SYMBOL(name##Cuda); \
  XLA_FFI_DECLARE_HANDLER_SYMBOL(name##CudaLoad)
#else
#define JGSESS_DECLARE_HANDLERS(name)              \
  XLA_FFI_DECLARE_HANDLER_SYMBOL(name##Cpu);       \
  constexpr XLA_FFI_Handler* name##Cuda = nullptr; \
  constexpr XLA_FFI_Handler* name##CudaLoad = nullptr
#endif
