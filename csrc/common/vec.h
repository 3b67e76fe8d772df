// The f32 lanes the CPU optimizer kernels' element math is written against.
//
// An element function (adamw.h's AdamwElement, momentum.h's MomentumElement) is a template of
// its lane type F: a float (the CUDA kernels, the CPU's baseline loops and every tail), F32x8
// (AVX2) or F32x16 (AVX-512). Each operation is the same IEEE single-precision operation on
// every lane, and nothing is contracted (a multiply-add is a product then a sum, unless the
// math says Fma), so every lane type gives the same bits as the float one, which is the
// reference. VecFor runs a body over a piece of a tensor with the widest lanes HostIsa()
// allows, its per-call constants splatted into registers once for the loop, whole vectors
// then the tail one float at a time.
//
// The vector functions carry their instruction set's target attribute and are inlined into
// the instruction set's trampoline (simd.h's flattened RunAvx2 / RunAvx512), never into code
// compiled for another.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "common/convert.h"
#include "common/ffi.h"
#include "common/optimizer.h"
#include "common/simd.h"

#if defined(JGSESS_SIMD_X86)
#include <immintrin.h>
#endif

namespace jgsess {

// ---- one lane: float --------------------------------------------------------------------------

template <typename F>
constexpr int kLanes = 1;

template <typename F>
inline F Splat(float x) {
  return x;
}

// (Sqrt, Fma and Select of floats: common/optimizer.h, shared with the CUDA kernels)

// Load<F>: lanes of T (float, Bf16Bits, _Float16) widened to f32; Store: f32 lanes stored into
// T, rounded to nearest even (as Narrow) or, holding T's values already, by their bits
// (StoreExact, as NarrowExact).
template <typename F, typename T>
inline F Load(const T* p);
template <>
inline float Load<float>(const float* p) {
  return *p;
}
template <>
inline float Load<float>(const Bf16Bits* p) {
  return Widen(*p);
}
template <>
inline float Load<float>(const _Float16* p) {
  return Widen(*p);
}
template <typename T>
inline void Store(float x, T* p) {
  Narrow(x, p);
}
template <typename T>
inline void StoreExact(float x, T* p) {
  if constexpr (std::is_same_v<T, float>) {
    *p = x;
  } else {
    NarrowExact(x, p);
  }
}

#if defined(JGSESS_SIMD_X86)

// ---- 16 lanes: AVX-512 ------------------------------------------------------------------------

#define JGSESS_V16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))) inline

struct F32x16 {
  __m512 v;
};
constexpr __mmask16 kAll16 = 0xffff;
template <>
constexpr int kLanes<F32x16> = 16;
template <>
JGSESS_V16 F32x16 Splat<F32x16>(float x) {
  return {_mm512_set1_ps(x)};
}
JGSESS_V16 F32x16 operator+(F32x16 a, F32x16 b) { return {_mm512_add_ps(a.v, b.v)}; }
JGSESS_V16 F32x16 operator-(F32x16 a, F32x16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
JGSESS_V16 F32x16 operator*(F32x16 a, F32x16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
JGSESS_V16 F32x16 operator/(F32x16 a, F32x16 b) { return {_mm512_div_ps(a.v, b.v)}; }
JGSESS_V16 F32x16 operator-(F32x16 a) {  // the sign bit flipped, as a float's negation
  return {_mm512_castsi512_ps(
      _mm512_xor_si512(_mm512_castps_si512(a.v), _mm512_set1_epi32(INT32_MIN)))};
}
// (maskz forms, with every lane set, where GCC 12's plain intrinsics pass an "undefined"
// register, which its uninitialized-use warning reports at every inlined call: GCC compiles them
// to the unmasked instructions)
JGSESS_V16 F32x16 Sqrt(F32x16 a) { return {_mm512_maskz_sqrt_ps(kAll16, a.v)}; }
JGSESS_V16 F32x16 Fma(F32x16 a, F32x16 b, F32x16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
JGSESS_V16 F32x16 Select(F32x16 keep, F32x16 a, F32x16 b) {
  const __mmask16 k = _mm512_cmp_ps_mask(keep.v, _mm512_setzero_ps(), _CMP_NEQ_UQ);
  return {_mm512_mask_blend_ps(k, b.v, a.v)};
}
// to nearest even by the integer carry: + 0x7fff, + 1 more where bit 16 (the last kept) is set,
// then the low half cleared; no shift (a test-mask and a blend of the addend instead)
JGSESS_V16 __m512i CarryBf16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __mmask16 odd = _mm512_test_epi32_mask(bits, _mm512_set1_epi32(0x10000));
  // the carry's addend picked by the mask (a blend into a register of its own: a masked add
  // into `bits` made the compiler copy it first, one more instruction in three roundings)
  const __m512i carry =
      _mm512_mask_blend_epi32(odd, _mm512_set1_epi32(0x7fff), _mm512_set1_epi32(0x8000));
  return _mm512_add_epi32(bits, carry);
}
JGSESS_V16 F32x16 RoundBf16(F32x16 x) {
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  return {_mm512_castsi512_ps(_mm512_and_si512(CarryBf16(x.v), high))};
}
JGSESS_V16 __m256i ToF16(F32x16 x) {
  return _mm512_maskz_cvtps_ph(kAll16, x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
JGSESS_V16 F32x16 FromF16(__m256i h) { return {_mm512_maskz_cvtph_ps(kAll16, h)}; }
JGSESS_V16 F32x16 RoundF16(F32x16 x) { return FromF16(ToF16(x)); }
template <>
JGSESS_V16 F32x16 Load<F32x16>(const float* p) {
  return {_mm512_loadu_ps(p)};
}
template <>
JGSESS_V16 F32x16 Load<F32x16>(const Bf16Bits* p) {
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m512i wide = _mm512_maskz_cvtepu16_epi32(kAll16, half);
  return {_mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll16, wide, 16))};
}
template <>
JGSESS_V16 F32x16 Load<F32x16>(const _Float16* p) {
  return FromF16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
JGSESS_V16 void StoreBits(__m512i top, Bf16Bits* p) {  // the top halves of 16 words
  const __m512i low = _mm512_maskz_srli_epi32(kAll16, top, 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_maskz_cvtepi32_epi16(kAll16, low));
}
JGSESS_V16 void Store(F32x16 x, float* p) { _mm512_storeu_ps(p, x.v); }
JGSESS_V16 void Store(F32x16 x, Bf16Bits* p) {  // as F32ToBf16: a NaN quieted, its top kept
  const __mmask16 nan = _mm512_cmp_ps_mask(x.v, x.v, _CMP_UNORD_Q);
  const __m512i bits = _mm512_castps_si512(x.v);
  StoreBits(_mm512_mask_or_epi32(CarryBf16(x.v), nan, bits, _mm512_set1_epi32(0x400000)), p);
}
JGSESS_V16 void Store(F32x16 x, _Float16* p) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), ToF16(x));
}
JGSESS_V16 void StoreExact(F32x16 x, float* p) { Store(x, p); }
JGSESS_V16 void StoreExact(F32x16 x, Bf16Bits* p) { StoreBits(_mm512_castps_si512(x.v), p); }
JGSESS_V16 void StoreExact(F32x16 x, _Float16* p) { Store(x, p); }

// ---- 8 lanes: AVX2 -----------------------------------------------------------------------------

#define JGSESS_V8 __attribute__((target("avx2,fma,f16c"))) inline

struct F32x8 {
  __m256 v;
};
template <>
constexpr int kLanes<F32x8> = 8;
template <>
JGSESS_V8 F32x8 Splat<F32x8>(float x) {
  return {_mm256_set1_ps(x)};
}
JGSESS_V8 F32x8 operator+(F32x8 a, F32x8 b) { return {_mm256_add_ps(a.v, b.v)}; }
JGSESS_V8 F32x8 operator-(F32x8 a, F32x8 b) { return {_mm256_sub_ps(a.v, b.v)}; }
JGSESS_V8 F32x8 operator*(F32x8 a, F32x8 b) { return {_mm256_mul_ps(a.v, b.v)}; }
JGSESS_V8 F32x8 operator/(F32x8 a, F32x8 b) { return {_mm256_div_ps(a.v, b.v)}; }
JGSESS_V8 F32x8 operator-(F32x8 a) {
  return {_mm256_castsi256_ps(
      _mm256_xor_si256(_mm256_castps_si256(a.v), _mm256_set1_epi32(INT32_MIN)))};
}
JGSESS_V8 F32x8 Sqrt(F32x8 a) { return {_mm256_sqrt_ps(a.v)}; }
JGSESS_V8 F32x8 Fma(F32x8 a, F32x8 b, F32x8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
JGSESS_V8 F32x8 Select(F32x8 keep, F32x8 a, F32x8 b) {
  const __m256 k = _mm256_cmp_ps(keep.v, _mm256_setzero_ps(), _CMP_NEQ_UQ);
  return {_mm256_blendv_ps(b.v, a.v, k)};
}
// the carry: + 0x7fff, less -1 where bit 16 is set (a compare's all-ones)
JGSESS_V8 __m256i CarryBf16(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_set1_epi32(0x10000);
  const __m256i odd = _mm256_cmpeq_epi32(_mm256_and_si256(bits, lsb), lsb);
  return _mm256_sub_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), odd);
}
JGSESS_V8 F32x8 RoundBf16(F32x8 x) {
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  return {_mm256_castsi256_ps(_mm256_and_si256(CarryBf16(x.v), high))};
}
JGSESS_V8 F32x8 RoundF16(F32x8 x) {
  return {_mm256_cvtph_ps(_mm256_cvtps_ph(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))};
}
template <>
JGSESS_V8 F32x8 Load<F32x8>(const float* p) {
  return {_mm256_loadu_ps(p)};
}
template <>
JGSESS_V8 F32x8 Load<F32x8>(const Bf16Bits* p) {
  const __m256i half = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(half, 16))};
}
template <>
JGSESS_V8 F32x8 Load<F32x8>(const _Float16* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
JGSESS_V8 void StoreBits(__m256i top, Bf16Bits* p) {  // the top halves of 8 words
  const __m256i shifted = _mm256_srli_epi32(top, 16);
  const __m128i packed =
      _mm_packus_epi32(_mm256_castsi256_si128(shifted), _mm256_extracti128_si256(shifted, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
JGSESS_V8 void Store(F32x8 x, float* p) { _mm256_storeu_ps(p, x.v); }
JGSESS_V8 void Store(F32x8 x, Bf16Bits* p) {
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x.v, x.v, _CMP_UNORD_Q));
  const __m256i quiet = _mm256_or_si256(_mm256_castps_si256(x.v), _mm256_set1_epi32(0x400000));
  StoreBits(_mm256_blendv_epi8(CarryBf16(x.v), quiet, nan), p);
}
JGSESS_V8 void Store(F32x8 x, _Float16* p) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
JGSESS_V8 void StoreExact(F32x8 x, float* p) { Store(x, p); }
JGSESS_V8 void StoreExact(F32x8 x, Bf16Bits* p) { StoreBits(_mm256_castps_si256(x.v), p); }
JGSESS_V8 void StoreExact(F32x8 x, _Float16* p) { Store(x, p); }

#endif  // JGSESS_SIMD_X86

// ---- two vectors at a time: bf16 as even and odd lanes ------------------------------------------

// Two vectors of lanes, the element math run on each: twice the independent work per step of
// the loop, and bf16 buffers loaded and stored as the even and odd halves of each 32-bit word of
// one access (a shift and an and to load, a shift and an or to store), no widening or
// narrowing shuffle. Used where every buffer of a call is bf16 (the narrow forms); lane k of a
// Pair is element 2k (a) or 2k+1 (b) of the piece.
template <typename V>
struct Pair {
  V a, b;
};
template <typename V>
constexpr int kLanes<Pair<V>> = 2 * kLanes<V>;
template <typename V>
constexpr bool kIsPair = false;
template <typename V>
constexpr bool kIsPair<Pair<V>> = true;

template <typename F>
  requires kIsPair<F>
JGSESS_REGION inline F Splat(float x) {
  using V = decltype(F::a);
  return {Splat<V>(x), Splat<V>(x)};
}
template <typename V>
JGSESS_REGION inline Pair<V> operator+(Pair<V> x, Pair<V> y) {
  return {x.a + y.a, x.b + y.b};
}
template <typename V>
JGSESS_REGION inline Pair<V> operator-(Pair<V> x, Pair<V> y) {
  return {x.a - y.a, x.b - y.b};
}
template <typename V>
JGSESS_REGION inline Pair<V> operator*(Pair<V> x, Pair<V> y) {
  return {x.a * y.a, x.b * y.b};
}
template <typename V>
JGSESS_REGION inline Pair<V> operator/(Pair<V> x, Pair<V> y) {
  return {x.a / y.a, x.b / y.b};
}
template <typename V>
JGSESS_REGION inline Pair<V> operator-(Pair<V> x) {
  return {-x.a, -x.b};
}
template <typename V>
JGSESS_REGION inline Pair<V> Sqrt(Pair<V> x) {
  return {Sqrt(x.a), Sqrt(x.b)};
}
template <typename V>
JGSESS_REGION inline Pair<V> Fma(Pair<V> x, Pair<V> y, Pair<V> z) {
  return {Fma(x.a, y.a, z.a), Fma(x.b, y.b, z.b)};
}
template <typename V>
JGSESS_REGION inline Pair<V> Select(Pair<V> keep, Pair<V> x, Pair<V> y) {
  return {Select(keep.a, x.a, y.a), Select(keep.b, x.b, y.b)};
}
template <typename V>
JGSESS_REGION inline Pair<V> RoundBf16(Pair<V> x) {
  return {RoundBf16(x.a), RoundBf16(x.b)};
}
template <typename V>
JGSESS_REGION inline Pair<V> RoundF16(Pair<V> x) {
  return {RoundF16(x.a), RoundF16(x.b)};
}

#if defined(JGSESS_SIMD_X86)
template <>
JGSESS_V16 Pair<F32x16> Load<Pair<F32x16>>(const Bf16Bits* p) {
  const __m512i words = _mm512_loadu_si512(p);
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  return {{_mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll16, words, 16))},
          {_mm512_castsi512_ps(_mm512_and_si512(words, high))}};
}
// the pair's lanes hold bf16 values already (NarrowExact)
JGSESS_V16 void StoreExact(Pair<F32x16> x, Bf16Bits* p) {
  const __m512i even = _mm512_maskz_srli_epi32(kAll16, _mm512_castps_si512(x.a.v), 16);
  _mm512_storeu_si512(p, _mm512_or_si512(_mm512_castps_si512(x.b.v), even));
}
template <>
JGSESS_V8 Pair<F32x8> Load<Pair<F32x8>>(const Bf16Bits* p) {
  const __m256i words = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  return {{_mm256_castsi256_ps(_mm256_slli_epi32(words, 16))},
          {_mm256_castsi256_ps(_mm256_and_si256(words, high))}};
}
JGSESS_V8 void StoreExact(Pair<F32x8> x, Bf16Bits* p) {
  const __m256i even = _mm256_srli_epi32(_mm256_castps_si256(x.a.v), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm256_or_si256(_mm256_castps_si256(x.b.v), even));
}
#endif  // JGSESS_SIMD_X86

