// <cuda_runtime.h> for the SIMT emulator (emulator/simt.h): streams are the host's, copies are
// synchronous, errors come from the emulated launches.
#pragma once

#include <cstring>

#include "testing/emulator/simt.h"
#include "xla/ffi/api/ffi.h"

using cudaStream_t = jgsess::simt::Stream*;

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorIllegalAddress = 700,
};

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
};

inline cudaError_t cudaGetLastError() {
  return static_cast<cudaError_t>(jgsess::simt::TakeLastError());
}

inline const char* cudaGetErrorString(cudaError_t err) {
  return err == cudaSuccess ? "no error" : jgsess::simt::LastMessage().c_str();
}

struct cudaFuncAttributes {
  int maxThreadsPerBlock = 1024;
};

// The emulated devices (simt.h: each a context of its own).
inline cudaError_t cudaGetDeviceCount(int* count) {
  *count = jgsess::simt::DeviceCount();
  return cudaSuccess;
}

inline cudaError_t cudaGetDevice(int* device) {
  *device = jgsess::simt::CurrentDevice();
  return cudaSuccess;
}

inline cudaError_t cudaSetDevice(int device) {
  return jgsess::simt::SetCurrentDevice(device) ? cudaSuccess : cudaErrorInvalidDevice;
}

// Loads a kernel's code into the current device's context: the emulator records it; launching
// one not loaded on the launch's device is a checked error.
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, const void* kernel) {
  jgsess::simt::MarkLoaded(kernel);
  *attributes = cudaFuncAttributes{};
  return cudaSuccess;
}

inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                                   cudaStream_t) {
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

// The handlers' stream: the emulator's one host stream (XLA's CPU client has none to give).
template <>
struct xla::ffi::CtxDecoding<xla::ffi::PlatformStream<cudaStream_t>> {
  using Type = cudaStream_t;
  static std::optional<Type> Decode(const XLA_FFI_Api*, XLA_FFI_ExecutionContext*,
                                    DiagnosticEngine&) {
    static jgsess::simt::Stream stream;
    return &stream;
  }
};
