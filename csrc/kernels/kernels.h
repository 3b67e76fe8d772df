// The one list of jgsess's kernels. JGSESS_KERNELS(X) calls X(target, Handler) for each FFI
// target `jgsess_<target>` whose handlers are <Handler>Cpu, <Handler>Cuda and <Handler>CudaLoad
// (JGSESS_DECLARE_HANDLERS in its header, included here): registrations.cc registers them,
// the SIMT emulator (csrc/testing/emulator/module.cc) wraps the CUDA ones. JGSESS_FLAG_FAMILIES(X)
// calls X(kernel, names) for each kernel with a `flags` attribute (bindings.cc: kernel_flags).
// A new kernel is its folder, a line here, its Python spec and its tests.
#pragma once

#include "kernels/adamw/adamw.h"
#include "kernels/batch_norm/batch_norm.h"
#include "kernels/cast_all/cast_all.h"
#include "kernels/global_norm/global_norm.h"
#include "kernels/momentum/momentum.h"
#include "kernels/relu_mask/relu_mask.h"

#define JGSESS_KERNELS(X)                           \
  X(adamw, Adamw)                                   \
  X(batch_norm_relu, BatchNormRelu)                 \
  X(batch_norm_add_relu, BatchNormAddRelu)          \
  X(batch_norm_relu_grad, BatchNormReluGrad)        \
  X(batch_norm_add_relu_grad, BatchNormAddReluGrad) \
  X(cast_all, CastAll)                              \
  X(global_norm, GlobalNorm)                        \
  X(momentum, Momentum)                             \
  X(relu_mask, ReluMask)                            \
  X(relu_mask_grad, ReluMaskGrad)

#define JGSESS_FLAG_FAMILIES(X) \
  X(adamw, kAdamwFlagNames)     \
  X(momentum, kMomentumFlagNames)
