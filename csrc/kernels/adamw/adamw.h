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
//
// kMixed is optax's update of bf16 parameters with an f32 first moment (mu_dtype=f32) and the
// second moment in bf16: p, g, v and p' bf16, m f32. The second moment, its correction and sqrt
// are computed in bf16, each operation rounded to it (optax casts the bias correction to the
// moment's dtype); the rest in f32, as XLA's CPU code computes it: a narrow result read only
// widened is not rounded (omb1*g and wd*p, rewritten so by passes/widen.py, and sqrt(v^) + eps),
// and the first moment and the step are fused multiply-adds (of b1*m, of lr*u). No clip, never
// exact.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "common/dispatch.h"
#include "common/ffi.h"
#include "common/flags.h"
#include "common/host_device.h"
#include "common/optimizer.h"
#include "common/tensor_list.h"

namespace jgsess {

enum class AdamwFlag : int64_t {
  kBiasCorrection = 1,
  kEpsRoot = 2,
  kWeightDecay = 4,
  kUpdate = 8,  // result 0 is optax's update -(lr*u), not the new parameter
  kClip = 16,
  kExact = 32,       // IEEE division where the formula divides (JGSESS_NUMERICS=exact)
  kNarrowMath = 64,  // every operation rounded to the tensor's bf16/f16
  kMixed = 128,      // bf16 p, g, v with an f32 m: v's operations rounded (see above)
};

inline constexpr FlagName kAdamwFlagNames[] = {
    {"BIAS_CORRECTION", Bits(AdamwFlag::kBiasCorrection)},
    {"EPS_ROOT", Bits(AdamwFlag::kEpsRoot)},
    {"WEIGHT_DECAY", Bits(AdamwFlag::kWeightDecay)},
    {"UPDATE", Bits(AdamwFlag::kUpdate)},
    {"CLIP", Bits(AdamwFlag::kClip)},
    {"EXACT", Bits(AdamwFlag::kExact)},
    {"NARROW", Bits(AdamwFlag::kNarrowMath)},
    {"MIXED", Bits(AdamwFlag::kMixed)},
};

// The hyper-parameters, rank-0 f32 operands in this order before the tensors
// (jgsess/kernels/adamw.py: SCALARS); F: their lanes (a float, or a CPU vector: common/vec.h).
template <typename F>
struct AdamwHyperT {
  F b1, omb1, b2, omb2;  // omb = 1 - b
  F bc1, bc2;            // bias corrections 1 - b^t
  F eps, eps_root, wd, lr;
  F keep, norm, clip;  // keep: 1 where the global norm needs no clip
};
using AdamwHyper = AdamwHyperT<float>;

// The per-call constants of the fast form.
template <typename F>
struct AdamwReciprocalsT {
  F rbc1, rbc2, clip_scale;  // 1/bc1, 1/bc2, clip/norm
};
using AdamwReciprocals = AdamwReciprocalsT<float>;

JGSESS_HOST_DEVICE AdamwReciprocals Reciprocals(const AdamwHyper& h) {
  return {1.0f / h.bc1, 1.0f / h.bc2, h.clip / h.norm};
}

// q rounds to the narrow type under kNarrowMath and kMixed (InF32 otherwise); under kMixed the
// first moment, its correction, the division, the weight decay and the step are f32 (`wide`).
// F: the lanes (a float, or a CPU vector of them, which gives the same bits lane by lane).
// kB2IsOne: b2 is 1.0 (optax's 0.999 in bf16), and the product b2*v, v itself, is skipped: the
// bits do not change (a signaling NaN v, which the product would quiet, is quieted by the sum
// it goes to).
template <int64_t kFlags, bool kB2IsOne = false, typename F, typename Q = InF32>
JGSESS_HOST_DEVICE void AdamwElement(const AdamwHyperT<F>& h, const AdamwReciprocalsT<F>& r, F p,
                                     F g, F m, F v, F* p_out, F* m_out, F* v_out, Q q = {}) {
  constexpr bool kDivide = Has(kFlags, AdamwFlag::kExact);
  using Wide = std::conditional_t<Has(kFlags, AdamwFlag::kMixed), InF32, Q>;
  const Wide wide{};
  if constexpr (Has(kFlags, AdamwFlag::kClip)) {  // never with kNarrowMath: f32 operations
    const F clipped = kDivide ? (g / h.norm) * h.clip : g * r.clip_scale;
    g = Select(h.keep, g, clipped);
  }
  F m2;
  if constexpr (Has(kFlags, AdamwFlag::kMixed)) {
    m2 = Fma(h.b1, m, h.omb1 * g);  // as XLA's CPU code computes it (omb1*g is exact)
  } else {
    m2 = wide(wide(h.omb1 * g) + wide(h.b1 * m));
  }
  F v2 = q(q(h.omb2 * q(g * g)) + (kB2IsOne ? v : q(h.b2 * v)));
  F mhat = m2, vhat = v2;
  if constexpr (Has(kFlags, AdamwFlag::kBiasCorrection)) {
    mhat = wide(kDivide ? m2 / h.bc1 : m2 * r.rbc1);
    vhat = q(kDivide ? v2 / h.bc2 : v2 * r.rbc2);
  }
  if constexpr (Has(kFlags, AdamwFlag::kEpsRoot)) vhat = q(vhat + h.eps_root);
  F u = wide(mhat / wide(q(Sqrt(vhat)) + h.eps));
  if constexpr (Has(kFlags, AdamwFlag::kWeightDecay)) u = wide(u + wide(h.wd * p));
  if constexpr (Has(kFlags, AdamwFlag::kMixed) && !Has(kFlags, AdamwFlag::kUpdate)) {
    *p_out = Fma(-h.lr, u, p);  // as XLA's CPU code computes it
  } else {
    *p_out = StepResult<Has(kFlags, AdamwFlag::kUpdate)>(p, h.lr, u, wide);
  }
  *m_out = m2;
  *v_out = v2;
}

// A call under kMixed: per tensor, p, g, v and v' bf16, m and m' f32, and p' bf16 (f32:
// optax's update, under kUpdate). (An f16 update is another formula: XLA rounds f16 results
// that bf16 ones skip.)
inline ffi::Error CheckMixed(const std::vector<TensorSlots<4, 3>>& tensors, bool update) {
  const DataType bf16 = DataType::BF16, f32 = DataType::F32;
  for (const auto& t : tensors) {
    const bool ok = t.in_type[0] == bf16 && t.in_type[1] == bf16 && t.in_type[3] == bf16 &&
                    t.out_type[2] == bf16 && t.out_type[0] == (update ? f32 : bf16) &&
                    t.in_type[2] == f32 && t.out_type[1] == f32;
    if (!ok) {
      return InvalidArgument(
          "adamw: mixed math needs p, g and v in bf16 and the first moment in f32");
    }
  }
  return ffi::Error::Success();
}

// The family, for the handlers' shared front (common/tensor_list.h: DispatchOptimizer).
struct AdamwFamily {
  static constexpr const char* kName = "adamw";
  using Hyper = AdamwHyper;
  static constexpr int kIn = 4, kOut = 3;  // p, g, m, v -> p', m', v'
  // flags in [0, 256); the narrow and mixed forms without kClip and kExact (and not both)
  static constexpr int64_t kForms = 256;
  static constexpr bool Valid(int64_t flags) {
    const int64_t rounded = flags & Bits(AdamwFlag::kNarrowMath, AdamwFlag::kMixed);
    return rounded == 0 || (rounded != Bits(AdamwFlag::kNarrowMath, AdamwFlag::kMixed) &&
                            (flags & Bits(AdamwFlag::kClip, AdamwFlag::kExact)) == 0);
  }
  template <int64_t kFlags>
  static ffi::Error Check(const std::vector<TensorSlots<kIn, kOut>>& tensors) {
    if constexpr (Has(kFlags, AdamwFlag::kNarrowMath)) return CheckNarrow(kName, tensors);
    if constexpr (Has(kFlags, AdamwFlag::kMixed)) {
      return CheckMixed(tensors, Has(kFlags, AdamwFlag::kUpdate));
    }
    return ffi::Error::Success();
  }
};

}  // namespace jgsess

JGSESS_DECLARE_HANDLERS(Adamw);
