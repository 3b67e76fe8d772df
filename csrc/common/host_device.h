// Element math shared by the CPU and CUDA handlers is marked JGSESS_HOST_DEVICE.
#pragma once

#if defined(__CUDACC__)
#define JGSESS_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define JGSESS_HOST_DEVICE inline
#endif
