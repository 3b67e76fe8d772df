// The SIMT emulator's part of the test-only extension `_testing` (csrc/testing/module.cc):
// every CUDA handler, compiled for the emulator (simt.h) and run on guarded buffers (guard.h),
// as CPU FFI targets `jgsess_simt_<name>`; and the deliberately broken kernels that show each of
// the emulator's checks firing.
#include "emulator/module.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <tuple>
#include <vector>

#include "emulator/broken.h"
#include "emulator/guard.h"
#include "emulator/simt.h"
#include "kernels/adamw/adamw.h"
#include "kernels/batch_norm/batch_norm.h"
#include "kernels/cast_all/cast_all.h"
#include "kernels/global_norm/global_norm.h"
#include "kernels/momentum/momentum.h"
#include "kernels/relu_mask/relu_mask.h"

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

// kernel name (its jgsess_<name> target) -> the emulated CUDA handler
pybind11::dict Handlers() {
  pybind11::dict table;
  table["adamw"] = Stages(AdamwCudaLoad, Guarded<AdamwCuda, "adamw">);
  table["batch_norm_relu"] =
      Stages(BatchNormReluCudaLoad, Guarded<BatchNormReluCuda, "batch_norm_relu">);
  table["batch_norm_add_relu"] =
      Stages(BatchNormAddReluCudaLoad, Guarded<BatchNormAddReluCuda, "batch_norm_add_relu">);
  table["batch_norm_relu_grad"] =
      Stages(BatchNormReluGradCudaLoad, Guarded<BatchNormReluGradCuda, "batch_norm_relu_grad">);
  table["batch_norm_add_relu_grad"] = Stages(
      BatchNormAddReluGradCudaLoad, Guarded<BatchNormAddReluGradCuda, "batch_norm_add_relu_grad">);
  table["cast_all"] = Stages(CastAllCudaLoad, Guarded<CastAllCuda, "cast_all">);
  table["global_norm"] = Stages(GlobalNormCudaLoad, Guarded<GlobalNormCuda, "global_norm">);
  table["momentum"] = Stages(MomentumCudaLoad, Guarded<MomentumCuda, "momentum">);
  table["relu_mask"] = Stages(ReluMaskCudaLoad, Guarded<ReluMaskCuda, "relu_mask">);
  table["relu_mask_grad"] =
      Stages(ReluMaskGradCudaLoad, Guarded<ReluMaskGradCuda, "relu_mask_grad">);
  return table;
}

// check name -> a handler whose kernel breaks that check (emulator/broken.cu)
pybind11::dict Broken() {
  pybind11::dict table;
  table["correct"] = Stages(BrokenLoad, Guarded<BrokenNone, "correct">);
  table["global_read_past_end"] =
      Stages(BrokenLoad, Guarded<BrokenReadPastEnd, "global_read_past_end">);
  table["global_write_before_start"] =
      Stages(BrokenLoad, Guarded<BrokenWriteBeforeStart, "global_write_before_start">);
  table["shared_race"] = Stages(BrokenLoad, Guarded<BrokenSharedRace, "shared_race">);
  table["barrier_divergence"] = Stages(BrokenLoad, Guarded<BrokenBarrier, "barrier_divergence">);
  table["shuffle_exited_lane"] = Stages(BrokenLoad, Guarded<BrokenShuffle, "shuffle_exited_lane">);
  table["ballot_exited_lane"] = Stages(BrokenLoad, Guarded<BrokenBallot, "ballot_exited_lane">);
  table["result_unwritten"] = Stages(BrokenLoad, Guarded<BrokenUnwritten, "result_unwritten">);
  table["operand_written"] = Stages(BrokenLoad, Guarded<BrokenOperandWritten, "operand_written">);
  table["unloaded_kernel"] = Stages(BrokenLoad, Guarded<BrokenUnloaded, "unloaded_kernel">);
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
}
