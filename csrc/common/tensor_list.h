// The operands of a multi-tensor call, parsed once for the CPU and CUDA handlers.
//
// A call's remaining operands are kIn buffers per tensor and its remaining results kOut buffers
// per tensor, tensor after tensor. Every buffer of a tensor has the same number of elements;
// each may be f32, bf16 or f16 (kernels compute in f32: narrower operands are widened exactly,
// narrower results rounded to nearest even, as XLA's convert does), unless the kernel asks for
// f32 in that slot.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/ffi.h"

namespace jgsess {

inline bool IsKernelFloat(DataType t) {
  return t == DataType::F32 || t == DataType::BF16 || t == DataType::F16;
}

template <int kIn, int kOut>
struct TensorSlots {
  const void* in[kIn];
  DataType in_type[kIn];
  void* out[kOut];
  DataType out_type[kOut];
  int64_t size;
};

// Parses args[first..] and all of rets. `f32_in` / `f32_out` are bit masks of slots that must
// hold f32 (optimizer state, for instance).
template <int kIn, int kOut>
ffi::ErrorOr<std::vector<TensorSlots<kIn, kOut>>> ParseTensors(const char* kernel, Args& args,
                                                                 Rets& rets, unsigned f32_in = 0,
                                                                 unsigned f32_out = 0) {
  const std::string name(kernel);
  if (args.size() % kIn != 0 || rets.size() * kIn != args.size() * kOut) {
    return ffi::Unexpected(InvalidArgument(name + ": operands and results do not pair up"));
  }
  std::vector<TensorSlots<kIn, kOut>> tensors(args.size() / kIn);
  for (size_t t = 0; t < tensors.size(); ++t) {
    auto& slots = tensors[t];
    for (int k = 0; k < kIn; ++k) {
      auto arg = args.get<Buffer>(kIn * t + k);
      if (arg.has_error()) return ffi::Unexpected(arg.error());
      const auto count = static_cast<int64_t>(arg->element_count());
      const DataType type = arg->element_type();
      if (k == 0) slots.size = count;
      if (count != slots.size) {
        return ffi::Unexpected(InvalidArgument(name + ": operands of a tensor differ in size"));
      }
      if (!IsKernelFloat(type) || ((f32_in >> k) & 1 && type != DataType::F32)) {
        return ffi::Unexpected(InvalidArgument(name + ": unsupported operand dtype"));
      }
      slots.in[k] = arg->untyped_data();
      slots.in_type[k] = type;
    }
    for (int k = 0; k < kOut; ++k) {
      auto ret = rets.get<Buffer>(kOut * t + k);
      if (ret.has_error()) return ffi::Unexpected(ret.error());
      const DataType type = (*ret)->element_type();
      if (static_cast<int64_t>((*ret)->element_count()) != slots.size) {
        return ffi::Unexpected(InvalidArgument(name + ": a result differs in size"));
      }
      if (!IsKernelFloat(type) || ((f32_out >> k) & 1 && type != DataType::F32)) {
        return ffi::Unexpected(InvalidArgument(name + ": unsupported result dtype"));
      }
      slots.out[k] = (*ret)->untyped_data();
      slots.out_type[k] = type;
    }
  }
  return tensors;
}

}  // namespace jgsess
