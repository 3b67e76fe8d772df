// Multi-tensor SGD with momentum on the CPU: all cores, the element math on the CPU's widest
// vectors (common/vec.h); bf16 / f16 parameters, gradients and accumulators are widened on
// load and rounded on store (bf16 parameters and gradients in registers); an update written in
// bf16/f16 (MomentumFlag::kNarrowMath) reads and writes its narrow buffers in place.
#include <type_traits>

#include "common/ffi.h"
#include "common/multi_tensor_cpu.h"
#include "common/vec.h"
#include "kernels/momentum/momentum.h"

namespace jgsess {
namespace {

ffi::Error MomentumCpuImpl(ffi::ThreadPool pool, Args args, Rets rets, int64_t flags) {
  return DispatchOptimizer<MomentumFamily>(
      args, rets, flags, [&]<int64_t kFlags>(const auto& member, const auto& part) {
        const MomentumHyper h = LoadHyper(member);
        if constexpr (Has(kFlags, MomentumFlag::kNarrowMath)) {
          auto step = [&](auto q, const auto* const* in, auto* const* out, int64_t n) {
            const auto *p = in[0], *g = in[1], *acc = in[2];
            auto *p_out = out[0], *acc_out = out[1];
            constexpr bool kBf16 = std::is_same_v<std::remove_cvref_t<decltype(*p)>, Bf16Bits>;
            VecFor<kBf16>(  // bf16: even and odd lanes, two vectors a step
                n,
                [=]<typename F>(int64_t i, const auto& hv) JGSESS_REGION {
                  F p2, acc2;
                  MomentumElement<kFlags>(hv, Load<F>(p + i), Load<F>(g + i), Load<F>(acc + i), &p2,
                                          &acc2, q);
                  StoreExact(p2, p_out + i);
                  StoreExact(acc2, acc_out + i);
                },
                h);
          };
          RunNarrowOptimizer<3, 2>(pool, part, step);
        } else {
          auto step = [&](const auto* p, const auto* g, const auto* acc, const auto* const*,
                          auto* p_out, auto* acc_out, auto* const*, int64_t n) {
            VecFor(
                n,
                [=]<typename F>(int64_t i, const auto& hv) JGSESS_REGION {
                  F p2, acc2;
                  MomentumElement<kFlags>(hv, Load<F>(p + i), Load<F>(g + i), Load<F>(acc + i), &p2,
                                          &acc2);
                  Store(p2, p_out + i);
                  Store(acc2, acc_out + i);
                },
                h);
          };
          RunOptimizer<3, 2>(pool, part, step);
        }
        return ffi::Error::Success();
      });
}

}  // namespace
}  // namespace jgsess

XLA_FFI_DEFINE_HANDLER_SYMBOL(MomentumCpu, jgsess::MomentumCpuImpl,
                              jgsess::MultiTensorBinding<xla::ffi::ThreadPool>());
