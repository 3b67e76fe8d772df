// <cuda_bf16.h> for the SIMT emulator: __nv_bfloat16 and the conversions the sources use, with
// the GPU's rounding (to nearest even) and NaN (every NaN becomes the canonical 0x7fff).
#pragma once

#include <cstdint>
#include <cstring>

struct __nv_bfloat16 {
  uint16_t bits;
};

inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t bits = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return {0x7fff};
  return {static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16)};
}

inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return {bits}; }

inline unsigned __float_as_uint(float f) {
  unsigned bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}
