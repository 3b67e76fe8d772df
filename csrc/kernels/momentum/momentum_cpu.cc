// Multi-tensor SGD with momentum on the CPU: all cores, inner loops for the CPU's widest
// vectors (common/simd.h); bf16 / f16 parameters, gradients and accumulators are widened on
// load and rounded on store (bf16 parameters and gradients in registers); an update written in
// bf16/f16 (MomentumFlag::kNarrowMath) reads and writes its narrow buffers in place.
#include "common/ffi.h"
#include "common/multi_tensor_cpu.h"
#include "common/simd.h"
#include "kernels/momentum/momentum.h"

namespace jgsess {
namespace {

ffi::Error MomentumCpuImpl(ffi::ThreadPool pool, Args args, Rets rets, int64_t flags) {
  return DispatchOptimizer<MomentumFamily>(
      args, rets, flags, [&]<int64_t kFlags>(const auto& member, const auto& part) {
        const MomentumHyper h = LoadHyper(member);
        if constexpr (Has(kFlags, MomentumFlag::kNarrowMath)) {
          auto step = [&](auto q, const auto* const* in, auto* const* out, int64_t n) {
            SimdFor(n, [&](int64_t i) {
              float p2, acc2;
              MomentumElement<kFlags>(h, Widen(in[0][i]), Widen(in[1][i]), Widen(in[2][i]), &p2,
                                      &acc2, q);
              NarrowExact(p2, &out[0][i]);
              NarrowExact(acc2, &out[1][i]);
            });
          };
          RunNarrowOptimizer<3, 2>(pool, part, step);
        } else {
          auto step = [&](const auto* p, const auto* g, const auto* acc, const float* const*,
                          auto* p_out, auto* acc_out, float* const*, int64_t n) {
            SimdFor(n, [&](int64_t i) {
              float p2, acc2;
              MomentumElement<kFlags>(h, Widen(p[i]), Widen(g[i]), Widen(acc[i]), &p2, &acc2);
              Narrow(p2, &p_out[i]);
              Narrow(acc2, &acc_out[i]);
            });
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
