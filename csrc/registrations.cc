// The one table of FFI targets: target name -> {platform: handler capsule}, made from the
// kernel list (kernels/kernels.h) and the CPU-only async hint.
#include "registrations.h"

#if defined(JGSESS_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "async_hint.h"
#include "kernels/kernels.h"

namespace jgsess {
namespace {

pybind11::capsule Capsule(XLA_FFI_Handler* handler) {
  return pybind11::capsule(reinterpret_cast<void*>(handler), "xla._CUSTOM_CALL_TARGET");
}

// {"cpu": cpu} plus {"CUDA": {"instantiate": load, "execute": cuda}} when the CUDA kernels are
// built in (without them, each kernel header makes its CUDA handlers null stand-ins) and the
// target has a CUDA handler.
pybind11::dict Platforms(XLA_FFI_Handler* cpu, [[maybe_unused]] XLA_FFI_Handler* cuda,
                         [[maybe_unused]] XLA_FFI_Handler* load) {
  pybind11::dict platforms;
  platforms["cpu"] = Capsule(cpu);
#if defined(JGSESS_WITH_CUDA)
  if (cuda != nullptr) {
    pybind11::dict stages;
    stages["instantiate"] = Capsule(load);
    stages["execute"] = Capsule(cuda);
    platforms["CUDA"] = stages;
  }
#endif
  return platforms;
}

}  // namespace

pybind11::dict Registrations() {
  pybind11::dict table;
#define JGSESS_REGISTER(target, Handler) \
  table["jgsess_" #target] = Platforms(Handler##Cpu, Handler##Cuda, Handler##CudaLoad);
  JGSESS_KERNELS(JGSESS_REGISTER)
#undef JGSESS_REGISTER
  table["jgsess_async_hint"] = Platforms(AsyncHintCpu, nullptr, nullptr);  // CPU only
  return table;
}

pybind11::dict CudaBuild() {
  pybind11::dict build;
  pybind11::list sm;
#if defined(JGSESS_WITH_CUDA)
  for (int arch : {JGSESS_CUDA_SM}) sm.append(arch);
  build["ptx"] = JGSESS_CUDA_PTX;
  build["runtime"] = CUDART_VERSION;  // the static CUDA runtime linked in: its driver floor
#else
  build["ptx"] = 0;
  build["runtime"] = 0;
#endif
  build["sm"] = sm;
  return build;
}

int CudaDriverVersion() {
  int version = 0;
#if defined(JGSESS_WITH_CUDA)
  if (cudaDriverGetVersion(&version) != cudaSuccess) version = 0;
#endif
  return version;
}

bool HasCuda() {
#if defined(JGSESS_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

}  // namespace jgsess
