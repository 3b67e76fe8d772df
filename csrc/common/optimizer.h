// What the optimizer kernels' element math shares (adamw, momentum). The element functions are
// templates of their lane type F: a float here and on a GPU, or a CPU vector of floats
// (common/vec.h, which gives these operations for its vectors).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/host_device.h"

#if defined(__CUDACC__) || defined(JGSESS_SIMT_EMULATOR)
#include <cuda_fp16.h>
#endif

namespace jgsess {

// How the element math rounds the result of each operation. The kernels compute in f32
// (InF32: no rounding between operations). An update written in bf16 or f16 (optax's default
// state for narrow parameters) is computed by XLA's CPU code one operation at a time, each result
// rounded to the narrow type; under a kernel's narrow-math flag the element math does the same
// with InBf16 / InF16 (jgsess fuses such an update only where the kernel's bits equal XLA's on the
// platform: jgsess/passes/fusions/optimizer.py).
struct InF32 {
  template <typename F>
  JGSESS_HOST_DEVICE F operator()(F x) const {
    return x;
  }
};

JGSESS_HOST_DEVICE float Sqrt(float x) { return sqrtf(x); }
JGSESS_HOST_DEVICE float Fma(float a, float b, float c) { return fmaf(a, b, c); }
// keep != 0 ? a : b, per lane (a NaN keep keeps a)
JGSESS_HOST_DEVICE float Select(float keep, float a, float b) { return keep != 0.0f ? a : b; }

// Narrow math's values are bf16/f16 values, their operations' f32 results and the f32 widening
// of the update's bf16/f16 hyper-parameters: a NaN among them carries its payload in the top 16
// bits (f32 operations keep an operand NaN's payload or make the default NaN), so InBf16 rounds
// with the integer carry alone, on the host and on a GPU: the carry never reaches a NaN's
// payload, and an overflow rounds to infinity, as it should.
struct InBf16 {
  JGSESS_HOST_DEVICE float operator()(float x) const {
    uint32_t bits;
    memcpy(&bits, &x, sizeof(bits));
    bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &bits, sizeof(x));
    return x;
  }
  template <typename F>
  JGSESS_HOST_DEVICE F operator()(F x) const {  // a CPU vector's lanes (vec.h)
    return RoundBf16(x);
  }
};

// On the host, the compiler's f16 conversion (to nearest even; a NaN quieted, its payload's top
// 10 bits kept). On a GPU, whose conversion makes every NaN the canonical one, a NaN is kept as
// the host keeps it (compiled in the SIMT emulator too, where tests compare the two on every
// f16 bit pattern: tests/kernels/test_momentum.py).
struct InF16 {
  JGSESS_HOST_DEVICE float operator()(float x) const {
#if defined(__CUDACC__) || defined(JGSESS_SIMT_EMULATOR)
    if (x != x) {
      uint32_t bits;
      memcpy(&bits, &x, sizeof(bits));
      bits = (bits & 0xffffe000u) | 0x00400000u;
      memcpy(&x, &bits, sizeof(x));
      return x;
    }
    return __half2float(__float2half_rn(x));
#else
    return static_cast<float>(static_cast<_Float16>(x));
#endif
  }
  template <typename F>
  JGSESS_HOST_DEVICE F operator()(F x) const {  // a CPU vector's lanes (vec.h)
    return RoundF16(x);
  }
};

// An optimizer kernel's first result, from the parameter p and its step direction d: the new
// parameter p - lr*d, or with kUpdate optax's update alone, -(lr*d). These are the references'
// operations (jgsess/passes/fusions/optimizer.py: every update as the whole step or the update),
// each rounded by q.
template <bool kUpdate, typename F, typename Q = InF32>
JGSESS_HOST_DEVICE F StepResult(F p, F lr, F d, Q q = {}) {
  if constexpr (kUpdate) {
    return -q(lr * d);
  } else {
    return q(p - q(lr * d));
  }
}

}  // namespace jgsess
