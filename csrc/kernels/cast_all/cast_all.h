// Multi-tensor cast between f32, bf16 and f16 [CastAllFusion]: x_i -> y_i for every tensor of
// the call, rounding to nearest even as XLA's convert does.
#pragma once

#include "common/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(CastAllCpu);
#if defined(JGSESS_WITH_CUDA)
XLA_FFI_DECLARE_HANDLER_SYMBOL(CastAllCuda);
#endif
