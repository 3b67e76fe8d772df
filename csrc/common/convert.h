// f32 <-> bf16 / f16 on the CPU, one element at a time, rounding to nearest even as XLA's
// convert does (Widen / Narrow; whole ranges and vectors of them: vec.h).
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

// bf16 bits as a type of their own, so that one element loop serves f32 and bf16 parameters:
// Widen(x) reads either (or an f16) as f32, Narrow(x, &d) writes f32 into either (or an f16),
// rounding to nearest even.
struct Bf16Bits {
  uint16_t bits;
};
inline float Widen(float x) { return x; }
inline float Widen(Bf16Bits x) { return Bf16ToF32(x.bits); }
inline float Widen(_Float16 x) { return static_cast<float>(x); }
inline void Narrow(float x, float* d) { *d = x; }
inline void Narrow(float x, Bf16Bits* d) { d->bits = F32ToBf16(x); }
inline void Narrow(float x, _Float16* d) { *d = static_cast<_Float16>(x); }
// x holds a value of d's type exactly (narrow math rounded it already): its bits, not rounded
// again.
inline void NarrowExact(float x, Bf16Bits* d) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  d->bits = static_cast<uint16_t>(bits >> 16);
}
inline void NarrowExact(float x, _Float16* d) { *d = static_cast<_Float16>(x); }

}  // namespace jgsess
