// The global norm of many tensors, sqrt(sum over tensors of sum(x*x)), as optax's
// clip_by_global_norm computes it [Apex's multi_tensor_l2norm].
//
// Each tensor is cut into chunks of kNormChunk elements; a chunk's sum of squares is one f32
// partial in the workspace (in the program's workspace arena). A tensor's sum adds its partials
// in chunk order, and the total adds the tensors' sums in order, left to right, as optax's
// Python sum does: the result does not depend on how many threads or blocks ran.
#pragma once

#include <cstdint>

#include "common/ffi.h"

namespace jgsess {

constexpr int64_t kNormChunk = 65536;  // jgsess/kernels/global_norm.py: CHUNK

inline int64_t NormItems(int64_t size) { return (size + kNormChunk - 1) / kNormChunk; }

}  // namespace jgsess

XLA_FFI_DECLARE_HANDLER_SYMBOL(GlobalNormCpu);
#if defined(JGSESS_WITH_CUDA)
XLA_FFI_DECLARE_HANDLER_SYMBOL(GlobalNormCuda);
#endif
