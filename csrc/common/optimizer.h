// What the optimizer kernels' element math shares (adamw, momentum).
#pragma once

#include "common/host_device.h"

namespace jgsess {

// An optimizer kernel's first result, from the parameter p and its step direction d: the new
// parameter p - lr*d, or with kUpdate optax's update alone, -(lr*d). These are the references'
// operations (jgsess/passes/fusions/optimizer.py: every update as the whole step or the update).
template <bool kUpdate>
JGSESS_HOST_DEVICE float StepResult(float p, float lr, float d) {
  if constexpr (kUpdate) {
    return -(lr * d);
  } else {
    return p - lr * d;
  }
}

}  // namespace jgsess
