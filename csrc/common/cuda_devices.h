// The CUDA devices this process's jax client uses, by ordinal (as the CUDA runtime numbers them,
// which is jax's local_hardware_id): the CUDA handlers load their kernels into these devices'
// contexts alone (multi_tensor_cuda.cuh: LoadKernels). Every device until jgsess's Python side
// names them (jgsess/kernels/_native.py: use_cuda_devices, before a program with a CUDA kernel
// lowers): a job with one process per GPU, each selecting its GPU with jax's
// `local_device_ids`, creates no context on the other GPUs.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

namespace jgsess {

// bit d: device d is used; devices 64 and up are always counted as used
inline std::atomic<uint64_t>& CudaDevicesInUse() {
  static std::atomic<uint64_t> devices{~uint64_t{0}};
  return devices;
}

inline void UseCudaDevices(const std::vector<int>& ordinals) {
  uint64_t mask = 0;
  for (int d : ordinals) {
    if (d >= 0 && d < 64) mask |= uint64_t{1} << d;
  }
  CudaDevicesInUse().store(mask);
}

inline bool UsesCudaDevice(int device) {
  return device >= 64 || ((CudaDevicesInUse().load() >> device) & 1) != 0;
}

}  // namespace jgsess
