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
// kMomentumNarrowMath it is written in the tensors' bf16/f16 (every buffer of a tensor one
// narrow type): each operation's result rounded to it, as XLA's code computes it.
#pragma once

#include <cstdint>

#include "common/dispatch.h"
#include "common/ffi.h"
#include "common/host_device.h"
#include "common/optimizer.h"
#include "common/tensor_list.h"

namespace jgsess {

enum MomentumFlags : int64_t {
  kMomentumWeightDecay = 1,
  kMomentumScale = 2,
  kMomentumNesterov = 4,
  kMomentumUpdate = 8,       // result 0 is optax's update -(lr*d), not the new parameter
  kMomentumNarrowMath = 16,  // every operation rounded to the tensor's bf16/f16
};

// The hyper-parameters, rank-0 f32 operands in this order before the tensors
// (jgsess/kernels/momentum.py: SCALARS).
struct MomentumHyper {
  float lr, mu, wd, scale;
};

template <int64_t kFlags, typename Q = InF32>
JGSESS_HOST_DEVICE void MomentumElement(const MomentumHyper& h, float p, float g, float acc,
                                        float* p_out, float* acc_out, Q q = {}) {
  float gt = g;
  if constexpr ((kFlags & kMomentumWeightDecay) != 0) gt = q(q(p * h.wd) + gt);
  if constexpr ((kFlags & kMomentumScale) != 0) gt = q(gt * h.scale);
  const float acc2 = q(q(h.mu * acc) + gt);
  float d = acc2;
  if constexpr ((kFlags & kMomentumNesterov) != 0) d = q(gt + q(h.mu * acc2));
  *p_out = StepResult<(kFlags & kMomentumUpdate) != 0>(p, h.lr, d, q);
  *acc_out = acc2;
}

constexpr int64_t kMomentumForms = 32;  // flags in [0, 32)

}  // namespace jgsess

JGSESS_DECLARE_HANDLERS(Momentum);