// Runs region.template operator()<F>() (a generic lambda marked JGSESS_REGION) for the lane type
// F of HostIsa(), compiled for that instruction set (simd.h's trampolines).
// kPaired: two vectors at a time (Pair), where every buffer is bf16.
template <bool kPaired = false, typename Region>
void VectorizedLanes(Region&& region) {
#if defined(JGSESS_SIMD_X86)
  using Wide = std::conditional_t<kPaired, Pair<F32x16>, F32x16>;
  using Narrow = std::conditional_t<kPaired, Pair<F32x8>, F32x8>;
  switch (HostIsa()) {
    case Isa::kAvx512: {
      auto run = [&]() JGSESS_REGION { region.template operator()<Wide>(); };
      return simd_detail::RunAvx512(run);
    }
    case Isa::kAvx2: {
      auto run = [&]() JGSESS_REGION { region.template operator()<Narrow>(); };
      return simd_detail::RunAvx2(run);
    }
    default: break;
  }
#endif
  auto run = [&]() JGSESS_REGION { region.template operator()<float>(); };
  simd_detail::RunBaseline(run);
}

// ---- per-call constants in lanes ---------------------------------------------------------------

// A struct of floats written as a template of its lane type (AdamwHyperT<float>, ...), rebound
// to another lane type.
template <typename S, typename F>
struct Rebound;
template <template <typename> class S, typename F>
struct Rebound<S<float>, F> {
  using type = S<F>;
};

