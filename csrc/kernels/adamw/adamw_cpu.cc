// Multi-tensor Adam / AdamW on the CPU: all cores (XLA's intra-op pool), the element math on the
// CPU's widest vectors (common/vec.h);
// bf16 / f16 parameters, gradients and moments are widened on load and rounded on store (bf16
// parameters and gradients in registers); an update written in bf16/f16 (kNarrowMath) reads and
// writes its narrow buffers in place.
#include <type_traits>

#include "common/ffi.h"
#include "common/multi_tensor_cpu.h"
#include "common/vec.h"
#include "kernels/adamw/adamw.h"

namespace jgsess {
namespace {

// Whether adding eps_root to v^ changes no bit: eps_root is +0, and v^ is never -0 (v' = a sum
// whose first term, (1 - b2)*g*g, is never -0 where 1 - b2 has no sign bit; v^ = v' or its
// quotient by bc2 where bc2 has none). A NaN v^ is a sum's: quiet, kept as it is.
inline bool AddsNothing(const AdamwHyper& h, int64_t flags) {
  const bool corrected = (flags & Bits(AdamwFlag::kBiasCorrection)) != 0;
  return h.eps_root == 0.0f && !std::signbit(h.eps_root) && !std::signbit(h.omb2) &&
         (!corrected || !std::signbit(h.bc2));
}

// One call's (or vmap member's) update in the form kFlags.
template <int64_t kFlags>
void RunForm(ffi::ThreadPool& pool, const AdamwHyper& h, const auto& part) {
  const AdamwReciprocals r = Reciprocals(h);
  // outputs may be their operands (in place); lanes [i, i + lanes) touch those indices only
  if constexpr (Has(kFlags, AdamwFlag::kNarrowMath)) {
    auto run = [&]<bool kB2IsOne>() {
      auto step = [&](auto q, const auto* const* in, auto* const* out, int64_t n) {
        const auto *p = in[0], *g = in[1], *m = in[2], *v = in[3];
        auto *p_out = out[0], *m_out = out[1], *v_out = out[2];
        constexpr bool kBf16 = std::is_same_v<std::remove_cvref_t<decltype(*p)>, Bf16Bits>;
        VecFor<kBf16>(  // bf16: even and odd lanes, two vectors a step
            n,
            [=]<typename F>(int64_t i, const auto& hv, const auto& rv) JGSESS_REGION {
              F p2, m2, v2;
              AdamwElement<kFlags, kB2IsOne>(hv, rv, Load<F>(p + i), Load<F>(g + i), Load<F>(m + i),
                                             Load<F>(v + i), &p2, &m2, &v2, q);
              StoreExact(p2, p_out + i);
              StoreExact(m2, m_out + i);
              StoreExact(v2, v_out + i);
            },
            h, r);
      };
      RunNarrowOptimizer<4, 3>(pool, part, step);
    };
    if (h.b2 == 1.0f) {  // optax's b2 = 0.999 in bf16: v itself, not its product by 1
      run.template operator()<true>();
    } else {
      run.template operator()<false>();
    }
  } else {
    // q: the rounding of kMixed's bf16 operations (InF32: none)
    auto run = [&](auto q) {
      auto step = [&](const auto* p, const auto* g, const auto* m, const auto* const* rest,
                      auto* p_out, auto* m_out, auto* const* rest_out, int64_t n) {
        const auto* v = rest[0];
        auto* v_out = rest_out[0];
        VecFor(
            n,
            [=]<typename F>(int64_t i, const auto& hv, const auto& rv) JGSESS_REGION {
              F p2, m2, v2;
              AdamwElement<kFlags>(hv, rv, Load<F>(p + i), Load<F>(g + i), Load<F>(m + i),
                                   Load<F>(v + i), &p2, &m2, &v2, q);
              Store(p2, p_out + i);
              Store(m2, m_out + i);
              Store(v2, v_out + i);
            },
            h, r);
      };
      RunOptimizer<4, 3>(pool, part, step);
    };
    if constexpr (Has(kFlags, AdamwFlag::kMixed)) {  // bf16 p, g, v: in registers
      run(InBf16{});
    } else {
      run(InF32{});
    }
  }
}

ffi::Error AdamwCpuImpl(ffi::ThreadPool pool, Args args, Rets rets, int64_t flags) {
  return DispatchOptimizer<AdamwFamily>(
      args, rets, flags, [&]<int64_t kFlags>(const auto& member, const auto& part) {
        const AdamwHyper h = LoadHyper(member);
        constexpr int64_t kEpsRoot = Bits(AdamwFlag::kEpsRoot);
        if (Has(kFlags, AdamwFlag::kEpsRoot) && AddsNothing(h, kFlags)) {
          RunForm<(kFlags & ~kEpsRoot)>(pool, h, part);  // the same bits, one add fewer
        } else {
          RunForm<kFlags>(pool, h, part);
        }
        return ffi::Error::Success();
      });
}

}  // namespace
}  // namespace jgsess

XLA_FFI_DEFINE_HANDLER_SYMBOL(AdamwCpu, jgsess::AdamwCpuImpl,
                              jgsess::MultiTensorBinding<xla::ffi::ThreadPool>());
