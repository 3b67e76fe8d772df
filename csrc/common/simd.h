// Vector loops for the widest instruction set the CPU has, chosen at run time.
//
// The library is built for any CPU of its architecture (no -march). On x86-64 the loop of
// SimdFor is also compiled for AVX2 and for AVX-512 through per-function target attributes, so
// only that loop uses those instructions, and the first call picks the widest the CPU (and the
// OS) supports; JGSESS_SIMD=baseline|avx2|avx512 caps the choice (tests run every path). The
// loop bodies are inlined into each version. They use exact IEEE operations only, and the build
// turns FMA contraction off (-ffp-contract=off), so every version gives the same bits.
//
//   SimdFor(n, [&](int64_t i) { out[i] = a[i] * s + b[i]; });
//
// A body may write element i of its outputs only (the iterations run as SIMD lanes).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace jgsess {

enum class Isa : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

inline const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "baseline";
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define JGSESS_SIMD_X86 1
#endif

// The widest instruction set of this CPU, capped by JGSESS_SIMD; decided once per process.
inline Isa HostIsa() {
  static const Isa isa = [] {
    Isa best = Isa::kBaseline;
#if defined(JGSESS_SIMD_X86)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = Isa::kAvx2;
    if (best == Isa::kAvx2 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq")) {
      best = Isa::kAvx512;
    }
#endif
    const char* cap = std::getenv("JGSESS_SIMD");
    for (Isa lower : {Isa::kBaseline, Isa::kAvx2}) {
      if (cap != nullptr && std::strcmp(cap, IsaName(lower)) == 0 && lower < best) best = lower;
    }
    return best;
  }();
  return isa;
}

namespace simd_detail {

template <typename F>
void LoopBaseline(int64_t n, F& body) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) body(i);
}

#if defined(JGSESS_SIMD_X86)
// f16c: _Float16 <-> float conversions in the bodies become vcvtph2ps / vcvtps2ph
template <typename F>
__attribute__((target("avx2,fma,f16c"))) void LoopAvx2(int64_t n, F& body) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) body(i);
}

#if defined(__clang__)
#define JGSESS_AVX512_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"), min_vector_width(512)))
#else
#define JGSESS_AVX512_TARGET \
  __attribute__((            \
      target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,prefer-vector-width=512")))
#endif

template <typename F>
JGSESS_AVX512_TARGET void LoopAvx512(int64_t n, F& body) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) body(i);
}
#endif

}  // namespace simd_detail

// body(i) for i in [0, n), vectorized for HostIsa().
template <typename F>
void SimdFor(int64_t n, F&& body) {
#if defined(JGSESS_SIMD_X86)
  switch (HostIsa()) {
    case Isa::kAvx512: return simd_detail::LoopAvx512(n, body);
    case Isa::kAvx2: return simd_detail::LoopAvx2(n, body);
    default: break;
  }
#endif
  simd_detail::LoopBaseline(n, body);
}

}  // namespace jgsess
