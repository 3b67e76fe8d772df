// The SIMT emulator's part of the test-only extension `_testing` (csrc/testing/module.cc):
// every CUDA handler, compiled for the emulator (simt.h) and run on guarded buffers (guard.h),
// as CPU FFI targets `jgsess_simt_<name>`; and the deliberately broken kernels that show each of
// the emulator's checks firing.
#include "testing/emulator/module.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <tuple>
#include <vector>

#include "common/cuda_devices.h"
#include "kernels/kernels.h"
#include "testing/emulator/broken.h"
#include "testing/emulator/guard.h"
#include "testing/emulator/simt.h"

namespace {

using jgsess::simt::Guarded;

pybind11::capsule Capsule(XLA_FFI_Handler* handler) {
  return pybind11::capsule(reinterpret_cast<void*>(handler), "xla._CUSTOM_CALL_TARGET");
}

// A handler's stages: the instantiate stage loads the kernels' code, as on a GPU.
pybind11::dict Stages(XLA_FFI_Handler* load, XLA_FFI_Handler* execute) {
  pybind11::dict stages;
  stages["instantiate"] = Capsule(load);
  stages["execute"] = Capsule(execute);
  return stages;
}

// table[name] = the stages of `kExecute` under the guard, which names it `name` in its reports
template <XLA_FFI_Handler* kExecute, jgsess::simt::Name kName>
void Put(pybind11::dict& table, XLA_FFI_Handler* load) {
  table[kName.text] = Stages(load, Guarded<kExecute, kName>);
}

// kernel name (its jgsess_<name> target) -> the emulated CUDA handler
pybind11::dict Handlers() {
  pybind11::dict table;
#define JGSESS_EMULATE(target, Handler) Put<Handler##Cuda, #target>(table, Handler##CudaLoad);
  JGSESS_KERNELS(JGSESS_EMULATE)
#undef JGSESS_EMULATE
  return table;
}

// check name -> a handler whose kernel breaks that check (emulator/broken.cu)
pybind11::dict Broken() {
  pybind11::dict table;
  Put<BrokenNone, "correct">(table, BrokenLoad);
  Put<BrokenReadPastEnd, "global_read_past_end">(table, BrokenLoad);
  Put<BrokenWriteBeforeStart, "global_write_before_start">(table, BrokenLoad);
  Put<BrokenSharedRace, "shared_race">(table, BrokenLoad);
  Put<BrokenBarrier, "barrier_divergence">(table, BrokenLoad);
  Put<BrokenShuffle, "shuffle_exited_lane">(table, BrokenLoad);
  Put<BrokenShuffleOutsideMask, "shuffle_outside_mask">(table, BrokenLoad);
  Put<BrokenMisaligned, "misaligned_vector_access">(table, BrokenLoad);
  Put<BrokenBallot, "ballot_exited_lane">(table, BrokenLoad);
  Put<BrokenUnwritten, "result_unwritten">(table, BrokenLoad);
  Put<BrokenOperandWritten, "operand_written">(table, BrokenLoad);
  Put<BrokenUnloaded, "unloaded_kernel">(table, BrokenLoad);
  Put<BrokenNone, "loaded_on_one_device">(table, BrokenLoadCurrentDevice);
  return table;
}

// (bf16 bits, f16 bits) of each value, as the emulated GPU's conversion intrinsics round them
std::vector<std::tuple<int, int>> GpuConversions(const std::vector<float>& values) {
  std::vector<std::tuple<int, int>> out;
  for (float v : values) out.emplace_back(__float2bfloat16_rn(v).bits, __float2half_rn(v).bits);
  return out;
}

}  // namespace

void jgsess::simt::Bind(pybind11::module_& m) {
  m.def("handlers", &Handlers, "kernel name -> PyCapsule of its emulated CUDA handler");
  m.def("broken", &Broken, "check name -> the stages of a handler whose kernel breaks it");
  m.def("gpu_conversions", &GpuConversions,
        "(bf16 bits, f16 bits) of each value through __float2bfloat16_rn / __float2half_rn");
  m.def("launches", &jgsess::simt::Launches,
        "(kernel, grid (x, y, z), block (x, y, z)) of every launch since the last call");
  m.def("use_cuda_devices", &jgsess::UseCudaDevices, pybind11::arg("ordinals"),
        "the emulated CUDA handlers' use_cuda_devices (jgsess._C's, for this extension's copy)");
  m.def("loaded_on", &jgsess::simt::LoadedOn, pybind11::arg("device"),
        "how many kernels were loaded into emulated device `device`'s context");
  m.def("set_devices", &jgsess::simt::SetDevices, pybind11::arg("count"),
        pybind11::arg("launch_device") = -1,
        "emulate `count` devices, launches running on `launch_device` (-1: the current "
        "device); forgets what was loaded, and uses every device");
}