// `s` with each field splatted to F's lanes.
template <typename F, typename S, size_t... kFields>
JGSESS_REGION inline typename Rebound<S, F>::type SplatFields(const S& s,
                                                              std::index_sequence<kFields...>) {
  float values[sizeof...(kFields)];
  std::memcpy(values, &s, sizeof(S));
  return {Splat<F>(values[kFields])...};
}
template <typename F, typename S>
JGSESS_REGION inline typename Rebound<S, F>::type SplatAll(const S& s) {
  constexpr size_t kCount = sizeof(S) / sizeof(float);
  static_assert(sizeof(S) == kCount * sizeof(float), "a struct of floats");
  return SplatFields<F>(s, std::make_index_sequence<kCount>{});
}

// body.template operator()<F>(i, consts...) for i in [0, n): whole vectors of the widest lanes
// HostIsa() allows (i += kLanes<F>), then the tail one float at a time; each of `consts` (structs
// of floats, as AdamwHyperT<float>) rebound to the lane type and splatted once, for the loop.
// The body reads and writes elements [i, i + kLanes<F>) only, and captures by value. kPaired:
// Pair lanes (every buffer bf16).
template <bool kPaired = false, typename Body, typename... Consts>
void VecFor(int64_t n, Body&& body, const Consts&... consts) {
  VectorizedLanes<kPaired>([&]<typename F>() JGSESS_REGION {
    // copies in the region's frame, held in registers (a store through a may-alias vector
    // pointer would otherwise reload the body's pointers and constants every iteration)
    const auto each = body;
    const int64_t count = n;
    const std::tuple<typename Rebound<Consts, F>::type...> splat{SplatAll<F>(consts)...};
    const std::tuple<Consts...> scalar{consts...};
    int64_t i = 0;
    if constexpr (kLanes<F> > 1) {
      for (; i + kLanes<F> <= count; i += kLanes<F>) {
        std::apply([&](const auto&... c) { each.template operator()<F>(i, c...); }, splat);
      }
    }
    // the tail, or every element on the baseline: the float math, which the compiler vectorizes
    std::apply(
        [&](const auto&... c) JGSESS_REGION {
#pragma omp simd
          for (int64_t j = i; j < count; ++j) each.template operator()<float>(j, c...);
        },
        scalar);
  });
}

