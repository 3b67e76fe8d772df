// Multi-tensor Adam / AdamW on the CPU: all cores (XLA's intra-op pool), SIMD inner loops;
// bf16 / f16 parameters and gradients are widened on load and rounded on store.
#include "common/convert.h"
#include "common/ffi.h"
#include "kernels/adamw/adamw.h"

namespace jgsess {
namespace {

ffi::Error AdamwCpuImpl(ffi::ThreadPool pool, Args args, Rets rets, int64_t flags) {
  auto hyper = ParseHyper<AdamwHyper>("adamw", args);
  if (hyper.has_error()) return hyper.error();
  // p, g, m, v -> p', m', v'; the moments stay f32
  auto tensors = ParseTensors<4, 3>("adamw", args, kHyperCount<AdamwHyper>, &rets, 0b1100, 0b110);
  if (tensors.has_error()) return tensors.error();
  return DispatchFlags<kAdamwForms>(flags, "adamw", [&]<int64_t kFlags>() {
    return ForEachMember("adamw", *hyper, *tensors, [&](const auto& member, const auto& part) {
      const AdamwHyper h = LoadHyper(member);
      const AdamwReciprocals r = Reciprocals(h);
      RunMultiTensor<4, 3>(pool, part, [&](const float* const* in, float* const* out, int64_t n) {
      // outputs may be their operands (in place); element i touches index i only
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) {
          AdamwElement<kFlags>(h, r, in[0][i], in[1][i], in[2][i], in[3][i], &out[0][i], &out[1][i],
                               &out[2][i]);
        }
      });
      return ffi::Error::Success();
    });
  });
}

}  // namespace
}  // namespace jgsess

XLA_FFI_DEFINE_HANDLER_SYMBOL(AdamwCpu, jgsess::AdamwCpuImpl,
                              jgsess::MultiTensorBinding<xla::ffi::ThreadPool>());
