// jgsess_async_hint: a CPU custom call that does nothing, and that XLA keeps (it is declared
// with a side effect).
//
// XLA's CPU runtime runs a program on the calling thread, synchronously, when its cost analysis
// estimates it under 1,000 flops, and it counts a custom call as -1 flop. A program whose work
// is all in jgsess's kernels therefore ran synchronously where jax.jit's plain program would
// have been dispatched asynchronously: the call returned only when the step was done, so the
// caller could not queue the next step, or do its own work, meanwhile. A kernel call that
// writes at least as many elements carries this hint on an operand of as many elements, which
// the cost analysis counts as that work (kernels/spec.py).
#pragma once

#include "common/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(AsyncHintCpu);
