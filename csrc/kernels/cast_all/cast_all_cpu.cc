// Multi-tensor cast on the CPU: widen to f32 on load, round on store, all cores.
#include <algorithm>

#include "common/ffi.h"
#include "common/multi_tensor_cpu.h"
#include "kernels/cast_all/cast_all.h"

namespace jgsess {
namespace {

ffi::Error CastAllCpuImpl(ffi::ThreadPool pool, Args args, Rets rets) {
  auto tensors = ParseTensors<1, 1>("cast_all", args, 0, &rets);
  if (tensors.has_error()) return tensors.error();
  RunMultiTensor<1, 1>(pool, *tensors, [](const float* const* in, float* const* out, int64_t n) {
    std::copy(in[0], in[0] + n, out[0]);
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jgsess

XLA_FFI_DEFINE_HANDLER_SYMBOL(CastAllCpu, jgsess::CastAllCpuImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .RemainingArgs()    // x per tensor
                                  .RemainingRets());  // y per tensor
