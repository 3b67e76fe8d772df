// <cuda_fp16.h> for the SIMT emulator: __half and the conversions the sources use, with the
// GPU's rounding (to nearest even, subnormals kept) and NaN (every NaN becomes 0x7fff).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

struct __half {
  uint16_t bits;
};

inline float __half2float(__half h) {
  _Float16 v;
  std::memcpy(&v, &h.bits, sizeof(v));
  return static_cast<float>(v);
}

inline __half __float2half_rn(float f) {
  if (std::isnan(f)) return {0x7fff};
  const _Float16 v = static_cast<_Float16>(f);  // IEEE round to nearest even
  __half h;
  std::memcpy(&h.bits, &v, sizeof(v));
  return h;
}

inline __half __ushort_as_half(unsigned short bits) { return {bits}; }
