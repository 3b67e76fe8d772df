// The FFI side of the SIMT emulator: an emulated CUDA handler run on guarded buffers.
#pragma once

#include <algorithm>
#include <cstddef>

#include "xla/ffi/api/c_api.h"

namespace jgsess::simt {

// Calls `handler` on guarded copies of the frame's buffers (guard.cc); its error, or one naming
// the first buffer a check found wrong.
XLA_FFI_Error* RunGuarded(XLA_FFI_Handler* handler, const char* name, XLA_FFI_CallFrame* frame);

// A handler's name, as a template argument.
template <size_t N>
struct Name {
  char text[N];
  constexpr Name(const char (&name)[N]) { std::copy_n(name, N, text); }
};

// An FFI handler that runs `Handler` guarded; its errors name it `kName`.
template <XLA_FFI_Handler* Handler, Name kName>
XLA_FFI_Error* Guarded(XLA_FFI_CallFrame* frame) {
  return RunGuarded(Handler, kName.text, frame);
}

}  // namespace jgsess::simt
