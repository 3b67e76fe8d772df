// The CPU multi-tensor drivers: a call's tensors cut into chunks across all cores
// (common/parallel.h), narrow operands staged through f32 scratch (RunMultiTensor) or converted
// in registers (the optimizers' RunOptimizer, RunNarrowOptimizer). The CUDA counterpart is
// common/multi_tensor_cuda.cuh.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/convert.h"
#include "common/ffi.h"
#include "common/optimizer.h"
#include "common/parallel.h"
#include "common/tensor_list.h"
#include "common/vec.h"

namespace jgsess {

// Elements staged at a time for narrow operands: kIn + kOut blocks of f32 scratch stay in L1/L2
// (a whole chunk of scratch would stream through L3 and cost a second trip to memory).
constexpr int64_t kCpuStage = 2048;

// Calls piece(slots, begin, end) for every piece of every tensor of a multi-tensor call, on all
// cores (chunks of the group, split at tensor boundaries).
template <int kIn, int kOut, typename Piece>
void ForEachPiece(ffi::ThreadPool& pool, const std::vector<TensorSlots<kIn, kOut>>& tensors,
                  Piece piece) {
  std::vector<int64_t> sizes;
  sizes.reserve(tensors.size());
  for (const auto& t : tensors) sizes.push_back(t.size);
  const TensorGroup group(sizes);
  ParallelFor(pool, group.num_chunks(), [&](int64_t c) {
    group.ForChunk(c, [&](size_t t, int64_t begin, int64_t end) { piece(tensors[t], begin, end); });
  });
}

// Runs body(in, out, n) over elements [begin, end) of one tensor of a multi-tensor call.
// `in[k]` and `out[k]` are f32 pointers to n elements: the buffers themselves where they are
// f32, else scratch on this thread's stack that is filled from / written back to the narrow
// buffer, kCpuStage elements at a time. A result may be its operand's buffer (in place):
// element i only ever touches index i.
template <int kIn, int kOut, typename Body>
void StagePiece(const TensorSlots<kIn, kOut>& slots, int64_t begin, int64_t end, Body& body) {
  bool narrow = false;
  for (int k = 0; k < kIn; ++k) narrow |= slots.in_type[k] != DataType::F32;
  for (int k = 0; k < kOut; ++k) narrow |= slots.out_type[k] != DataType::F32;
  const float* in[kIn];
  float* out[kOut];
  if (!narrow) {
    for (int k = 0; k < kIn; ++k) in[k] = static_cast<const float*>(slots.in[k]) + begin;
    for (int k = 0; k < kOut; ++k) out[k] = static_cast<float*>(slots.out[k]) + begin;
    body(in, out, end - begin);
    return;
  }
  alignas(64) float scratch[kIn + kOut][kCpuStage];
  for (int64_t lo = begin; lo < end; lo += kCpuStage) {
    const int64_t n = std::min(kCpuStage, end - lo);
    for (int k = 0; k < kIn; ++k) {
      if (slots.in_type[k] == DataType::F32) {
        in[k] = static_cast<const float*>(slots.in[k]) + lo;
      } else {
        LoadF32(slots.in_type[k], slots.in[k], lo, n, scratch[k]);
        in[k] = scratch[k];
      }
    }
    for (int k = 0; k < kOut; ++k) {
      out[k] = slots.out_type[k] == DataType::F32 ? static_cast<float*>(slots.out[k]) + lo
                                                  : scratch[kIn + k];
    }
    body(in, out, n);
    for (int k = 0; k < kOut; ++k) {
      if (slots.out_type[k] != DataType::F32) {
        StoreF32(slots.out_type[k], out[k], slots.out[k], lo, n);
      }
    }
  }
}

// Runs body(in, out, n) (see StagePiece) over every tensor of a multi-tensor call, on all cores.
template <int kIn, int kOut, typename Body>
void RunMultiTensor(ffi::ThreadPool& pool, const std::vector<TensorSlots<kIn, kOut>>& tensors,
                    Body body) {
  ForEachPiece(pool, tensors, [&](const TensorSlots<kIn, kOut>& slots, int64_t begin, int64_t end) {
    StagePiece(slots, begin, end, body);
  });
}

// The optimizers' layout, (p, g, first, rest...) -> (p', first', rest'...): runs
// body(p, g, first, rest, p_out, first_out, rest_out, n) on all cores, where p, g and p_out point
// to T (float, Bf16Bits or _Float16), first and first_out (the first state slot: m, acc) to S,
// and rest[k], rest_out[k] (any further state: v) to R. In registers, the buffers read and
// written in place: bf16 p, g and p' with f32 state (and a bf16 v: optax's adamw with
// mu_dtype=f32 on bf16 parameters), a bf16 first state of f32 parameters (optax's mu_dtype,
// accumulator_dtype), and every buffer bf16 or every buffer f16 (jgsess.optim.f32_math's f32
// update of narrow state); staging them through scratch, as RunMultiTensor does, made the bf16
// momentum step slower than XLA's and f32_math's 0.4-0.8x torch's (benchmarks/optimizer_step.py).
// Other narrow types (p and g of different types, f16 with f32 state) are staged.
template <int kIn, int kOut, typename Body>
void RunOptimizer(ffi::ThreadPool& pool, const std::vector<TensorSlots<kIn, kOut>>& tensors,
                  Body body) {
  static_assert(kIn >= 3 && kOut == kIn - 1, "p, g and at least one state slot");
  constexpr int kRest = kIn > 3 ? kIn - 3 : 1;
  // whether p, g, p' hold `param`, the first state slot and its result `first`, the rest `rest`
  auto typed = [](const TensorSlots<kIn, kOut>& s, DataType param, DataType first,
                  DataType rest = DataType::F32) {
    bool ok = s.in_type[0] == param && s.in_type[1] == param && s.out_type[0] == param &&
              s.in_type[2] == first && s.out_type[1] == first;
    for (int k = 3; k < kIn; ++k) ok &= s.in_type[k] == rest;
    for (int k = 2; k < kOut; ++k) ok &= s.out_type[k] == rest;
    return ok;
  };
  auto direct = [&]<typename T, typename S, typename R = float>(const TensorSlots<kIn, kOut>& slots,
                                                                int64_t begin, int64_t end) {
    const R* rest[kRest];
    R* rest_out[kRest];
    for (int k = 3; k < kIn; ++k) rest[k - 3] = static_cast<const R*>(slots.in[k]) + begin;
    for (int k = 2; k < kOut; ++k) rest_out[k - 2] = static_cast<R*>(slots.out[k]) + begin;
    body(static_cast<const T*>(slots.in[0]) + begin, static_cast<const T*>(slots.in[1]) + begin,
         static_cast<const S*>(slots.in[2]) + begin, rest, static_cast<T*>(slots.out[0]) + begin,
         static_cast<S*>(slots.out[1]) + begin, rest_out, end - begin);
  };
  auto staged = [&](const float* const* in, float* const* out, int64_t n) {
    body(in[0], in[1], in[2], in + 3, out[0], out[1], out + 2, n);
  };
  ForEachPiece(pool, tensors, [&](const TensorSlots<kIn, kOut>& slots, int64_t begin, int64_t end) {
    if (typed(slots, DataType::BF16, DataType::F32)) {
      direct.template operator()<Bf16Bits, float>(slots, begin, end);
    } else if (kIn > 3 && typed(slots, DataType::BF16, DataType::F32, DataType::BF16)) {
      if constexpr (kIn > 3) {  // a v: compiled for AdamW only
        direct.template operator()<Bf16Bits, float, Bf16Bits>(slots, begin, end);
      }
    } else if (typed(slots, DataType::F32, DataType::BF16)) {
      direct.template operator()<float, Bf16Bits>(slots, begin, end);
    } else if (typed(slots, DataType::BF16, DataType::BF16, DataType::BF16)) {
      direct.template operator()<Bf16Bits, Bf16Bits, Bf16Bits>(slots, begin, end);
    } else if (typed(slots, DataType::F16, DataType::F16, DataType::F16)) {
      direct.template operator()<_Float16, _Float16, _Float16>(slots, begin, end);
    } else {
      StagePiece(slots, begin, end, staged);  // all f32: the buffers themselves, unstaged
    }
  });
}

// The optimizers' layout for an update written in bf16 or f16 (a kernel's narrow-math flag):
// every buffer of a tensor has one type N, Bf16Bits or _Float16 (tensor_list.h: CheckNarrow).
// Runs body(q, in, out, n) on all cores, in[k] / out[k] pointing to N and q rounding an f32 to N
// (InBf16 / InF16), reading and writing the buffers in place (the body's results are values of N
// already: NarrowExact writes them).
template <int kIn, int kOut, typename Body>
void RunNarrowOptimizer(ffi::ThreadPool& pool, const std::vector<TensorSlots<kIn, kOut>>& tensors,
                        Body body) {
  auto typed = [&]<typename N, typename Q>(const TensorSlots<kIn, kOut>& slots, int64_t begin,
                                           int64_t end) {
    const N* in[kIn];
    N* out[kOut];
    for (int k = 0; k < kIn; ++k) in[k] = static_cast<const N*>(slots.in[k]) + begin;
    for (int k = 0; k < kOut; ++k) out[k] = static_cast<N*>(slots.out[k]) + begin;
    body(Q{}, in, out, end - begin);
  };
  ForEachPiece(pool, tensors, [&](const TensorSlots<kIn, kOut>& slots, int64_t begin, int64_t end) {
    if (slots.in_type[0] == DataType::BF16) {
      typed.template operator()<Bf16Bits, InBf16>(slots, begin, end);
    } else {
      typed.template operator()<_Float16, InF16>(slots, begin, end);
    }
  });
}

}  // namespace jgsess
