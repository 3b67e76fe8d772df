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

namespace jgsess {

JGSESS_HOST_DEVICE float ReluValue(float s) { return (s > 0.0f || s != s) ? s : 0.0f; }

inline int64_t MaskWords(int64_t n) { return (n + 31) / 32; }

}  // namespace jgsess

XLA_FFI_DECLARE_HANDLER_SYMBOL(ReluMaskCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ReluMaskGradCpu);
#if defined(JGSESS_WITH_CUDA)
XLA_FFI_DECLARE_HANDLER_SYMBOL(ReluMaskCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(ReluMaskGradCuda);
#endif
