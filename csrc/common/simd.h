// Vector code for the widest instruction set the CPU has, chosen at run time.
//
// The library is built for any CPU of its architecture (no -march). On x86-64 a Vectorized
// region (a lambda) is also compiled for AVX2 and for AVX-512: it is inlined into one trampoline
// per instruction set, each with its own target attribute, so only such regions use those
// instructions, and the first call picks the widest the CPU (and the OS) supports;
// CapSimd caps the choice (jgsess._C.cap_simd, which Python calls with JGSESS_SIMD at import:
// tests run every path). Regions use exact IEEE
// operations only, the build turns FMA contraction off (-ffp-contract=off), and reductions are
// left to the baseline loops unless exact in any order (an OR of bits), so every version gives
// the same bits.
//
//   SimdFor(n, [&](int64_t i) { out[i] = a[i] * s + b[i]; });          // one loop
//   Vectorized([&]() JGSESS_REGION { for (...) { ... #pragma omp simd ... } });  // a loop nest
//
// A SimdFor body may write element i of its outputs only (the iterations run as SIMD lanes).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>

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

// The widest instruction set of this CPU (and OS); detected once per process.
inline Isa DetectedIsa() {
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
    return best;
  }();
  return isa;
}

// The widest instruction set the vector loops may use (kAvx512: no cap).
inline std::atomic<Isa>& SimdCap() {
  static std::atomic<Isa> cap{Isa::kAvx512};
  return cap;
}

// Caps the vector loops at the instruction set `name` ("baseline", "avx2"); any other name
// lifts the cap.
inline void CapSimd(const std::string& name) {
  Isa cap = Isa::kAvx512;
  for (Isa lower : {Isa::kBaseline, Isa::kAvx2}) {
    if (name == IsaName(lower)) cap = lower;
  }
  SimdCap().store(cap, std::memory_order_relaxed);
}

// The instruction set the vector loops run with: the CPU's widest, capped.
inline Isa HostIsa() { return std::min(DetectedIsa(), SimdCap().load(std::memory_order_relaxed)); }

namespace simd_detail {

// Each version is flattened: everything the region calls (a SimdFor body, the element
// functions it calls) is inlined into it, so the loop is vectorized for that version's
// instructions whatever the inliner would decide on its own (an AdamW body with bf16
// conversions was left as a call per element, far slower than f32).
template <typename F>
__attribute__((flatten)) void RunBaseline(F& region) {
  region();
}

#if defined(JGSESS_SIMD_X86)
#if defined(__clang__)
#define JGSESS_AVX512_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"), min_vector_width(512)))
#else
#define JGSESS_AVX512_TARGET \
  __attribute__((            \
      target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,prefer-vector-width=512")))
#endif

// f16c: _Float16 <-> float conversions in the regions become vcvtph2ps / vcvtps2ph
template <typename F>
__attribute__((target("avx2,fma,f16c"), flatten)) void RunAvx2(F& region) {
  region();
}

template <typename F>
JGSESS_AVX512_TARGET __attribute__((flatten)) void RunAvx512(F& region) {
  region();
}
#endif

}  // namespace simd_detail

// A region's lambda is inlined into each version (and its loops vectorized there), whatever
// the inliner would decide on its own.
#define JGSESS_REGION __attribute__((always_inline))

// Runs region(), a lambda marked JGSESS_REGION, compiled for HostIsa():
//   Vectorized([&]() JGSESS_REGION { for (...) { ...; #pragma omp simd for (...) ... } });
template <typename F>
void Vectorized(F&& region) {
#if defined(JGSESS_SIMD_X86)
  switch (HostIsa()) {
    case Isa::kAvx512: return simd_detail::RunAvx512(region);
    case Isa::kAvx2: return simd_detail::RunAvx2(region);
    default: break;
  }
#endif
  simd_detail::RunBaseline(region);
}

// body(i) for i in [0, n), vectorized for HostIsa().
template <typename F>
void SimdFor(int64_t n, F&& body) {
  Vectorized([&]() JGSESS_REGION {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) body(i);
  });
}

}  // namespace jgsess
