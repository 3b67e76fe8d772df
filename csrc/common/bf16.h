// bf16 as the bits of a uint16_t, on the host: f32 -> bf16 rounds to nearest even, as XLA's
// convert does (a NaN stays a quiet NaN); bf16 -> f32 is exact.
#pragma once

#include <cstdint>
#include <cstring>

namespace jgsess {

inline float Bf16ToF32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(nan ? quiet_nan : rounded);
}

}  // namespace jgsess
