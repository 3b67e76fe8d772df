// ReLU with a bit mask for the backward pass [ReluV2, AddReluV2, AddReluGradV2].
//
// Forward:  s = x (or a + b);  y = max(s, 0);  bit i of mask word i/32 = (s_i > 0)
// Backward: dx = bit ? dy : 0 (or bit ? dy1 + dy2 : 0, for a gradient that is a sum)
//
// max propagates NaN and gives +0 for -0, as XLA's does; a NaN's bit is 0, as `s > 0` is false.
// The backward keeps 1 bit per element alive instead of a full mask or activation.
#pragma once

#include <cstdint>

#include "common/ffi.h"
#include "common/host_device.h"
#include "common/tensor_list.h"

namespace jgsess {

JGSESS_HOST_DEVICE float ReluValue(float s) { return (s > 0.0f || s != s) ? s : 0.0f; }

inline int64_t MaskWords(int64_t n) { return (n + 31) / 32; }

struct ReluOperands {
  const void* data[2];  // x, or a and b (their sum); data[1] null for one operand
  DataType type;
  int count;
  int64_t size;
};

// The operand checker the CPU and CUDA handlers of both kernels share: args[first..] are one
// or two operands of one float dtype and size; `result` (y or dx) has that dtype and size; the
// mask has MaskWords(size) words.
inline ffi::ErrorOr<ReluOperands> ParseRelu(const char* kernel, Args& args, size_t first,
                                            const Buffer& result, int64_t mask_words) {
  if (args.size() != first + 1 && args.size() != first + 2) {
    return Invalid(kernel, "one operand, or two to add");
  }
  ReluOperands ops{{nullptr, nullptr}, DataType::F32, static_cast<int>(args.size() - first), -1};
  for (int k = 0; k < ops.count; ++k) {
    auto x = args.get<Buffer>(first + k);
    if (x.has_error()) return ffi::Unexpected(x.error());
    if (k > 0 && x->element_type() != ops.type) {
      return Invalid(kernel, "operand " + std::to_string(first + k) + " is " + Describe(*x) +
                                 "; expected " + TypeName(ops.type) + ", as the first");
    }
    auto ok =
        CheckFloat(kernel, *x, ops.size, [&] { return "operand " + std::to_string(first + k); });
    if (ok.failure()) return ffi::Unexpected(ok);
    ops.data[k] = x->untyped_data();
    ops.type = x->element_type();
    ops.size = static_cast<int64_t>(x->element_count());
  }
  if (result.element_type() != ops.type ||
      static_cast<int64_t>(result.element_count()) != ops.size) {
    return Invalid(kernel, "the result is " + Describe(result) + "; expected " +
                               TypeName(ops.type) + "[" + std::to_string(ops.size) +
                               "], as the operands");
  }
  if (mask_words != MaskWords(ops.size))
    return Invalid(kernel, "the mask does not fit the operands");
  return ops;
}

}  // namespace jgsess

JGSESS_DECLARE_HANDLERS(ReluMask);
JGSESS_DECLARE_HANDLERS(ReluMaskGrad);
