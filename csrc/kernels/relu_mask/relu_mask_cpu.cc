// ReLU with a bit mask on the CPU: all cores, the CPU's widest vectors (common/simd.h).
#include <algorithm>
#include <vector>

#include "common/ffi.h"
#include "common/multi_tensor_cpu.h"
#include "common/parallel.h"
#include "common/relu_bits.h"
#include "common/simd.h"
#include "kernels/relu_mask/relu_mask.h"

namespace jgsess {
namespace {

// s[0, n) = operand(s) [begin, begin + n), in f32
void Load(const ReluOperands& ops, int64_t begin, int64_t n, float* s, float* scratch) {
  for (int k = 0; k < ops.count; ++k)
    LoadF32(ops.type, ops.data[k], begin, n, k == 0 ? s : scratch);
  if (ops.count == 2) SimdFor(n, [&](int64_t i) { s[i] = s[i] + scratch[i]; });
}

ffi::Error ReluMaskCpuImpl(ffi::ThreadPool pool, Args args, ffi::Result<Buffer> y,
                           ffi::Result<ffi::Buffer<ffi::U32>> mask) {
  auto ops = ParseRelu("relu_mask", args, 0, *y, static_cast<int64_t>(mask->element_count()));
  if (ops.has_error()) return ops.error();
  const int64_t n = ops->size;
  uint32_t* words = mask->typed_data();
  ParallelFor(pool, (n + kChunk - 1) / kChunk, [&](int64_t c) {
    thread_local std::vector<float> s(kChunk), scratch(kChunk);
    const int64_t begin = c * kChunk, len = std::min(kChunk, n - begin);
    Load(*ops, begin, len, s.data(), scratch.data());
    std::fill_n(words + begin / 32, MaskWords(len), 0u);  // chunks start at whole words
    float* v = s.data();
    PackPositive(v, begin, len, words);
    SimdFor(len, [&](int64_t i) { v[i] = ReluValue(v[i]); });
    StoreF32(ops->type, v, y->untyped_data(), begin, len);
  });
  return ffi::Error::Success();
}

ffi::Error ReluMaskGradCpuImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::U32> mask, Args args,
                               ffi::Result<Buffer> dx) {
  auto ops = ParseRelu("relu_mask_grad", args, 0, *dx, static_cast<int64_t>(mask.element_count()));
  if (ops.has_error()) return ops.error();
  const int64_t n = ops->size;
  const uint32_t* words = mask.typed_data();
  ParallelFor(pool, (n + kChunk - 1) / kChunk, [&](int64_t c) {
    thread_local std::vector<float> g(kChunk), scratch(kChunk);
    const int64_t begin = c * kChunk, len = std::min(kChunk, n - begin);
    Load(*ops, begin, len, g.data(), scratch.data());
    GateByMask(words, begin, len, g.data(), g.data());
    StoreF32(ops->type, g.data(), dx->untyped_data(), begin, len);
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jgsess

XLA_FFI_DEFINE_HANDLER_SYMBOL(ReluMaskCpu, jgsess::ReluMaskCpuImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .RemainingArgs()                           // x, or a and b
                                  .Ret<jgsess::Buffer>()                     // y
                                  .Ret<xla::ffi::Buffer<xla::ffi::U32>>());  // mask

XLA_FFI_DEFINE_HANDLER_SYMBOL(ReluMaskGradCpu, jgsess::ReluMaskGradCpuImpl,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::ThreadPool>()
                                  .Arg<xla::ffi::Buffer<xla::ffi::U32>>()  // mask
                                  .RemainingArgs()                         // dy, or dy1 and dy2
                                  .Ret<jgsess::Buffer>());                 // dx
