// Adam / AdamW update, one element at a time; shared by the CPU and CUDA handlers.
//
// Operands (per tensor): p, g, m, v -> p', m', v'. Hyper-parameters are rank-0 f32 buffers, so a
// learning-rate schedule never recompiles. Under kExact the order of operations is the
// reference's (jgsess/kernels/adamw.py), each division an IEEE division:
//
//   g  = keep ? g : (g/norm)*clip   (optax.clip_by_global_norm folded in: kClip)
//   m' = omb1*g + b1*m            v' = omb2*g*g + b2*v
//   m^ = m'/bc1                   v^ = v'/bc2                       (kBiasCorrection)
//   u  = m^ / (sqrt(v^ + eps_root) + eps)                           (eps_root: kEpsRoot)
//   u += wd*p                                                       (kWeightDecay)
//   p' = p - lr*u                 or the update itself, -(lr*u)     (kUpdate)
//
// Without kExact a division by a per-call constant is a multiplication by its reciprocal
// (m' * (1/bc1), v' * (1/bc2), g * (clip/norm)), as XLA's CPU code computes `x / scalar`: the
// results equal the reference's as XLA runs it, bit for bit (benchmarks/optimizer_ulp.py), and
// two of three divisions per element go. kExact divides (IEEE division, as numpy does).
//
// Under kNarrowMath the update is optax's written in the tensors' bf16/f16 (every buffer of a
// tensor one narrow type): the same operations, each result rounded to that type
// (optimizer.h's InBf16 / InF16), as XLA's code for it computes them; with no clip and never
// exact (XLA's narrow `x / scalar` rounds to the same bits either way).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/dispatch.h"
#include "common/ffi.h"
#include "common/host_device.h"
#include "common/optimizer.h"
#include "common/tensor_list.h"

namespace jgsess {

enum AdamwFlags : int64_t {
  kBiasCorrection = 1,
  kEpsRoot = 2,
  kWeightDecay = 4,
  kUpdate = 8,  // result 0 is optax's update -(lr*u), not the new parameter
  kClip = 16,
  kExact = 32,       // IEEE division where the formula divides (JGSESS_NUMERICS=exact)
  kNarrowMath = 64,  // every operation rounded to the tensor's bf16/f16
};

// The hyper-parameters, rank-0 f32 operands in this order before the tensors
// (jgsess/kernels/adamw.py: SCALARS).
struct AdamwHyper {
  float b1, omb1, b2, omb2;  // omb = 1 - b
  float bc1, bc2;            // bias corrections 1 - b^t
  float eps, eps_root, wd, lr;
  float keep, norm, clip;  // keep: 1 where the global norm needs no clip
};

// The per-call constants of the fast form.
struct AdamwReciprocals {
  float rbc1, rbc2, clip_scale;  // 1/bc1, 1/bc2, clip/norm
};

JGSESS_HOST_DEVICE AdamwReciprocals Reciprocals(const AdamwHyper& h) {
  return {1.0f / h.bc1, 1.0f / h.bc2, h.clip / h.norm};
}

template <int64_t kFlags, typename Q = InF32>
JGSESS_HOST_DEVICE void AdamwElement(const AdamwHyper& h, const AdamwReciprocals& r, float p,
                                     float g, float m, float v, float* p_out, float* m_out,
                                     float* v_out, Q q = {}) {
  constexpr bool kDivide = (kFlags & kExact) != 0;
  if constexpr ((kFlags & kClip) != 0) {  // never with kNarrowMath: f32 operations
    const float clipped = kDivide ? (g / h.norm) * h.clip : g * r.clip_scale;
    g = h.keep != 0.0f ? g : clipped;
  }
  float m2 = q(q(h.omb1 * g) + q(h.b1 * m));
  float v2 = q(q(h.omb2 * q(g * g)) + q(h.b2 * v));
  float mhat = m2, vhat = v2;
  if constexpr ((kFlags & kBiasCorrection) != 0) {
    mhat = q(kDivide ? m2 / h.bc1 : m2 * r.rbc1);
    vhat = q(kDivide ? v2 / h.bc2 : v2 * r.rbc2);
  }
  if constexpr ((kFlags & kEpsRoot) != 0) vhat = q(vhat + h.eps_root);
  float u = q(mhat / q(q(sqrtf(vhat)) + h.eps));
  if constexpr ((kFlags & kWeightDecay) != 0) u = q(u + q(h.wd * p));
  *p_out = StepResult<(kFlags & kUpdate) != 0>(p, h.lr, u, q);
  *m_out = m2;
  *v_out = v2;
}

// flags in [0, 128), the narrow forms without kClip and kExact
constexpr int64_t kAdamwForms = 128;
constexpr bool AdamwForm(int64_t flags) {
  return (flags & kNarrowMath) == 0 || (flags & (kClip | kExact)) == 0;
}

}  // namespace jgsess

JGSESS_DECLARE_HANDLERS(Adamw);
