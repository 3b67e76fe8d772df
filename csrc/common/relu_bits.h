// ReLU bit masks: bit k of word k / 32 is element k's, set where the element is positive;
// shared by the relu_mask and BatchNorm CPU kernels (vector code: common/simd.h).
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/simd.h"

namespace jgsess {

// ORs the bits v[k] > 0 of n values into `words`, starting at element `base`.
inline void PackPositive(const float* v, int64_t base, int64_t n, uint32_t* words) {
  Vectorized([&]() JGSESS_REGION {
    for (int64_t i = 0; i < n;) {
      const int64_t offset = (base + i) & 31, len = std::min<int64_t>(32 - offset, n - i);
      const float* x = v + i;
      uint32_t bits = 0;
#pragma omp simd reduction(| : bits)
      for (int64_t j = 0; j < len; ++j) bits |= static_cast<uint32_t>(x[j] > 0.0f) << j;
      words[(base + i) >> 5] |= bits << offset;
      i += len;
    }
  });
}

// out[k] = the mask's bit for element base + k ? d[k] : 0, for k in [0, n).
inline void GateByMask(const uint32_t* words, int64_t base, int64_t n, const float* d, float* out) {
  Vectorized([&]() JGSESS_REGION {
    for (int64_t i = 0; i < n;) {
      const int64_t offset = (base + i) & 31, len = std::min<int64_t>(32 - offset, n - i);
      const uint32_t bits = words[(base + i) >> 5] >> offset;
      const float* di = d + i;
      float* oi = out + i;
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) oi[j] = (bits >> j) & 1u ? di[j] : 0.0f;
      i += len;
    }
  });
}

}  // namespace jgsess