// ---- whole ranges ------------------------------------------------------------------------------

// dst[0, n) = src[begin, begin + n) widened to f32 (copied, if it is f32).
inline void LoadF32(DataType type, const void* src, int64_t begin, int64_t n, float* dst) {
  auto widen = [dst]<typename T>(const T* from, int64_t n) {
    VecFor(n,
           [from, dst]<typename F>(int64_t i) JGSESS_REGION { Store(Load<F>(from + i), dst + i); });
  };
  if (type == DataType::F32) {
    std::copy_n(static_cast<const float*>(src) + begin, n, dst);
  } else if (type == DataType::BF16) {
    widen(static_cast<const Bf16Bits*>(src) + begin, n);
  } else {  // F16
    widen(static_cast<const _Float16*>(src) + begin, n);
  }
}

// dst[begin, begin + n) = src[0, n) rounded to dst's type, to nearest even (copied, if it is f32).
inline void StoreF32(DataType type, const float* src, void* dst, int64_t begin, int64_t n) {
  auto narrow = [src]<typename T>(T* to, int64_t n) {
    VecFor(n, [src, to]<typename F>(int64_t i) JGSESS_REGION { Store(Load<F>(src + i), to + i); });
  };
  if (type == DataType::F32) {
    std::copy_n(src, n, static_cast<float*>(dst) + begin);
  } else if (type == DataType::BF16) {
    narrow(static_cast<Bf16Bits*>(dst) + begin, n);
  } else {  // F16
    narrow(static_cast<_Float16*>(dst) + begin, n);
  }
}

}  // namespace jgsess
