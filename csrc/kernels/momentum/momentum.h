// SGD with momentum, one element at a time; shared by the CPU and CUDA handlers.
//
// Operands (per tensor): p, g, acc -> p', acc'. Hyper-parameters are rank-0 f32 buffers. The
// order of operations is the reference's (jgsess/kernels/momentum.py):
//
//   g~   = g                   g~ = p*wd + g~   (kWeightDecay)    g~ = g~*scale   (kScale)
//   acc' = mu*acc + g~
//   d    = acc'                d  = g~ + mu*acc'                                  (kNesterov)
//   p'   = p - lr*d            or the update itself, -(lr*d)                       (kUpdate)
//
// optax.sgd(momentum, nesterov) and MindSpore's ApplyMomentum with weight decay and/or a loss
// scale [ApplyMomentum{WeightDecay,Scale,WeightDecayScale}Fusion] are all this formula. Under
// kNarrowMath it is written in the tensors' bf16/f16 (every buffer of a tensor one
// narrow type): each operation's result rounded to it, as XLA's code computes it.
#pragma once

#include <cstdint>
#include <vector>

#include "common/dispatch.h"
#include "common/ffi.h"
#include "common/flags.h"
#include "common/host_device.h"
#include "common/optimizer.h"
#include "common/tensor_list.h"

namespace jgsess {

enum class MomentumFlag : int64_t {
  kWeightDecay = 1,
  kScale = 2,
  kNesterov = 4,
  kUpdate = 8,       // result 0 is optax's update -(lr*d), not the new parameter
  kNarrowMath = 16,  // every operation rounded to the tensor's bf16/f16
};

inline constexpr FlagName kMomentumFlagNames[] = {
    {"WEIGHT_DECAY", Bits(MomentumFlag::kWeightDecay)}, {"SCALE", Bits(MomentumFlag::kScale)},
    {"NESTEROV", Bits(MomentumFlag::kNesterov)},        {"UPDATE", Bits(MomentumFlag::kUpdate)},
    {"NARROW", Bits(MomentumFlag::kNarrowMath)},
};

// The hyper-parameters, rank-0 f32 operands in this order before the tensors
// (jgsess/kernels/momentum.py: SCALARS); F: their lanes (a float, or a CPU vector: common/vec.h).
template <typename F>
struct MomentumHyperT {
  F lr, mu, wd, scale;
};
using MomentumHyper = MomentumHyperT<float>;

// F: the lanes (a float, or a CPU vector of them, which gives the same bits lane by lane).
template <int64_t kFlags, typename F, typename Q = InF32>
JGSESS_HOST_DEVICE void MomentumElement(const MomentumHyperT<F>& h, F p, F g, F acc, F* p_out,
                                        F* acc_out, Q q = {}) {
  F gt = g;
  if constexpr (Has(kFlags, MomentumFlag::kWeightDecay)) gt = q(q(p * h.wd) + gt);
  if constexpr (Has(kFlags, MomentumFlag::kScale)) gt = q(gt * h.scale);
  const F acc2 = q(q(h.mu * acc) + gt);
  F d = acc2;
  if constexpr (Has(kFlags, MomentumFlag::kNesterov)) d = q(gt + q(h.mu * acc2));
  *p_out = StepResult<Has(kFlags, MomentumFlag::kUpdate)>(p, h.lr, d, q);
  *acc_out = acc2;
}

// The family, for the handlers' shared front (common/tensor_list.h: DispatchOptimizer).
struct MomentumFamily {
  static constexpr const char* kName = "momentum";
  using Hyper = MomentumHyper;
  static constexpr int kIn = 3, kOut = 2;  // p, g, acc -> p', acc'
  static constexpr int64_t kForms = 32;    // flags in [0, 32), all of them
  static constexpr bool Valid(int64_t) { return true; }
  template <int64_t kFlags>
  static ffi::Error Check(const std::vector<TensorSlots<kIn, kOut>>& tensors) {
    if constexpr (Has(kFlags, MomentumFlag::kNarrowMath)) return CheckNarrow(kName, tensors);
    return ffi::Error::Success();
  }
};

}  // namespace jgsess

JGSESS_DECLARE_HANDLERS(Momentum);
