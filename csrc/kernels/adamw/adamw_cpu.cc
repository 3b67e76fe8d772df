// Multi-tensor Adam / AdamW on the CPU: all cores (XLA's intra-op pool), inner loops for the
// CPU's widest vectors (common/simd.h);
// bf16 / f16 parameters, gradients and moments are widened on load and rounded on store (bf16
// parameters and gradients in registers); an update written in bf16/f16 (kNarrowMath) reads and
// writes its narrow buffers in place.
#include "common/ffi.h"
#include "common/multi_tensor_cpu.h"
#include "common/simd.h"
#include "kernels/adamw/adamw.h"

namespace jgsess {
namespace {

ffi::Error AdamwCpuImpl(ffi::ThreadPool pool, Args args, Rets rets, int64_t flags) {
  return DispatchOptimizer<AdamwFamily>(
      args, rets, flags, [&]<int64_t kFlags>(const auto& member, const auto& part) {
        const AdamwHyper h = LoadHyper(member);
        const AdamwReciprocals r = Reciprocals(h);
        // outputs may be their operands (in place); element i touches index i only
        if constexpr (Has(kFlags, AdamwFlag::kNarrowMath)) {
          auto step = [&](auto q, const auto* const* in, auto* const* out, int64_t n) {
            SimdFor(n, [&](int64_t i) {
              float p2, m2, v2;
              AdamwElement<kFlags>(h, r, Widen(in[0][i]), Widen(in[1][i]), Widen(in[2][i]),
                                   Widen(in[3][i]), &p2, &m2, &v2, q);
              NarrowExact(p2, &out[0][i]);
              NarrowExact(m2, &out[1][i]);
              NarrowExact(v2, &out[2][i]);
            });
          };
          RunNarrowOptimizer<4, 3>(pool, part, step);
        } else {
          // q: the rounding of kMixed's bf16 operations (InF32: none)
          auto run = [&](auto q) {
            auto step = [&](const auto* p, const auto* g, const auto* m, const auto* const* rest,
                            auto* p_out, auto* m_out, auto* const* rest_out, int64_t n) {
              const auto* v = rest[0];
              auto* v_out = rest_out[0];
              SimdFor(n, [&](int64_t i) {
                float p2, m2, v2;
                AdamwElement<kFlags>(h, r, Widen(p[i]), Widen(g[i]), Widen(m[i]), Widen(v[i]), &p2,
                                     &m2, &v2, q);
                Narrow(p2, &p_out[i]);
                Narrow(m2, &m_out[i]);
                Narrow(v2, &v_out[i]);
              });
            };
            RunOptimizer<4, 3>(pool, part, step);
          };
          if constexpr (Has(kFlags, AdamwFlag::kMixed)) {  // bf16 p, g, v: in registers
            run(InBf16{});
          } else {
            run(InF32{});
          }
        }
        return ffi::Error::Success();
      });
}

}  // namespace
}  // namespace jgsess

XLA_FFI_DEFINE_HANDLER_SYMBOL(AdamwCpu, jgsess::AdamwCpuImpl,
                              jgsess::MultiTensorBinding<xla::ffi::ThreadPool>());
