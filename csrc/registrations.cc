// The one table of FFI targets: target name -> {platform: handler capsule}.
#include "registrations.h"

#include <type_traits>

#include "kernels/adamw/adamw.h"
#include "kernels/cast_all/cast_all.h"
#include "kernels/global_norm/global_norm.h"
#include "kernels/momentum/momentum.h"
#include "kernels/relu_mask/relu_mask.h"

namespace jgsess {
namespace {

template <typename T>
pybind11::capsule Capsule(T* handler) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>,
                "an FFI handler must take an XLA_FFI_CallFrame*");
  return pybind11::capsule(reinterpret_cast<void*>(handler), "xla._CUSTOM_CALL_TARGET");
}

// {"cpu": cpu} plus {"CUDA": cuda} when the CUDA kernels are built in.
template <typename Cpu, typename Cuda>
pybind11::dict Platforms(Cpu* cpu, [[maybe_unused]] Cuda* cuda) {
  pybind11::dict platforms;
  platforms["cpu"] = Capsule(cpu);
#if defined(JGSESS_WITH_CUDA)
  platforms["CUDA"] = Capsule(cuda);
#endif
  return platforms;
}

#if !defined(JGSESS_WITH_CUDA)
// Stand-ins so the table reads the same with and without CUDA; never called.
using Handler = XLA_FFI_Error*(XLA_FFI_CallFrame*);
constexpr Handler* AdamwCuda = nullptr;
constexpr Handler* CastAllCuda = nullptr;
constexpr Handler* GlobalNormCuda = nullptr;
constexpr Handler* MomentumCuda = nullptr;
constexpr Handler* ReluMaskCuda = nullptr;
constexpr Handler* ReluMaskGradCuda = nullptr;
#endif

}  // namespace

pybind11::dict Registrations() {
  pybind11::dict table;
  table["jgsess_adamw"] = Platforms(AdamwCpu, AdamwCuda);
  table["jgsess_cast_all"] = Platforms(CastAllCpu, CastAllCuda);
  table["jgsess_global_norm"] = Platforms(GlobalNormCpu, GlobalNormCuda);
  table["jgsess_momentum"] = Platforms(MomentumCpu, MomentumCuda);
  table["jgsess_relu_mask"] = Platforms(ReluMaskCpu, ReluMaskCuda);
  table["jgsess_relu_mask_grad"] = Platforms(ReluMaskGradCpu, ReluMaskGradCuda);
  return table;
}

bool HasCuda() {
#if defined(JGSESS_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

}  // namespace jgsess
