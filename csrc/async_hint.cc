#include "async_hint.h"

namespace jgsess {
namespace {

ffi::Error AsyncHintCpuImpl(Buffer) { return ffi::Error::Success(); }

}  // namespace
}  // namespace jgsess

XLA_FFI_DEFINE_HANDLER_SYMBOL(AsyncHintCpu, jgsess::AsyncHintCpuImpl,
                              xla::ffi::Ffi::Bind().Arg<jgsess::Buffer>());  // the counted work
