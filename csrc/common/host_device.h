// Element math shared by the CPU and CUDA handlers is marked JGSESS_HOST_DEVICE.
#pragma once

#if defined(__CUDACC__)
#define JGSESS_HOST_DEVICE __host__ __device__ __forceinline__
#else
// always inlined on the host too: the CPU kernels run it on vectors of lanes (common/vec.h),
// which GCC passes between functions compiled for different instruction sets only inlined
#define JGSESS_HOST_DEVICE inline __attribute__((always_inline))
#endif
