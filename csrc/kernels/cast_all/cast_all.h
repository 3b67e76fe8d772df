// Multi-tensor cast between f32, bf16 and f16 [CastAllFusion]: x_i -> y_i for every tensor of
// the call, rounding to nearest even as XLA's convert does.
#pragma once

#include "common/ffi.h"

JGSESS_DECLARE_HANDLERS(CastAll);
