// Handlers whose kernels break one of the SIMT emulator's checks each (and one that breaks none),
// for the emulator's own tests: f32 x -> f32 y of the same size.
#pragma once

#include "xla/ffi/api/api.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(BrokenNone);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BrokenReadPastEnd);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BrokenWriteBeforeStart);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BrokenSharedRace);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BrokenBarrier);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BrokenShuffle);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BrokenShuffleOutsideMask);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BrokenMisaligned);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BrokenBallot);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BrokenUnwritten);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BrokenOperandWritten);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BrokenUnloaded);
XLA_FFI_DECLARE_HANDLER_SYMBOL(BrokenLoad);  // the instantiate stage of them all: loads Neighbors
// an instantiate stage that loads Neighbors into the current device's context alone
XLA_FFI_DECLARE_HANDLER_SYMBOL(BrokenLoadCurrentDevice);
